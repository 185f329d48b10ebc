"""Datapath(float8_encoder="onnxruntime"): the float8 constructors of onnxruntime's
include/onnxruntime/core/common/float8.h (Float8E4M3FN(float v, bool saturate) and its
siblings), run by QuantizeLinear and Cast in the kernels (docs/semantics.md, "Datapath
options").

The oracle below transcribes the constructors' steps on the float32 bit fields (truncate
the mantissa, lower e4m3fn's all-ones code, round half to even only below the largest
code, else NaN or infinity without saturation), one float32 exponent at a time, in
Python integers over numpy arrays. It is written from the header's text, not from the
kernel (which states the same function as the ONNX encoder plus its departures), and it
is checked against the ONNX encoder's bits where the two agree by the spec: the tests
below pin where they differ."""

import numpy as np
import pytest

import qemu_q
from qemu_q.datapath import Datapath

from support import assert_same_bits

ORT = Datapath(float8_encoder="onnxruntime")
FLOAT8 = ("float8e4m3fn", "float8e4m3fnuz", "float8e5m2", "float8e5m2fnuz")


# --------------------------------------------------------------------------------------
# The oracle: onnxruntime's constructors, per float32 exponent

# (mantissa bits, the float32 exponent of the format's smallest normal, the exponent below
# which every value rounds to zero, the first float32 exponent above the normal range,
# the largest finite code, fnuz): the header's constants
_FORMATS = {
    "float8e4m3fn": (3, 121, 117, 136, 0x7E, False),
    "float8e4m3fnuz": (3, 120, 116, 135, 0x7F, True),
    "float8e5m2": (2, 113, 110, 143, 0x7B, False),
    "float8e5m2fnuz": (2, 112, 109, 143, 0x7F, True),
}


def _round_bit_set(m, val, mask):
    # the header's condition: the first dropped bit set, and the kept lsb or a lower bit set
    return ((m & mask) != 0) & (((val & 1) != 0) | ((m & (mask - 1)) != 0))


def onnxruntime_float8(bits: np.ndarray, name: str, saturate: bool) -> np.ndarray:
    """The constructor of `name` on float32 bit patterns (uint32), as uint8 codes."""
    mbits, first_normal, first_subnormal, above, max_code, fnuz = _FORMATS[name]
    b = bits.astype(np.int64)
    sign = (b >> 24) & 0x80
    e_all = (b >> 23) & 0xFF
    m_all = b & 0x7FFFFF
    out = np.zeros(b.shape, np.int64)
    for e in np.unique(e_all):
        e = int(e)
        sel = e_all == e
        s, m = sign[sel], m_all[sel]
        if e == 255:
            inf = m == 0
            if fnuz:
                val = np.where(inf & saturate, s | 0x7F, 0x80)
            elif name == "float8e4m3fn":
                val = np.where(inf, s | (0x7E if saturate else 0x7F), s | 0x7F)
            else:  # e5m2: inf is 0x7B / 0x7C, NaN the all-ones mantissa with the sign
                val = np.where(inf, s | (0x7B if saturate else 0x7C), s | 0x7F)
        elif e < first_subnormal:
            # below half the smallest subnormal (and float32 zeros and subnormals)
            val = np.zeros_like(s) if fnuz else s.copy()
        elif e < first_normal:
            d = first_normal - 1 - e  # 0: the top subnormal binade
            val = s.copy()
            if d < mbits:
                val |= 1 << (mbits - 1 - d)
                val |= m >> (23 - mbits + 1 + d)
            else:
                val = np.where(m > 0, val | 1, 0 if fnuz else val)
            mask = 1 << (23 - mbits + d)
            if mask < (1 << 23):
                val = np.where(_round_bit_set(m, val, mask), val + 1, val)
        elif e < above:
            ex = e - first_normal + 1
            val = s | (ex << mbits) | (m >> (23 - mbits))
            if name == "float8e4m3fn":
                val = np.where((val & 0x7F) == 0x7F, val & 0xFE, val)
            # round to even on the float32 bits: the kept lsb is m's, not the lowered code's
            half = 1 << (22 - mbits)
            up = ((m & half) != 0) & (((m & (half << 1)) != 0) | ((m & (half - 1)) != 0))
            below = (val & 0x7F) < max_code
            if fnuz:
                over = 0x7F if saturate else 0x80
                val = np.where(up & below, val + 1, np.where(up, np.where(saturate, val, over), val))
            elif name == "float8e4m3fn":
                val = np.where(up & below, val + 1, np.where(up & (not saturate), val | 0x7F, val))
            else:  # e5m2: saturate ORs in 0x7B (a no-op at 0x7B), else 0x7C
                val = np.where(up & below, val + 1, np.where(up, val | (0x7B if saturate else 0x7C), val))
        else:
            if fnuz:
                val = np.where(np.full(s.shape, saturate), s | 0x7F, 0x80)
            else:
                val = s | (max_code if saturate else (0x7F if name == "float8e4m3fn" else 0x7C))
        out[sel] = val
    return out.astype(np.uint8)


