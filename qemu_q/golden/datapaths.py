"""Golden suites for a described datapath (`qemu-q golden --datapath FILE.json`).

Every op call of the suite goes through one helper, `call_op`, which hands the suite's
`qemu_q.Datapath` to the op as `datapath=` (and stochastic rounding's `random_bits=`).
`run_node` is `qemu_q.run_op` for golden cases: the same adapters from a node's inputs and
attributes to the public functions as the op families register, with the datapath passed.

A datapath file is a JSON object of Datapath fields by their keyword names; `load_datapath`
reads it (docs/golden.md, "A described datapath").
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
from functools import lru_cache

import numpy as np

from ..datapath import ONNX, Datapath, as_datapath

FIELDS = tuple(f.name for f in dataclasses.fields(Datapath))

# Ops of the suite that issue 15 gives no `datapath=`: their cases are left out of a suite
# whose datapath is not the ONNX default (their bits would be ONNX's, not the datapath's),
# and the manifest lists them with this reason.
NO_DATAPATH_OPS = {
    "DynamicQuantizeLinear": "DynamicQuantizeLinear takes no datapath= (issue 15 does not give "
                             "it one): its bits would be the ONNX ones, not the datapath's",
}


class DatapathFileError(ValueError):
    """A datapath file that is not a JSON object of valid Datapath fields."""


class DatapathNotTaken(ValueError):
    """A non-default datapath reached an op function that has no `datapath=` (yet)."""


def datapath_fields(datapath: Datapath | None) -> dict:
    """Every field of the datapath by keyword name (the manifest's `datapath`)."""
    return dataclasses.asdict(as_datapath(datapath))


def is_default(datapath: Datapath | None) -> bool:
    return as_datapath(datapath).is_onnx


def parse_datapath(value, where: str = "datapath") -> Datapath:
    """A Datapath from a mapping of its fields (a parsed FILE.json). Unknown keys and bad
    values are a DatapathFileError naming the key, its value and what is allowed."""
    if not isinstance(value, dict):
        raise DatapathFileError(f"{where}: expected a JSON object of Datapath fields "
                                f"({', '.join(FIELDS)}), got {type(value).__name__}")
    for key, field_value in value.items():
        if key not in FIELDS:
            raise DatapathFileError(f"{where}: unknown key {key!r} (value {field_value!r}); "
                                    f"Datapath fields: {', '.join(FIELDS)}")
        if key == "by_version":
            if not isinstance(field_value, list):
                raise DatapathFileError(f"{where}: by_version={field_value!r}; expected a list "
                                        "of [op_type, first_version, last_version, {field: value}]")
            continue
        if field_value is not None and not isinstance(field_value, str):
            raise DatapathFileError(f"{where}: {key}={field_value!r}; expected a string or null")
    try:
        return Datapath(**value)
    except ValueError as error:
        raise DatapathFileError(f"{where}: {error}") from None


def load_datapath(path: str) -> Datapath:
    """The Datapath a FILE.json describes. OSError for an unreadable file (as open gives
    it); DatapathFileError for text that is not valid JSON or not valid fields."""
    with open(path, "rb") as handle:
        data = handle.read()
    try:
        value = json.loads(data.decode("utf-8"), object_pairs_hook=_unique_keys)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise DatapathFileError(f"--datapath {path}: not valid JSON ({error})") from None
    except RecursionError:
        raise DatapathFileError(f"--datapath {path}: JSON nested too deeply to be a datapath") from None
    except _DuplicateKey as error:
        raise DatapathFileError(f"--datapath {path}: the key {error.args[0]!r} is given twice in one "
                                "object (JSON readers disagree on which holds)") from None
    return parse_datapath(value, f"--datapath {path}")


class _DuplicateKey(Exception):
    pass


def _unique_keys(pairs: list) -> dict:
    result = {}
    for key, value in pairs:
        if key in result:
            raise _DuplicateKey(key)
        result[key] = value
    return result


# --------------------------------------------------------------------------------------
# The one helper


@lru_cache(maxsize=None)
def _parameters(function) -> frozenset:
    return frozenset(inspect.signature(function).parameters)


def _name(function) -> str:
    return getattr(function, "__name__", repr(function))


def call_op(function, *args, datapath: Datapath | None = None, random_bits=None, **kwargs):
    """`function(*args, datapath=datapath, **kwargs)`: the one place the golden suite hands
    its datapath to an op. `random_bits` (stochastic rounding) is passed when given."""
    datapath = as_datapath(datapath)
    if random_bits is not None:
        if "random_bits" not in _parameters(function):
            raise DatapathNotTaken(f"{_name(function)} takes no random_bits=: it cannot run "
                                   "datapath rounding='stochastic'")
        kwargs["random_bits"] = random_bits
    return function(*args, datapath=datapath, **kwargs)


# --------------------------------------------------------------------------------------
# Nodes: run_op's adapters, with the datapath


def _node_values(spec, attributes: dict) -> dict:
    """The node's attributes over the spec's defaults, as run_op passes them."""
    return {**{k: v for k, v in spec.attributes.items() if v is not None}, **attributes}


def _node_function(op_type: str):
    from .. import ops

    return {"QuantizeLinear": ops.quantize_linear, "DequantizeLinear": ops.dequantize_linear,
            "DynamicQuantizeLinear": ops.dynamic_quantize_linear, "Cast": ops.cast,
            "CastLike": ops.cast_like, "MatMulInteger": ops.matmul_integer,
            "QLinearMatMul": ops.qlinear_matmul, "ConvInteger": ops.conv_integer,
            "QLinearConv": ops.qlinear_conv}[op_type]


def run_node(op_type: str, inputs, attributes: dict, version: int,
             datapath: Datapath | None = None, seed: int = 0, name: str = ""):
    """(outputs, random_bits) of the node under the datapath: the outputs are
    `run_op(op_type, inputs, attributes, version)` for the ONNX default, by the same
    adapters as the op families register. random_bits: None, or with rounding="stochastic"
    for an op that takes random_bits=, the words of its first input, or of its output y for
    the QLinear ops, which round y's elements (RANDOM_BITS_RULE)."""
    from .._opspec import get_spec
    from ..ops.conv_integer import _conv_attributes

    spec = get_spec(op_type, version)
    function = _node_function(op_type)
    inputs = list(inputs) + [None] * (len(spec.inputs) - len(inputs))
    values = _node_values(spec, dict(attributes))

    def outputs_with(common):
        if op_type in ("QuantizeLinear", "DequantizeLinear"):
            return [call_op(function, *inputs, **values, **common)]
        if op_type == "DynamicQuantizeLinear":
            # No datapath= by design (NO_DATAPATH_OPS): called without the helper.
            if not as_datapath(common["datapath"]).is_onnx:
                raise DatapathNotTaken(NO_DATAPATH_OPS[op_type])
            return list(function(inputs[0], opset=version))
        if op_type == "Cast":
            fields = dict(values)
            to = fields.pop("to")
            return [call_op(function, inputs[0], to, **fields, **common)]
        if op_type == "CastLike":
            return [call_op(function, inputs[0], inputs[1], **values, **common)]
        if op_type in ("MatMulInteger", "ConvInteger"):
            extra = _conv_attributes(values) if op_type == "ConvInteger" else {}
            return [call_op(function, *inputs[:4], **extra, **common)]
        if op_type == "QLinearMatMul":
            return [call_op(function, *inputs[:8], **common)]
        return [call_op(function, *inputs[:9], **_conv_attributes(values), **common)]  # QLinearConv

    bits = None
    if as_datapath(datapath).rounding == "stochastic" and "random_bits" in _parameters(function):
        if op_type in RANDOM_BITS_OF_Y:
            # one word per output element: y's shape, from the ONNX default run
            shape = np.shape(outputs_with(dict(opset=version, datapath=None, random_bits=None))[0])
        else:
            shape = np.shape(inputs[0])
        bits = random_bits_for(seed, name, shape)
    outputs = outputs_with(dict(opset=version, datapath=datapath, random_bits=bits))
    return outputs, bits


# --------------------------------------------------------------------------------------
# Stochastic rounding's bits

RANDOM_BITS_INPUT = "random_bits"
# The ops whose random_bits= has one word per element of y (they round y, not x).
RANDOM_BITS_OF_Y = ("QLinearMatMul", "QLinearConv")
RANDOM_BITS_RULE = (
    "uint32, one word per element of x in C order (QLinearMatMul, QLinearConv: of y, "
    "x.shape below read as y.shape): np.random.default_rng(int.from_bytes("
    "sha256(f'{seed}:{case name}:random_bits').digest()[:8], 'little')).integers(0, 2**32, "
    "x.shape, dtype=np.uint32); written as the input 'random_bits' after the node inputs")


def random_bits_for(seed: int, name: str, shape) -> np.ndarray:
    """The words of a stochastic-rounding case (RANDOM_BITS_RULE)."""
    digest = hashlib.sha256(f"{seed}:{name}:random_bits".encode()).digest()
    rng = np.random.default_rng(int.from_bytes(digest[:8], "little"))
    return rng.integers(0, 2**32, size=tuple(shape), dtype=np.uint32)


__all__ = ["DatapathFileError", "DatapathNotTaken", "FIELDS", "NO_DATAPATH_OPS",
           "RANDOM_BITS_INPUT", "RANDOM_BITS_RULE", "call_op", "datapath_fields", "is_default",
           "load_datapath", "parse_datapath", "random_bits_for", "run_node"]
