"""Golden test vectors: the cases of the conformance suite, with expected outputs from qemu_q.

The suite is built from the op-spec table. Every op, every since-version and every
quantized type that version allows get a base configuration (float32 x and scale,
per-tensor, default attributes) run on every input family, plus one-factor-at-a-time
variants: each other x type, each other scale type, each `precision`, `saturate=0` for the
float8 types, `output_dtype` and an absent zero point, per-axis and blocked granularity,
and special scale values. Each variant runs on the input families where it can change a
bit. Every case is small; the expected outputs are what `qemu_q.run_op` computes (or,
for a suite under a described datapath, `qemu-q golden --datapath`, the ops called with
that `datapath=`: datapaths.py).

Input families, kept apart so that special values stay in a few small cases (and a case
whose bits differ from another implementation's by design is one named case, see
`DIVERGENCES`):
  QuantizeLinear
    grid          exact ties (k + 0.5)·scale with a power-of-two scale and their neighbours
                  in x's type, the range ends and values just past them (finite quotients
                  below 2^31 that do not overflow the division precision)
    near_ties     a scale that is not a power of two, x at and next to fl((k + 0.5)·scale)
    zeros         ±0 and x's subnormals
    nan           ±NaN, quiet and signalling
    overflow      ±inf, x's largest finite values, quotients of 2^31 and beyond
    random        seeded random x over the quantized range and a little past it
    scales        per-axis unusual finite scales: negative, tiny, huge
    scales_zero   per-axis degenerate scales: ±0, NaN, subnormal
    scales_inf    per-axis infinite scales
  DequantizeLinear
    codes         every finite code (a sample for 16-bit codes after their first version,
                  and for int32)
    nan_inf       the NaN and inf codes of the float8 types
    near_ties     codes whose product with the scale lies next to a midpoint of a float16
                  or bfloat16 output (where rounding through float32 first would differ)
    random        seeded random codes
    scales        per-axis special scales over a few codes
  DynamicQuantizeLinear
    random, positive, negative, zeros, tiny, nan, inf (+inf), neg_inf (-inf)
  Cast, CastLike (every from/to pair of each version; the variant names the source)
    codes         every code of a source of at most 8 bits
    values        a wider source's values chosen by the target: range ends, ties and
                  their neighbours, overflow, wrap points, e8m0 boundaries
    specials      a float source's ±0, ±inf, NaNs (signalling too) and range ends
  MatMulInteger, ConvInteger, QLinearMatMul, QLinearConv (every operand/output type
  combination; geometry variants: integer_families.py)
    random, zero_points, overflow (int32 wrap), ties, saturation
  MX, NVFP4 (not ONNX ops: the dequantize graph of mx_quantize / nvfp4_quantize's output)
    boundaries, ties, outlier, zeros, subnormals, nan_inf, random (block_scaled.py)

Random data come from `np.random.default_rng` seeded by the suite seed and the case name,
so a case's bits do not depend on which other cases are selected.

Modules, by concern:
  configs       Config (a case without its data), each op's configurations, Selection,
                iter_configs
  families      the input families: Case, build_case, generate
  datapaths     the suite's datapath (`qemu-q golden --datapath`): call_op, the one helper
                that passes datapath= to every op call; run_node; the datapath file
  integer_families  the integer datapath ops' inputs and the int32 accumulator extra
  block_scaled  MX and NVFP4 cases: configurations, inputs, the dequantize graph
  divergences   the peer-divergence table (DIVERGENCES, rows keyed to docs/divergences.md
                headings) and divergences_of
  runtimes      which runtimes can run a case at all (the manifest's runs_on)
  writers       the files: ONNX node-test folders, .npz archives, Verilog hex, manifest.json
  verify        qemu_q.verify / qemu-q verify: actual outputs against a suite, bit for bit
"""

from .block_scaled import BLOCK_SCALED_FAMILIES, BLOCK_SCALED_OPS
from .configs import (CAST_FAMILIES, CONV_GEOMETRIES, DQ_FAMILIES, INTEGER_FAMILIES,
                      MATMUL_GEOMETRIES, DYNAMIC_FAMILIES, FAMILIES, OPS, Q_FAMILIES, Config,
                      Selection, iter_configs)
from .divergences import BOTH, DIVERGENCES, ONNXRUNTIME, REFERENCE, divergences_of
from . import datapaths
from .families import DEFAULT_SEED, DEFAULT_SIZE, Case, build_case, generate
from .runtimes import RUNTIMES, cannot_run, runs_on

__all__ = [
    "BLOCK_SCALED_FAMILIES", "BLOCK_SCALED_OPS", "BOTH", "CAST_FAMILIES", "CONV_GEOMETRIES", "DEFAULT_SEED", "INTEGER_FAMILIES",
    "MATMUL_GEOMETRIES", "DEFAULT_SIZE", "DIVERGENCES", "DQ_FAMILIES", "DYNAMIC_FAMILIES",
    "FAMILIES", "ONNXRUNTIME", "OPS", "Q_FAMILIES", "REFERENCE", "RUNTIMES", "Case",
    "Config", "Selection", "build_case", "datapaths", "cannot_run", "divergences_of", "generate",
    "iter_configs", "runs_on",
]