# --------------------------------------------------------------------------------------
# Inputs

def _float16_all() -> np.ndarray:
    return np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)


def _bfloat16_all() -> np.ndarray:
    import ml_dtypes

    return np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(ml_dtypes.bfloat16)


def _float32_range(lo: float, hi: float) -> np.ndarray:
    """Every float32 in [lo, hi] (lo, hi > 0), with its negation."""
    a = int(np.float32(lo).view(np.uint32))
    b = int(np.float32(hi).view(np.uint32))
    bits = np.arange(a, b + 1, dtype=np.uint32)
    return np.concatenate([bits, bits | np.uint32(0x80000000)]).view(np.float32)


def _float32_around(centres, ulps: int = 2048) -> np.ndarray:
    """Every float32 within `ulps` of each centre (> 0), with its negation."""
    bits = np.concatenate([
        np.arange(int(np.float32(c).view(np.uint32)) - ulps,
                  int(np.float32(c).view(np.uint32)) + ulps + 1, dtype=np.uint32)
        for c in centres])
    return np.concatenate([bits, bits | np.uint32(0x80000000)]).view(np.float32)


# The departures' band limits and the largest values' midpoints
_BAND_EDGES = (448.0, 464.0, 480.0, 496.0, 512.0, 240.0, 248.0, 256.0,
               57344.0, 61440.0, 65536.0)


def _float32_edges() -> np.ndarray:
    """The float32 neighbourhood of every float8 value's midpoints and of the
    zero/subnormal thresholds, a random sample of all bit patterns, and the specials."""
    rng = np.random.default_rng(0xF8)
    parts = [rng.integers(0, 1 << 32, 1 << 18, dtype=np.uint64).astype(np.uint32)]
    for exponent in range(100, 150):
        base = np.uint32(exponent << 23)
        # every kept-mantissa pattern with dropped bits 0, the midpoint and its neighbours
        for kept in range(8):
            for dropped in (0, 1, (1 << 19) - 1, 1 << 19, (1 << 19) + 1, (1 << 20) - 1,
                            1 << 20, (1 << 20) + 1, (1 << 21) - 1):
                parts.append(np.array([base | np.uint32((kept << 20) | dropped)], np.uint32))
    parts.append(np.array([0, 1, 0x007FFFFF, 0x7F800000, 0x7F7FFFFF, 0x7FC00000, 0x7F800001,
                           0x7FFFFFFF], np.uint32))
    bits = np.concatenate(parts)
    return np.concatenate([bits, bits | np.uint32(0x80000000)]).view(np.float32)


def _bits(values: np.ndarray) -> np.ndarray:
    return np.asarray(values, np.float32).view(np.uint32)


def _codes(result) -> np.ndarray:
    return np.asarray(result).view(np.uint8).reshape(-1)


# --------------------------------------------------------------------------------------
# The oracle against itself and the spec: it is the ONNX rounding outside the departures


