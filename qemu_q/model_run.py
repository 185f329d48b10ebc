"""A whole ONNX model run with qemu_q's bits at every node it implements (onnx.reference
and `qemu_q.onnx_ops()`), and every tensor of the run dumped as golden vectors: the
`qemu-q run` command (docs/golden.md, "Whole models")."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass

import numpy as np

from ._dtypes import array_element_type
from .golden import writers

MANIFEST = "manifest.json"


class ModelInputError(ValueError):
    """Inputs that do not fit the model's graph inputs (a usage error on the command line)."""


@dataclass(frozen=True)
class DumpedTensor:
    name: str  # the tensor's name in the graph
    array: np.ndarray
    producer: str  # "input", "initializer" or the producing node's name
    op_type: str  # the producing node's op type ("" for inputs and initializers)


def _check_inputs(graph, feeds: dict) -> None:
    from onnx import helper

    initializers = {t.name for t in graph.initializer}
    wanted = [i for i in graph.input if i.name not in initializers]
    names = [i.name for i in wanted]
    missing = [n for n in names if n not in feeds]
    extra = [n for n in feeds if n not in names]
    if missing or extra:
        problem = f"missing {', '.join(missing)}" if missing else f"unknown {', '.join(extra)}"
        raise ModelInputError(f"inputs do not match the graph: {problem}; the graph's inputs "
                              f"are {', '.join(names) or 'none'}")
    for info in wanted:
        array = feeds[info.name]
        tensor = info.type.tensor_type
        etype = array_element_type(array, info.name)
        if tensor.elem_type and tensor.elem_type != etype.onnx_id:
            wanted_type = helper.tensor_dtype_to_string(tensor.elem_type).replace("TensorProto.", "")
            raise ModelInputError(f"input {info.name} has type {etype.name}; the graph wants "
                                  f"{wanted_type.lower()}")
        dims = [d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim]
        if tensor.HasField("shape") and (len(dims) != array.ndim or any(
                d is not None and d != s for d, s in zip(dims, array.shape))):
            shown = tuple("?" if d is None else d for d in dims)
            raise ModelInputError(f"input {info.name} has shape {array.shape}; the graph wants "
                                  f"{shown}")


def run_model(model, feeds: dict) -> list[DumpedTensor]:
    """Every tensor of one run of `model` (a ModelProto or a path) on `feeds`: the graph
    inputs, the initializers the nodes read, and every node output, in graph order."""
    import onnx
    from onnx.reference import ReferenceEvaluator

    from ._onnx_plugin import onnx_ops

    if not isinstance(model, onnx.ModelProto):
        model = onnx.load(os.fspath(model))
    graph = model.graph
    _check_inputs(graph, feeds)
    results = ReferenceEvaluator(model, new_ops=onnx_ops()).run(None, feeds, intermediate=True)
    dumped: list[DumpedTensor] = []
    seen: set[str] = set()

    def add(name, producer, op_type):
        if name and name not in seen and name in results:
            seen.add(name)
            dumped.append(DumpedTensor(name, np.asarray(results[name]), producer, op_type))

    for info in graph.input:
        add(info.name, "input", "")
    initializers = {t.name for t in graph.initializer}
    for node in graph.node:
        for name in node.input:
            if name in initializers:
                add(name, "initializer", "")
        for name in node.output:
            add(name, node.name or node.output[0], node.op_type)
    return dumped


def _file_stem(name: str, taken: set) -> str:
    # Tensor names may hold '/', ':' or spaces; the manifest maps names to files.
    stem = re.sub(r"[^A-Za-z0-9_.-]", "_", name).strip(".") or "tensor"
    candidate, n = stem, 1
    while candidate.lower() in taken:
        n += 1
        candidate = f"{stem}_{n}"
    taken.add(candidate.lower())
    return candidate


def dump(tensors: list[DumpedTensor], directory: str, write, word_bits: int = writers.DEFAULT_WORD_BITS) -> dict:
    """Each tensor as a typed ONNX TensorProto (.pb) and a $readmemh file (.hex) in
    `directory`, plus manifest.json; `write(path, data)` writes one file."""
    taken: set[str] = set()
    entries = []
    for tensor in tensors:
        stem = _file_stem(tensor.name, taken)
        etype = array_element_type(tensor.array, tensor.name)
        write(os.path.join(directory, stem + ".pb"), writers.tensor_proto_bytes(tensor.array, tensor.name))
        write(os.path.join(directory, stem + ".hex"),
              writers.hex_text(tensor.array, word_bits, tensor.name).encode())
        entries.append({"name": tensor.name, "pb": stem + ".pb", "hex": stem + ".hex",
                        "type": etype.name, "shape": list(tensor.array.shape),
                        "producer": tensor.producer, "op_type": tensor.op_type})
    manifest = {"tensors": entries, "word_bits": word_bits}
    write(os.path.join(directory, MANIFEST), (json.dumps(manifest, indent=1) + "\n").encode())
    return manifest
