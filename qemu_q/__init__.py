"""qemu_q: bit-exact emulation of the ONNX quantization datapaths.

QuantizeLinear and DequantizeLinear at every version (10 to 28) and DynamicQuantizeLinear-11,
for every ONNX quantized type, computed by Cython kernels; the bits are the product.
"""

from . import _build_config
from ._dtypes import ELEMENT_TYPES, ElementType, element_type
from .datapath import Datapath
from .codecs import integer_type, minifloat_type
from ._opspec import NEWEST_OPSET, OP_VERSIONS, FormalParameter, OpSpec, get_spec
from ._pack import pack, unpack
from .ops import cast, cast_like, dequantize_linear, dynamic_quantize_linear, quantize_linear
from .ops import conv_integer, matmul_integer, qlinear_conv, qlinear_matmul
from .ops import MX_ELEMENTS, MX_SCALE_RULES, mx_dequantize, mx_dequantize_graph, mx_quantize, mx_scale_shape
from .ops import nvfp4_dequantize, nvfp4_global_scale, nvfp4_quantize
from .ops import quantize_multiplier, requantize
from ._parallel import openmp_compiled as _openmp_compiled
from ._onnx_plugin import onnx_ops
from ._registry import run_op
from ._threads import MAX_THREADS, get_num_threads, set_num_threads
from .golden.verify import VerifyReport, verify
from .qparams import choose_qparams
from . import profiles

__version__ = "0.1.0"

__all__ = [
    "ELEMENT_TYPES", "ElementType", "FormalParameter", "MAX_THREADS", "NEWEST_OPSET", "OP_VERSIONS", "OpSpec",
    "cast", "cast_like", "choose_qparams", "dequantize_linear", "dynamic_quantize_linear", "element_type",
    "get_num_threads", "get_spec", "onnx_ops", "openmp_enabled", "pack", "quantize_linear",
    "run_op", "set_num_threads", "unpack", "VerifyReport", "verify",
    "__version__",
    "matmul_integer", "conv_integer", "qlinear_matmul", "qlinear_conv",
    "mx_quantize", "mx_dequantize", "mx_dequantize_graph", "mx_scale_shape", "MX_ELEMENTS", "MX_SCALE_RULES",
    "nvfp4_quantize", "nvfp4_dequantize", "nvfp4_global_scale",
    "quantize_multiplier", "requantize",
    "Datapath", "profiles", "integer_type", "minifloat_type",
]


def openmp_enabled() -> bool:
    """True when the kernels were built with OpenMP (and so can use several threads)."""
    return bool(_build_config.OPENMP) and _openmp_compiled()