def test_oracle_documented_values():
    """docs/divergences.md's entries, from the oracle: [480, 496) -> 448 into e4m3fn and
    [61440, 65536) -> NaN into e5m2 without saturation; e5m2 NaN 0x7F / 0xFF."""
    x = np.array([464, 464.5, 480, 490, 495.75, 496, 512, -480, -495.75], np.float32)
    assert onnxruntime_float8(_bits(x), "float8e4m3fn", False).tolist() == \
        [0x7E, 0x7F, 0x7E, 0x7E, 0x7E, 0x7F, 0x7F, 0xFE, 0xFE]
    assert onnxruntime_float8(_bits(x), "float8e4m3fn", True).tolist() == \
        [0x7E, 0x7E, 0x7E, 0x7E, 0x7E, 0x7E, 0x7E, 0xFE, 0xFE]
    x = np.array([57344, 61439.996, 61440, 65535, 65536, -61440, np.inf], np.float32)
    assert onnxruntime_float8(_bits(x), "float8e5m2", False).tolist() == \
        [0x7B, 0x7B, 0x7F, 0x7F, 0x7C, 0xFF, 0x7C]
    assert onnxruntime_float8(_bits(x), "float8e5m2", True).tolist() == \
        [0x7B, 0x7B, 0x7B, 0x7B, 0x7B, 0xFB, 0x7B]
    nans = np.array([0x7FC00000, 0xFFC00000], np.uint32)
    assert onnxruntime_float8(nans, "float8e5m2", True).tolist() == [0x7F, 0xFF]
    assert onnxruntime_float8(nans, "float8e4m3fn", False).tolist() == [0x7F, 0xFF]
    assert onnxruntime_float8(nans, "float8e4m3fnuz", False).tolist() == [0x80, 0x80]
    # FNUZ +-inf with saturate: +-max (Cast-24's row), at every version
    infs = np.array([0x7F800000, 0xFF800000], np.uint32)
    assert onnxruntime_float8(infs, "float8e4m3fnuz", True).tolist() == [0x7F, 0xFF]
    assert onnxruntime_float8(infs, "float8e5m2fnuz", True).tolist() == [0x7F, 0xFF]


@pytest.mark.parametrize("name", FLOAT8)
@pytest.mark.parametrize("saturate", [0, 1])
def test_oracle_is_the_onnx_rounding_outside_the_departures(name, saturate):
    """The oracle equals the ONNX encoder of Cast-24 (qemu_q's default at opset 25) on
    every float16 and the float32 edges, but for the departures the docs list."""
    x = np.concatenate([_float16_all().astype(np.float32), _float32_edges()])
    onnx_codes = _codes(qemu_q.cast(x, name, saturate=saturate, opset=25))
    ours = onnxruntime_float8(_bits(x), name, bool(saturate))
    a = np.abs(x)
    departs = np.zeros(x.shape, bool)
    if name == "float8e4m3fn" and not saturate:
        departs = (a >= 480) & (a < 496)
    if name == "float8e5m2":
        departs = np.isnan(x) | ((a >= 61440) & (a < 65536) & (not saturate))
    assert_same_bits(ours[~departs], onnx_codes[~departs], name)
    assert departs.sum() == 0 or (ours[departs] != onnx_codes[departs]).all()


# --------------------------------------------------------------------------------------
# The kernels against the oracle


@pytest.mark.parametrize("name", FLOAT8)
@pytest.mark.parametrize("saturate", [0, 1])
@pytest.mark.parametrize("opset", [19, 25])
def test_cast_float16_exhaustive(name, saturate, opset):
    x = _float16_all()
    got = qemu_q.cast(x, name, saturate=saturate, opset=opset, datapath=ORT)
    want = onnxruntime_float8(_bits(x.astype(np.float32)), name, bool(saturate))
    assert_same_bits(_codes(got), want, f"float16 -> {name}")


@pytest.mark.parametrize("name", FLOAT8)
@pytest.mark.parametrize("saturate", [0, 1])
def test_cast_bfloat16_exhaustive(name, saturate):
    """bfloat16 inputs; without saturation onnxruntime reads a NaN as +NaN
    (BFloat16::ToFloat returns quiet_NaN()), with saturation it keeps the sign."""
    x = _bfloat16_all()
    as_float = x.astype(np.float32)
    bits = _bits(as_float)
    if not saturate:
        bits = np.where(np.isnan(as_float), np.uint32(0x7FC00000), bits)
    got = qemu_q.cast(x, name, saturate=saturate, opset=25, datapath=ORT)
    assert_same_bits(_codes(got), onnxruntime_float8(bits, name, bool(saturate)),
                     f"bfloat16 -> {name}")


