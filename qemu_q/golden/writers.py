"""Writers for golden cases: ONNX node-test folders, .npz archives and Verilog hex files.

Every writer returns bytes (the caller decides where they go), and the same case always
gives the same bytes: no timestamps, fixed ordering, fixed zip member dates.

onnx is imported only by the ONNX writer, so the rest works without it.
"""

from __future__ import annotations

import io
import json
import math
import zipfile

import numpy as np

from .._dtypes import ELEMENT_TYPES, ElementType, array_element_type, element_type
from .._pack import pack, unpack
from ..codecs import check_codes
from .datapaths import datapath_fields
from .runtimes import runs_on

ONNX_MISSING = "the onnx format needs the onnx package: pip install qemu_q[onnx]"
WORD_BITS = (8, 16, 32, 64)
DEFAULT_WORD_BITS = 32


class MissingDependency(RuntimeError):
    pass


def import_onnx():
    try:
        import onnx
    except ImportError:
        raise MissingDependency(ONNX_MISSING) from None
    return onnx


# --------------------------------------------------------------------------------------
# Storage form: arrays numpy itself can save and load


_NUMPY_NATIVE = frozenset((
    "float", "float16", "int8", "uint8", "int16", "uint16", "int32", "double", "int64", "uint32",
    "uint64", "bool"))


def numpy_native(etype: ElementType) -> bool:
    """Whether numpy itself has the type (a .npy of it says what it holds)."""
    return etype.name in _NUMPY_NATIVE


def storage_dtype(etype: ElementType) -> np.dtype:
    """The plain numpy dtype `to_storage` stores `etype` as."""
    if numpy_native(etype):
        return etype.dtype
    if etype.kind == "integer":
        return np.dtype(np.int8 if etype.lo < 0 else np.uint8)
    return etype.storage


def to_storage(array: np.ndarray) -> np.ndarray:
    """An array of plain numpy dtype holding `array` as .npy/.npz can store it.

    Types numpy has are returned as they are. int4/int2 become int8 values and
    uint4/uint2 uint8 values; bfloat16 becomes its uint16 bit patterns and the small float
    types (float8, float6, float4, float8e8m0) their uint8 codes.
    """
    etype = array_element_type(array, "array")
    if numpy_native(etype):
        return array
    if etype.kind == "integer":
        return array.astype(storage_dtype(etype))
    return np.ascontiguousarray(array).view(etype.storage)


def from_storage(array: np.ndarray, type_name: str) -> np.ndarray:
    """Inverse of `to_storage`: the array as `type_name` (an ONNX type name)."""
    etype = ELEMENT_TYPES[type_name]
    if array.dtype == etype.dtype:
        return array
    if etype.kind == "integer":
        if array.dtype.kind not in "iu":
            raise TypeError(f"{type_name} values must be stored as integers, got {array.dtype}")
        wide = array.astype(np.int64)
        if wide.size and (wide.min() < etype.lo or wide.max() > etype.hi):
            raise ValueError(f"values out of the {type_name} range [{etype.lo}, {etype.hi}]")
        return wide.astype(etype.dtype)
    if array.dtype.itemsize != etype.storage.itemsize or array.dtype.kind not in "uiV":
        raise TypeError(
            f"{type_name} is stored as its {etype.storage} bit patterns, got {array.dtype}")
    codes = np.ascontiguousarray(array).view(etype.storage)
    # a float4 / float6 byte with bits above the code is no code of the type (the kernels
    # would read its low bits, another code): refused as an int4 value out of range is
    check_codes(codes, etype, f"stored {type_name} codes", "the array")
    return codes.view(etype.dtype)


def tensor_type(array: np.ndarray) -> ElementType:
    return array_element_type(array, "tensor")


# --------------------------------------------------------------------------------------
# hex


def _packing_note(etype: ElementType) -> str:
    if etype.bits == 4:
        return "2 per byte, element 0 in bits 3:0"
    if etype.bits == 2:
        return "4 per byte, element 0 in bits 1:0"
    if etype.bits == 6:
        return "LSB-first bit stream, element i in bits 6i+5:6i"
    if etype.bits == 8:
        return "1 per byte"
    return f"{etype.bits // 8} bytes each, little-endian"


