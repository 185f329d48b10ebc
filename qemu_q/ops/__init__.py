"""The op families. Each module holds one family's plans (validated once per signature and
cached), its public functions and its run_op adapters (qemu_q._registry.register)."""

from .cast import cast, cast_like
from .dequantize_linear import dequantize_linear
from .dynamic_quantize_linear import dynamic_quantize_linear
from .quantize_linear import quantize_linear
from .matmul_integer import matmul_integer, qlinear_matmul
from .conv_integer import conv_integer, qlinear_conv
from .mx import MX_ELEMENTS, MX_SCALE_RULES, mx_dequantize, mx_dequantize_graph, mx_quantize, mx_scale_shape

from .nvfp4 import nvfp4_dequantize, nvfp4_global_scale, nvfp4_quantize

from .requantize import quantize_multiplier, requantize

__all__ = ["cast", "cast_like", "dequantize_linear", "dynamic_quantize_linear", "quantize_linear",
           "matmul_integer", "qlinear_matmul", "conv_integer", "qlinear_conv",
           "mx_quantize", "mx_dequantize", "mx_dequantize_graph", "mx_scale_shape", "MX_ELEMENTS",
           "MX_SCALE_RULES", "nvfp4_quantize", "nvfp4_dequantize", "nvfp4_global_scale",
           "quantize_multiplier", "requantize"]