@pytest.mark.parametrize("name, lo, hi", [("float8e4m3fn", 480.0, 496.0),
                                          ("float8e5m2", 61440.0, 65536.0)])
@pytest.mark.parametrize("saturate", [0, 1])
def test_cast_every_float32_of_the_bands(name, lo, hi, saturate):
    """Every float32 of a departure band and 2048 neighbours on each side, both signs."""
    x = np.concatenate([_float32_range(lo, hi), _float32_around((lo, hi))])
    got = qemu_q.cast(x, name, saturate=saturate, opset=25, datapath=ORT)
    assert_same_bits(_codes(got), onnxruntime_float8(_bits(x), name, bool(saturate)), name)


@pytest.mark.parametrize("name", FLOAT8)
@pytest.mark.parametrize("saturate", [0, 1])
def test_cast_float32_band_edges(name, saturate):
    """The float32 around every band limit and the edges, through Cast and CastLike."""
    x = np.concatenate([_float32_around(_BAND_EDGES), _float32_edges()])
    want = onnxruntime_float8(_bits(x), name, bool(saturate))
    got = qemu_q.cast(x, name, saturate=saturate, opset=21, datapath=ORT)
    assert_same_bits(_codes(got), want, f"float32 -> {name}")
    target = qemu_q.cast(np.zeros(1, np.float32), name)
    got = qemu_q.cast_like(x, target, saturate=saturate, opset=21, datapath=ORT)
    assert_same_bits(_codes(got), want, f"CastLike float32 -> {name}")


@pytest.mark.parametrize("name", FLOAT8)
def test_cast_float64_and_integers_go_through_float32(name):
    """onnxruntime converts every input with static_cast<float> first: float64 rounds to
    float32 (ties to even) and so do wide integers."""
    x64 = np.array([479.99999999, 495.99999999, 61439.999999, 1e-300, -1e300], np.float64)
    with np.errstate(over="ignore"):  # -1e300 becomes -inf in float32, as static_cast does
        as_float = x64.astype(np.float32)
    want = onnxruntime_float8(_bits(as_float), name, False)
    got = qemu_q.cast(x64, name, saturate=0, opset=25, datapath=ORT)
    assert_same_bits(_codes(got), want, f"float64 -> {name}")
    ints = np.array([0, 1, -1, 7, 480, 490, 495, 496, 61440, 65535, 2**31 - 1, -2**31], np.int64)
    for dtype in (np.int32, np.int64):
        got = qemu_q.cast(ints.astype(dtype), name, saturate=0, opset=25, datapath=ORT)
        want = onnxruntime_float8(_bits(ints.astype(np.float32)), name, False)
        assert_same_bits(_codes(got), want, f"{np.dtype(dtype)} -> {name}")


@pytest.mark.parametrize("name", FLOAT8)
@pytest.mark.parametrize("saturate", [0, 1])
@pytest.mark.parametrize("opset", [19, 21, 23, 25])
def test_quantize_linear_float32_bands_and_edges(name, saturate, opset):
    """QuantizeLinear with a unit scale: the quotient is x, encoded by the constructor."""
    x = np.concatenate([_float32_around(_BAND_EDGES), _float32_edges()])
    zero_point = qemu_q.cast(np.zeros(1, np.float32), name).reshape(())
    got = qemu_q.quantize_linear(x, np.float32(1.0), zero_point, saturate=saturate, opset=opset,
                                 datapath=ORT)
    with np.errstate(invalid="ignore"):  # signalling NaNs turn quiet: the sign stays
        quotient = x + np.float32(0.0)  # plus the +0 zero point: -0 becomes +0
    want = onnxruntime_float8(_bits(quotient), name, bool(saturate))
    assert_same_bits(_codes(got), want, f"QL-{opset} -> {name}")


