"""Every element type the ONNX quantization ops name, and how the kernels store it.

One `ElementType` per ONNX type: its ONNX names, the numpy / ml_dtypes dtype arrays of it
have (as `onnx.numpy_helper.to_array` returns them), the plain numpy dtype the kernels
read and write it as, and what the encoding is (integer range, small-float format id,
sub-byte packing width).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import ml_dtypes
import numpy as np

from ._parallel import ENUMS

if TYPE_CHECKING:
    from ._typing import TypeSpec
    from ._validate import ArraySpec

# The kernels' enumerations (pyx/_codecs.pxd, _layout.pxd), as the compiled code exports them.
FMT_FLOAT32, FMT_FLOAT16, FMT_BFLOAT16, FMT_INT32 = (
    ENUMS["FMT_FLOAT32"], ENUMS["FMT_FLOAT16"], ENUMS["FMT_BFLOAT16"], ENUMS["FMT_INT32"])
CODE_INTEGER, CODE_SMALL_FLOAT = ENUMS["CODE_INTEGER"], ENUMS["CODE_SMALL_FLOAT"]
SF_E4M3FN, SF_E4M3FNUZ, SF_E5M2, SF_E5M2FNUZ, SF_E2M1, SF_E2M3, SF_E3M2 = (
    ENUMS["SF_E4M3FN"], ENUMS["SF_E4M3FNUZ"], ENUMS["SF_E5M2"], ENUMS["SF_E5M2FNUZ"],
    ENUMS["SF_E2M1"], ENUMS["SF_E2M3"], ENUMS["SF_E3M2"])
PER_TENSOR, PER_AXIS, BLOCKED = ENUMS["PER_TENSOR"], ENUMS["PER_AXIS"], ENUMS["BLOCKED"]
PATH_GENERAL, PATH_F32_INTEGER, PATH_F32_SMALL_FLOAT = (
    ENUMS["PATH_GENERAL"], ENUMS["PATH_F32_INTEGER"], ENUMS["PATH_F32_SMALL_FLOAT"])
SF_RULE_NAN_SIGN, SF_RULE_FNUZ_INF_NAN = ENUMS["SF_RULE_NAN_SIGN"], ENUMS["SF_RULE_FNUZ_INF_NAN"]
SF_RULE_NAN_NEGATIVE_ZERO = ENUMS["SF_RULE_NAN_NEGATIVE_ZERO"]
SF_RULE_NAN_OPPOSITE_ZERO = ENUMS["SF_RULE_NAN_OPPOSITE_ZERO"]
(CAST_FLOAT64, CAST_FLOAT32, CAST_FLOAT16, CAST_BFLOAT16, CAST_SMALL_FLOAT, CAST_E8M0,
 CAST_SIGNED, CAST_UNSIGNED, CAST_BOOL) = (
    ENUMS[f"CAST_{k}"] for k in ("FLOAT64", "FLOAT32", "FLOAT16", "BFLOAT16", "SMALL_FLOAT",
                                 "E8M0", "SIGNED", "UNSIGNED", "BOOL"))
CAST_PATH_GENERAL, CAST_PATH_F32_SMALL_FLOAT, CAST_PATH_F32_E8M0 = (
    ENUMS["CAST_PATH_GENERAL"], ENUMS["CAST_PATH_F32_SMALL_FLOAT"], ENUMS["CAST_PATH_F32_E8M0"])
(CAST_PATH_SMALL_FLOAT_DATAPATH, CAST_PATH_F32_F16, CAST_PATH_F32_BF16, CAST_PATH_F32_INTEGER,
 CAST_PATH_F16_F32, CAST_PATH_BF16_F32) = (
    ENUMS[f"CAST_PATH_{k}"] for k in ("SMALL_FLOAT_DATAPATH", "F32_F16", "F32_BF16", "F32_INTEGER",
                                      "F16_F32", "BF16_F32"))
CAST_PATH_HALF_DATAPATH = ENUMS["CAST_PATH_HALF_DATAPATH"]
# Cast's round_mode values, indexed by the kernels' E8M0RoundMode.
E8M0_ROUND_MODES = tuple(
    name for _, name in sorted((ENUMS[f"E8M0_{n.upper()}"], n) for n in ("up", "down", "nearest")))


@dataclass(frozen=True)
class ElementType:
    name: str  # our canonical name, the ONNX type name: "int4", "float8e4m3fn"
    onnx_id: int  # TensorProto.DataType
    dtype: np.dtype  # what arrays of this type are in numpy (ml_dtypes where needed)
    storage: np.dtype  # the plain dtype the kernels see
    # "integer", "small_float", "value" (float32/16/bf16), "scale_only" (e8m0); Cast's
    # other types: "float64", "bool"
    kind: str
    bits: int  # bits per element in ONNX storage
    lo: int | float | None = None  # integer range
    hi: int | float | None = None
    small_float_id: int | None = None
    value_format: int | None = None  # FMT_* for float32/float16/bfloat16/int32

    @property
    def onnx_type(self) -> str:
        return f"tensor({self.name})"

    @property
    def packed(self) -> bool:
        return self.bits < 8

    @property
    def signed(self) -> bool:
        """An integer type with negative values."""
        return self.lo is not None and self.lo < 0

    def code_values(self, codes) -> np.ndarray:
        """The int64 values of integer codes given by their low `bits` bits: two's
        complement for a signed type (the one home of sign extension)."""
        if self.kind != "integer":
            raise TypeError(f"{self.name} is not an integer type")
        values = np.asarray(codes, dtype=np.int64) & ((1 << self.bits) - 1)
        if self.signed:
            values = np.where(values >= 1 << (self.bits - 1), values - (1 << self.bits), values)
        return values

    def __repr__(self) -> str:
        return f"<ElementType {self.name}>"


def _integer(name, onnx_id, dtype, storage, bits, lo, hi):
    return ElementType(name, onnx_id, np.dtype(dtype), np.dtype(storage), "integer", bits, lo, hi)


def _small_float(name, onnx_id, dtype, bits, fmt_id):
    return ElementType(name, onnx_id, np.dtype(dtype), np.dtype(np.uint8), "small_float", bits,
                       small_float_id=fmt_id)


ELEMENT_TYPES: dict[str, ElementType] = {
    t.name: t
    for t in (
        _integer("int8", 3, np.int8, np.uint8, 8, -128, 127),
        _integer("uint8", 2, np.uint8, np.uint8, 8, 0, 255),
        _integer("int16", 5, np.int16, np.uint16, 16, -32768, 32767),
        _integer("uint16", 4, np.uint16, np.uint16, 16, 0, 65535),
        _integer("int4", 22, ml_dtypes.int4, np.uint8, 4, -8, 7),
        _integer("uint4", 21, ml_dtypes.uint4, np.uint8, 4, 0, 15),
        _integer("int2", 26, ml_dtypes.int2, np.uint8, 2, -2, 1),
        _integer("uint2", 25, ml_dtypes.uint2, np.uint8, 2, 0, 3),
        _small_float("float8e4m3fn", 17, ml_dtypes.float8_e4m3fn, 8, SF_E4M3FN),
        _small_float("float8e4m3fnuz", 18, ml_dtypes.float8_e4m3fnuz, 8, SF_E4M3FNUZ),
        _small_float("float8e5m2", 19, ml_dtypes.float8_e5m2, 8, SF_E5M2),
        _small_float("float8e5m2fnuz", 20, ml_dtypes.float8_e5m2fnuz, 8, SF_E5M2FNUZ),
        _small_float("float4e2m1", 23, ml_dtypes.float4_e2m1fn, 4, SF_E2M1),
        _small_float("float6e2m3", 27, ml_dtypes.float6_e2m3fn, 6, SF_E2M3),
        _small_float("float6e3m2", 28, ml_dtypes.float6_e3m2fn, 6, SF_E3M2),
        ElementType("float", 1, np.dtype(np.float32), np.dtype(np.float32), "value", 32,
                    value_format=FMT_FLOAT32),
        ElementType("float16", 10, np.dtype(np.float16), np.dtype(np.uint16), "value", 16,
                    value_format=FMT_FLOAT16),
        ElementType("bfloat16", 16, np.dtype(ml_dtypes.bfloat16), np.dtype(np.uint16), "value", 16,
                    value_format=FMT_BFLOAT16),
        ElementType("int32", 6, np.dtype(np.int32), np.dtype(np.int32), "integer", 32,
                    -(2**31), 2**31 - 1, value_format=FMT_INT32),
        ElementType("float8e8m0", 24, np.dtype(ml_dtypes.float8_e8m0fnu), np.dtype(np.uint8),
                    "scale_only", 8),
        # Types only Cast and CastLike take (besides int32 above).
        _integer("int64", 7, np.int64, np.uint64, 64, -(2**63), 2**63 - 1),
        _integer("uint32", 12, np.uint32, np.uint32, 32, 0, 2**32 - 1),
        _integer("uint64", 13, np.uint64, np.uint64, 64, 0, 2**64 - 1),
        ElementType("double", 11, np.dtype(np.float64), np.dtype(np.float64), "float64", 64),
        ElementType("bool", 9, np.dtype(np.bool_), np.dtype(np.uint8), "bool", 8),
    )
}

_BY_ONNX_ID = {t.onnx_id: t for t in ELEMENT_TYPES.values()}
_BY_DTYPE = {t.dtype: t for t in ELEMENT_TYPES.values()}

# Other spellings users write: ml_dtypes / numpy names and common abbreviations.
_ALIASES = {
    "float32": "float", "f32": "float", "fp32": "float", "float64": "double", "f64": "double",
    "fp64": "double", "f16": "float16", "fp16": "float16",
    "half": "float16", "bf16": "bfloat16",
    "float8_e4m3fn": "float8e4m3fn", "float8_e4m3fnuz": "float8e4m3fnuz",
    "float8_e5m2": "float8e5m2", "float8_e5m2fnuz": "float8e5m2fnuz",
    "float4_e2m1fn": "float4e2m1", "float4e2m1fn": "float4e2m1",
    "float6_e2m3fn": "float6e2m3", "float6e2m3fn": "float6e2m3",
    "float6_e3m2fn": "float6e3m2", "float6e3m2fn": "float6e3m2",
    "float8_e8m0fnu": "float8e8m0", "float8e8m0fnu": "float8e8m0",
}


def _known_names() -> str:
    return ", ".join(ELEMENT_TYPES)


def element_type(spec: TypeSpec, argument: str = "dtype") -> ElementType:
    """Resolve an ONNX TensorProto int, a name, a numpy/ml_dtypes dtype or an ElementType."""
    if isinstance(spec, ElementType):
        return spec
    # (np.dtype(None) is float64: None is no type here)
    if spec is None or isinstance(spec, (bool, np.bool_)):
        raise TypeError(f"{argument}={spec!r}: expected an ONNX data-type int, a type name or a dtype")
    if isinstance(spec, (int, np.integer)):
        found = _BY_ONNX_ID.get(int(spec))
        if found is None:
            raise ValueError(
                f"{argument}={int(spec)} is not an ONNX data type of the quantization ops; "
                f"allowed: " + ", ".join(f"{t.onnx_id} ({t.name})" for t in ELEMENT_TYPES.values())
            )
        return found
    if isinstance(spec, str):
        key = spec.strip().lower()
        if key.startswith("tensor(") and key.endswith(")"):
            key = key[7:-1]
        key = _ALIASES.get(key, key)
        found = ELEMENT_TYPES.get(key)
        if found is None:
            raise ValueError(f"{argument}={spec!r} is not a known type name; known: {_known_names()}")
        return found
    try:
        dt = np.dtype(spec)
    except TypeError:
        raise TypeError(
            f"{argument}={spec!r}: expected an ONNX data-type int, a type name or a dtype"
        ) from None
    found = _BY_DTYPE.get(dt)
    if found is None:
        raise ValueError(f"{argument}: dtype {dt} is not a type of the quantization ops; known: {_known_names()}")
    return found


def array_element_type(array: np.ndarray | ArraySpec, argument: str) -> ElementType:
    found = _BY_DTYPE.get(array.dtype)
    if found is None:
        raise TypeError(
            f"{argument} has dtype {array.dtype}, which no ONNX quantization op accepts; "
            f"known: {_known_names()}"
        )
    return found

