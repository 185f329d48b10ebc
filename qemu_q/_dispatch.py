"""Step 5: from a plan's kernel path to the kernel entry that runs it.

A plan names its path once (decided when it is built); this table is the only place that
maps a path to a function of the kernel modules, for the instruction-set level loaded in
qemu_q._kernels. Kernel entries take the arrays, the plan's kernel configuration and the
thread count.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from ._dtypes import ElementType

from . import _kernels, _packing


class Path(Enum):
    QUANTIZE = "quantize"                    # one code per element (or whole-byte raw_data)
    QUANTIZE_PACKED = "quantize_packed"      # sub-byte codes into raw_data, fused
    DEQUANTIZE = "dequantize"
    DEQUANTIZE_PACKED = "dequantize_packed"  # sub-byte raw_data, unpacked on the fly
    PACK = "pack"
    UNPACK = "unpack"
    CAST = "cast"
    MX_QUANTIZE = "mx_quantize"              # OCP MX: shared scales and codes (one per byte or packed)
    NVFP4_QUANTIZE = "nvfp4_quantize"
    INTEGER_GEMM = "integer_gemm"            # exact int16 GEMM, int32 wrap (integer datapath)
    INTEGER_ACCUMULATE = "integer_accumulate"  # a narrow/saturating accumulator, k in order
    PAIR_SUMS = "pair_sums"                  # the VPMADDUBSW pair-saturating accumulator
    REQUANTIZE = "requantize"                # int32 accumulators -> codes under a named rule
    FLOAT_MATMUL = "float_matmul"            # QLinearMatMul-21 with float8 operands: exact sums, requantized
    FIXED_POINT_REQUANTIZE = "fixed_point_requantize"  # qemu_q.requantize: integer-only schemes


# path -> (kernel family in qemu_q._kernels.KernelSet, or None for the level-independent
# modules; entry name)
KERNEL_ENTRIES = {
    Path.QUANTIZE: ("quantize", "quantize"),
    Path.QUANTIZE_PACKED: ("quantize", "quantize_packed"),
    Path.DEQUANTIZE: ("dequantize", "dequantize"),
    Path.DEQUANTIZE_PACKED: ("dequantize", "dequantize_packed"),
    Path.PACK: (None, "pack"),
    Path.UNPACK: (None, "unpack"),
    Path.CAST: ("cast", "cast"),
    Path.MX_QUANTIZE: ("mx", "mx_quantize"),
    Path.NVFP4_QUANTIZE: ("nvfp4", "quantize"),
    Path.INTEGER_GEMM: ("integer", "gemm_s16"),
    Path.INTEGER_ACCUMULATE: ("integer", "accumulate"),
    Path.PAIR_SUMS: ("integer", "pair_sums_u8s8"),
    Path.REQUANTIZE: ("integer", "requantize"),
    Path.FLOAT_MATMUL: ("integer", "float_matmul_requantize"),
    Path.FIXED_POINT_REQUANTIZE: ("requantize", "requantize"),
}

# False forces the kernels' general scalar paths (the tests compare both); read when a
# call converts its parameters and picks its kernel configuration.
FAST_KERNELS = True


def entry_module(path: Path):
    """The loaded kernel module that holds `path`'s entry (and its config class)."""
    family, _ = KERNEL_ENTRIES[path]
    return _packing if family is None else getattr(_kernels.active, family)


def configured(configs: dict, path: Path, config_class: str, fields: tuple):
    """The kernel configuration of a plan for the loaded level of `path`'s kernel module:
    `config_class(**fields)`, built once per plan and level and kept in `configs`."""
    module = entry_module(path)
    config = configs.get(module)
    if config is None:
        config = configs[module] = getattr(module, config_class)(**dict(fields))
    return config


def entry(path: Path):
    return getattr(entry_module(path), KERNEL_ENTRIES[path][1])


def run(path: Path, *args, **keywords):
    return entry(path)(*args, **keywords)


@dataclass(frozen=True)
class KernelPlan:
    """What an op family's cached plan holds: the label its errors use, the input and
    output types, and the fields of its kernel configuration, decided once; each family
    names its path and configuration class."""
    label: str
    x_type: ElementType
    out_type: ElementType
    kernel_fields: tuple
    configs: dict = field(default_factory=dict, compare=False, repr=False)
    PATH: ClassVar[Path]
    CONFIG_CLASS: ClassVar[str]

    def kernel_config(self):
        """The configuration object of the loaded kernel level, built once per plan and level."""
        return configured(self.configs, self.PATH, self.CONFIG_CLASS, self.kernel_fields)