@pytest.mark.parametrize("name", FLOAT8)
@pytest.mark.parametrize("saturate", [0, 1])
def test_quantize_linear_float16_exhaustive_with_a_scale(name, saturate):
    """float16 x at QL-23 (the quotient in float16), scale 0.75: every float16 input's
    float16 quotient (numpy's float16 division is IEEE's) through the constructor."""
    x = _float16_all()
    scale = np.float16(0.75)
    zero_point = qemu_q.cast(np.zeros(1, np.float32), name).reshape(())
    got = qemu_q.quantize_linear(x, scale, zero_point, saturate=saturate, opset=23, datapath=ORT)
    with np.errstate(all="ignore"):
        quotient = (x / scale).astype(np.float32) + np.float32(0.0)
    assert_same_bits(_codes(got), onnxruntime_float8(_bits(quotient), name, bool(saturate)),
                     f"QL-23 float16 -> {name}")


def test_by_threads_and_general_path():
    x = np.concatenate([_float32_around(_BAND_EDGES), _float32_edges()])
    one = qemu_q.quantize_linear(x, np.float32(1.0), qemu_q.cast(np.zeros(1, np.float32),
                                 "float8e4m3fn").reshape(()), saturate=0, datapath=ORT, n_threads=1)
    for threads in (2, 3):
        many = qemu_q.quantize_linear(x, np.float32(1.0), qemu_q.cast(
            np.zeros(1, np.float32), "float8e4m3fn").reshape(()), saturate=0, datapath=ORT,
            n_threads=threads)
        assert_same_bits(_codes(many), _codes(one), threads)
        assert_same_bits(_codes(qemu_q.cast(x, "float8e5m2", saturate=0, datapath=ORT,
                                            n_threads=threads)),
                         _codes(qemu_q.cast(x, "float8e5m2", saturate=0, datapath=ORT,
                                            n_threads=1)), threads)


# --------------------------------------------------------------------------------------
# Which op reads it; the plan; validation


def test_default_encoder_changes_no_path():
    """Only a float8 output under "onnxruntime" leaves the ONNX paths, and then for the
    scalar datapath path (datapath_one / Cast's datapath loop), never the float32 loops."""
    import ml_dtypes

    import importlib

    from qemu_q._dtypes import ELEMENT_TYPES

    cast_ops = importlib.import_module("qemu_q.ops.cast")
    ql = importlib.import_module("qemu_q.ops.quantize_linear")

    assert Datapath().float8_encoder == "exact"
    f32 = np.dtype(np.float32)

    def ql_fields(zero_point_dtype, datapath):
        return dict(ql.quantize_plan(25, (f32, (64,)), (f32, ()), (np.dtype(zero_point_dtype), ()),
                                     1, 0, 1, 0, None, "spec", True, datapath).kernel_fields)

    for datapath in (qemu_q.datapath.ONNX, ORT):
        fields = ql_fields(np.int8, datapath)  # int8: the field is ignored
        assert not fields["datapath"] and not fields["onnxruntime_float8"], datapath
    fields = ql_fields(ml_dtypes.float8_e4m3fn, ORT)
    assert fields["datapath"] and fields["onnxruntime_float8"] and not fields["datapath_f32"]
    fields = ql_fields(ml_dtypes.float8_e4m3fn, qemu_q.datapath.ONNX)
    assert not fields["datapath"] and not fields["onnxruntime_float8"]

    def cast_fields(target, datapath):
        return dict(cast_ops.cast_plan("Cast", 25, (f32, (8,)), ELEMENT_TYPES[target], 1, "up",
                                       True, cast_ops.datapath_reads(datapath)).kernel_fields)

    assert cast_fields("float8e5m2", ORT)["onnxruntime_float8"]
    assert cast_fields("float8e5m2", ORT)["datapath"]
    for target in ("float8e5m2", "float16", "float4e2m1"):
        assert not cast_fields(target, qemu_q.datapath.ONNX)["datapath"]
    for target in ("float16", "float4e2m1", "int8"):
        assert not cast_fields(target, ORT)["datapath"], target