def hex_text(array: np.ndarray, word_bits: int = DEFAULT_WORD_BITS, name: str = "") -> str:
    """A $readmemh file of the tensor's ONNX raw_data bytes, little-endian words.

    Byte 0 of the stream is bits 7:0 of word 0; the last word is zero-padded. `//`
    comment lines at the top give the tensor's name, type, shape, element count and
    packing.
    """
    if word_bits not in WORD_BITS:
        raise ValueError(f"word_bits={word_bits}; allowed {', '.join(map(str, WORD_BITS))}")
    etype = tensor_type(array)
    data = pack(array).tobytes()
    word_bytes = word_bits // 8
    n_words = -(-len(data) // word_bytes)
    padded = data + bytes(n_words * word_bytes - len(data))
    digits = word_bits // 4
    lines = [
        f"// tensor: {name}",
        f"// type: {etype.name} (ONNX data type {etype.onnx_id}, {etype.bits} bits)",
        f"// shape: [{', '.join(str(d) for d in array.shape)}]",
        f"// elements: {array.size}",
        f"// packing: {_packing_note(etype)}; {len(data)} bytes",
        f"// words: {n_words} x {word_bits} bits, little-endian, last one zero-padded",
    ]
    for w in range(n_words):
        chunk = padded[w * word_bytes:(w + 1) * word_bytes]
        lines.append(format(int.from_bytes(chunk, "little"), f"0{digits}x"))
    return "\n".join(lines) + "\n"


def _hex_lines(text: str) -> tuple[dict[str, str], list[str]]:
    """The `//` header of a file from `hex_text` as {key: value}, and its words."""
    words, header = [], {}
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("//"):
            key, _, value = line[2:].partition(":")
            header[key.strip()] = value.strip()
            continue
        if line:
            words.append(line)
    return header, words


def hex_type_and_shape(text: str) -> tuple[str, tuple[int, ...]]:
    """The type name and shape a file from `hex_text` declares in its header."""
    header, _ = _hex_lines(text)
    try:
        type_name = header["type"].split()[0]
        dims = header["shape"].strip("[]").replace(",", " ").split()
        return type_name, tuple(int(d) for d in dims)
    except (KeyError, IndexError, ValueError):
        raise ValueError("no '// type:' and '// shape:' header lines (as qemu-q writes them)") \
            from None


def read_hex(text: str, type_name: str, shape, word_bits: int | None = None) -> np.ndarray:
    """Parse a file from `hex_text` back into an array of `type_name` and `shape` (for
    verify, the CLI's inputs, tests and users' tooling). The file must be exactly that: a
    `// type:` or `// shape:` header line that says otherwise, a word count other than the
    tensor's, a word wider than its width, or a nonzero padding byte is a ValueError."""
    header, words = _hex_lines(text)
    if type_name not in ELEMENT_TYPES:
        raise ValueError(f"type {type_name!r} is not an ONNX type qemu-q writes")
    etype = ELEMENT_TYPES[type_name]
    shape = tuple(int(d) for d in shape)
    if "type" in header or "shape" in header:
        declared_type, declared_shape = hex_type_and_shape(text)
        if (declared_type, declared_shape) != (type_name, shape):
            raise ValueError(f"the header declares {declared_type} {list(declared_shape)}, expected "
                             f"{type_name} {list(shape)}")
    if word_bits is None and "words" in header:
        fields = header["words"].split()
        if len(fields) < 4 or fields[1] != "x" or not fields[2].isdigit() or int(fields[2]) not in WORD_BITS:
            raise ValueError(f"'// words: {header['words']}': expected '<count> x <bits> bits' with bits "
                             f"one of {', '.join(map(str, WORD_BITS))}")
        word_bits = int(fields[2])
    word_bits = 32 if word_bits is None else word_bits
    word_bytes = word_bits // 8
    count = math.prod(shape)
    size = (count * etype.bits + 7) // 8
    if len(words) != -(-size // word_bytes):
        raise ValueError(f"{len(words)} words; {count} elements of {type_name} take "
                         f"{-(-size // word_bytes)} words of {word_bits} bits")
    chunks = []
    for line in words:
        if len(line) > word_bits // 4 or any(c not in "0123456789abcdefABCDEF" for c in line):
            raise ValueError(f"word {line!r}: expected at most {word_bits // 4} hex digits")
        chunks.append(int(line, 16).to_bytes(word_bytes, "little"))
    data = b"".join(chunks)
    if any(data[size:]):
        raise ValueError(f"the padding after the {size} data bytes is not zero")
    return unpack(data[:size], type_name, shape)


# --------------------------------------------------------------------------------------
# npz

_ZIP_DATE = (1980, 1, 1, 0, 0, 0)


def npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    """An uncompressed .npz of `arrays` (in the given order) with fixed member dates, so
    that the same arrays give the same bytes (np.savez stamps the current time)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_STORED) as archive:
        for key, array in arrays.items():
            member = io.BytesIO()
            np.lib.format.write_array(member, np.asanyarray(array), allow_pickle=False)
            info = zipfile.ZipInfo(f"{key}.npy", date_time=_ZIP_DATE)
            info.external_attr = 0o644 << 16
            archive.writestr(info, member.getvalue())
    return buffer.getvalue()


def typed_npz(groups, meta: dict) -> bytes:
    """An .npz of tensors in storage form (`to_storage`) with `meta`, a JSON string (a 0-d
    bytes array: `json.loads(npz["meta"].item())`) holding `meta`'s keys and `tensors`:
    every tensor's key, name, role, index, ONNX type and shape. `groups` is a sequence
    of (role, key prefix, [(name, array)]). `read_npz` reads it back in the ONNX types."""
    arrays: dict[str, np.ndarray] = {}
    tensors = []
    for role, prefix, items in groups:
        for index, (name, array) in enumerate(items):
            key = f"{prefix}{name}"
            arrays[key] = to_storage(array)
            tensors.append({"key": key, "name": name, "role": role, "index": index,
                            "type": tensor_type(array).name, "shape": list(array.shape)})
    arrays["meta"] = np.array(json.dumps(meta | {"tensors": tensors},
                                         separators=(",", ":")).encode())
    return npz_bytes(arrays)


def case_npz(case) -> bytes:
    """The case as an .npz (`typed_npz`): inputs under their ONNX names, expected outputs
    under `expected_<name>`, and in `meta` also the op, opset and attributes, and the
    datapath's fields where it is not the ONNX default (the file says what made its bits;
    an ONNX suite's files are as before)."""
    meta = {"name": case.name, "op_type": case.op_type, "opset": case.opset,
            "attributes": case.attributes}
    if not case.datapath.is_onnx:
        meta["datapath"] = datapath_fields(case.datapath)
    return typed_npz((("input", "", case.inputs), ("output", "expected_", case.outputs),
                      ("extra", "extra_", case.extras)), meta)


def read_npz(path_or_file) -> tuple[dict, dict[str, np.ndarray]]:
    """(meta, arrays) of an .npz written by `typed_npz` (a case .npz, or the output of
    `qemu-q quantize -o y.npz`), arrays in their ONNX types."""
    with np.load(path_or_file, allow_pickle=False) as archive:
        meta = json.loads(archive["meta"].item().decode())
        arrays = {t["key"]: from_storage(archive[t["key"]], t["type"]) for t in meta["tensors"]}
    return meta, arrays


# --------------------------------------------------------------------------------------
# ONNX


def tensor_proto_bytes(array: np.ndarray, name: str) -> bytes:
    """A serialized TensorProto holding the array as raw_data (sub-byte types packed)."""
    onnx = import_onnx()
    etype = tensor_type(array)
    tensor = onnx.TensorProto()
    tensor.name = name
    tensor.data_type = etype.onnx_id
    tensor.dims.extend(int(d) for d in array.shape)
    tensor.raw_data = pack(array).tobytes()
    return tensor.SerializeToString(deterministic=True)


def read_tensor_proto(data: bytes) -> np.ndarray:
    """The array of a serialized TensorProto, in its ONNX type (`tensor_proto_bytes`
    writes raw_data; typed fields, as other tools may write, go through onnx's reader)."""
    onnx = import_onnx()
    tensor = onnx.TensorProto()
    tensor.ParseFromString(data)
    etype = element_type(tensor.data_type, "the TensorProto's data_type")
    if tensor.HasField("raw_data"):
        return unpack(tensor.raw_data, etype.name, tuple(tensor.dims))
    from onnx import numpy_helper

    return np.asarray(numpy_helper.to_array(tensor)).astype(etype.dtype)


def model_proto(case):
    """The single-node ModelProto of a case: opset `case.opset`, the smallest IR version
    that supports it, inputs and outputs typed and shaped as the case's tensors."""
    onnx = import_onnx()
    helper = onnx.helper
    if case.model_builder is not None:  # a dequantize graph (MX, NVFP4)
        model = case.model_builder()
        model.graph.name = case.name
        model.producer_name = "qemu_q"
        model.ir_version = helper.find_min_ir_version_for(list(model.opset_import))
        return model

    def value_info(name, array):
        return helper.make_tensor_value_info(name, tensor_type(array).onnx_id, list(array.shape))

    node = helper.make_node(
        case.op_type,
        inputs=[name for name, _ in case.inputs],
        outputs=[name for name, _ in case.outputs],
        **case.attributes,
    )
    graph = helper.make_graph(
        [node], case.name,
        inputs=[value_info(n, a) for n, a in case.inputs],
        outputs=[value_info(n, a) for n, a in case.outputs],
    )
    opset = [helper.make_opsetid("", case.opset)]
    model = helper.make_model(graph, opset_imports=opset, producer_name="qemu_q")
    model.ir_version = helper.find_min_ir_version_for(opset)
    return model


def model_bytes(case) -> bytes:
    return model_proto(case).SerializeToString(deterministic=True)


# --------------------------------------------------------------------------------------
# A whole suite on disk

FORMATS = ("onnx", "npz", "hex")
NODE_DIR = "node"  # as onnx/backend/test/data/node: onnx.backend.test.loader can read it
NPZ_DIR = "npz"
MANIFEST = "manifest.json"


def available_formats() -> tuple[str, ...]:
    try:
        import_onnx()
    except MissingDependency:
        return tuple(f for f in FORMATS if f != "onnx")
    return FORMATS


def case_files(case, formats, word_bits: int = DEFAULT_WORD_BITS):
    """(relative path, bytes) of every file of the case, and its manifest entry."""
    files: list[tuple[str, bytes]] = []
    if "onnx" in formats and not case.onnx_expressible:
        raise ValueError(f"{case.name}: no ONNX model computes a case under a non-default "
                         "datapath; write it as npz and hex (formats without onnx)")
    case_dir = f"{NODE_DIR}/{case.name}"
    data_dir = f"{case_dir}/test_data_set_0"
    if "onnx" in formats:
        files.append((f"{case_dir}/model.onnx", model_bytes(case)))

    def tensors(role, items):
        entries = []
        for index, (name, array) in enumerate(items):
            etype = tensor_type(array)
            entry = {"name": name, "type": etype.name, "onnx_type": etype.onnx_id,
                     "shape": [int(d) for d in array.shape]}
            stem = f"{data_dir}/{role}_{index}"
            if "onnx" in formats and role != "extra":  # not a node output: no .pb
                files.append((f"{stem}.pb", tensor_proto_bytes(array, name)))
                entry["pb"] = f"{stem}.pb"
            if "hex" in formats:
                files.append((f"{stem}.hex", hex_text(array, word_bits, name).encode()))
                entry["hex"] = f"{stem}.hex"
            if "npz" in formats:
                entry["npz_key"] = {"input": name, "output": f"expected_{name}",
                                    "extra": f"extra_{name}"}[role]
            entries.append(entry)
        return entries

    config = case.config
    entry = {
        "name": case.name,
        "op_type": case.op_type,
        "domain": "",
        "opset": case.opset,
        "since_version": config.version,
        "quantized_type": config.qtype,
        "family": config.family,
        "variant": config.variant,
        "granularity": config.granularity,
        "attributes": dict(case.attributes),
        "inputs": tensors("input", case.inputs),
        "outputs": tensors("output", case.outputs),
        "extras": tensors("extra", case.extras),
        "onnx_dir": case_dir if "onnx" in formats else None,
        "npz": None,
        "divergence": case.divergence,
        "divergences": [{"heading": h, "implementations": list(who)}
                        for h, who in case.divergences],
        # A non-default datapath: no runtime computes these bits from an ONNX model.
        "runs_on": runs_on(config) if case.onnx_expressible else [],
    }
    if "npz" in formats:
        path = f"{NPZ_DIR}/{case.name}.npz"
        files.append((path, case_npz(case)))
        entry["npz"] = path
    return files, entry


def manifest_bytes(header: dict, entries: list[dict]) -> bytes:
    """manifest.json: the header's keys, `case_count`, and `cases`, one case per line."""
    def dump(value):
        return json.dumps(value, separators=(", ", ": "), ensure_ascii=True)

    lines = ["{"]
    for key, value in header.items():
        lines.append(f" {dump(key)}: {dump(value)},")
    lines.append(f' "case_count": {len(entries)},')
    lines.append(' "cases": [')
    lines += [f"  {dump(entry)}," for entry in entries[:-1]]
    lines += [f"  {dump(entry)}" for entry in entries[-1:]]
    lines += [" ]", "}"]
    return ("\n".join(lines) + "\n").encode()