def test_ignored_where_no_float8_is_written():
    """int8 and float4 outputs of QuantizeLinear, every DequantizeLinear, Cast into
    float16: the field changes no bit (docs/semantics.md, "Which op reads which option")."""
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(4096) * 100).astype(np.float32)
    for output in ("int8", "uint8", "float4e2m1"):
        a = qemu_q.quantize_linear(x, np.float32(0.7), output_dtype=output, opset=25, datapath=ORT)
        b = qemu_q.quantize_linear(x, np.float32(0.7), output_dtype=output, opset=25)
        assert_same_bits(a, b, output)
    codes = qemu_q.quantize_linear(x, np.float32(1.0), np.int8(0))
    assert_same_bits(qemu_q.dequantize_linear(codes, np.float32(0.3), datapath=ORT),
                     qemu_q.dequantize_linear(codes, np.float32(0.3)), "DQ")
    assert_same_bits(qemu_q.cast(x, "float16", datapath=ORT), qemu_q.cast(x, "float16"), "Cast")


def test_validation():
    with pytest.raises(ValueError, match="float8_encoder='ort'"):
        Datapath(float8_encoder="ort")
    with pytest.raises(ValueError, match="float8_encoder=None"):
        Datapath(float8_encoder=None)
    x = np.array([1.0, 2.0], np.float32)
    e4m3 = qemu_q.cast(np.zeros(1, np.float32), "float8e4m3fn").reshape(())
    for field, value in (("rounding", "half_away"), ("nan", "canonical"),
                         ("subnormals", "flush_outputs"), ("subnormals", "flush_both")):
        datapath = Datapath(float8_encoder="onnxruntime", **{field: value})
        with pytest.raises(ValueError, match=rf"QuantizeLinear.*{field}='{value}'.*float8e4m3fn"):
            qemu_q.quantize_linear(x, np.float32(1.0), e4m3, datapath=datapath)
        with pytest.raises(ValueError, match=rf"Cast.*{field}='{value}'.*float8e5m2"):
            qemu_q.cast(x, "float8e5m2", datapath=datapath)
        # an output the encoder does not govern: the field is ignored
        qemu_q.quantize_linear(x, np.float32(1.0), np.int8(0), datapath=datapath)
    # flush_inputs acts before the constructor: x and the scale flushed, then encoded
    datapath = Datapath(float8_encoder="onnxruntime", subnormals="flush_inputs")
    x = np.array([1e-40, -1e-40, 480.0], np.float32)
    # unflushed: 1e-40 / 1e-40 = 1.0 (0x38); flushed: 0 / 0 = NaN (with the sign of 0 / 0)
    got = qemu_q.quantize_linear(x, np.float32(1e-40), e4m3, saturate=0, datapath=ORT)
    assert _codes(got).tolist() == [0x38, 0xB8, 0x7F]
    got = qemu_q.quantize_linear(x, np.float32(1e-40), e4m3, saturate=0, datapath=datapath)
    codes = _codes(got).tolist()
    assert codes[0] & 0x7F == 0x7F and codes[1] & 0x7F == 0x7F  # NaN (0 / 0's sign is the FPU's)
    assert codes[2] == 0x7F  # 480 / 0 = +inf: NaN without saturation


def test_round_trip_through_json():
    from qemu_q.golden import datapaths

    import json

    assert datapaths.parse_datapath(json.loads(qemu_q.profiles.as_json(ORT))) == ORT


@pytest.mark.parametrize("source", FLOAT8)
@pytest.mark.parametrize("name", FLOAT8)
@pytest.mark.parametrize("saturate", [0, 1])
def test_cast_between_float8_types(source, name, saturate):
    """Every code of a float8 type: into another float8 type its value (decoded exactly to
    float32) goes through the constructor; into its own type onnxruntime's Cast copies the
    tensor, every code kept."""
    import ml_dtypes

    from qemu_q._dtypes import ELEMENT_TYPES

    codes = np.arange(256, dtype=np.uint8)
    x = codes.view(ELEMENT_TYPES[source].dtype)
    got = _codes(qemu_q.cast(x, name, saturate=saturate, opset=25, datapath=ORT))
    if source == name:
        assert_same_bits(got, codes, name)
        return
    with np.errstate(invalid="ignore"):
        values = x.astype(np.float32)  # exact: every float8 value is a float32
    assert ml_dtypes.finfo(x.dtype).bits == 8
    assert_same_bits(got, onnxruntime_float8(_bits(values), name, bool(saturate)),
                     f"{source} -> {name}")
