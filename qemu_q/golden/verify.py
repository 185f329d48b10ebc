"""Verify a device's (or a runtime's) outputs against a golden suite, bit for bit.

`verify(golden_dir, actual)` reads the suite's manifest.json for each case's outputs (name,
ONNX type, shape) and looks for the actual outputs of every case in ACTUAL:

    ACTUAL/<case>/output_N.pb       ONNX TensorProto
    ACTUAL/<case>/output_N.hex      the suite's own hex layout (docs/golden.md)
    ACTUAL/<case>/outputs.npz       keyed by the output name, expected_<name> or output_N,
                                    arrays in the suite's storage form
    ACTUAL/node/<case>/test_data_set_0/output_N.pb|.hex, ACTUAL/npz/<case>.npz
                                    the suite's own layout (a suite is its own ACTUAL)

or ACTUAL is one file (.pb, .hex, .npy or .npz) of the case named by `case`.

Elements are compared on their storage codes (int4 on its 4 bits, float8 on its 8-bit
code, float32 on its 32 bits), so -0 differs from +0 and every NaN payload counts.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field

import numpy as np

from .._dtypes import ELEMENT_TYPES, ElementType
from . import writers

DEFAULT_MAX_MISMATCHES = 10
STATUSES = ("pass", "fail", "missing")

_OUTPUT_FILE = re.compile(r"output_(\d+)$")
_LOOKED_FOR = ("<case>/output_N.pb", "<case>/output_N.hex", "<case>/outputs.npz",
               f"{writers.NODE_DIR}/<case>/test_data_set_0/output_N.pb",
               f"{writers.NPZ_DIR}/<case>.npz")


@dataclass(frozen=True)
class Mismatch:
    """One element whose bits differ. `expected` / `actual` are the decoded values (int,
    float, or "nan" / "inf" / "-inf"); `ulp` is the distance on the type's own grid (float
    types; None for integers and when either side is NaN)."""

    output: str
    index: int
    multi_index: tuple[int, ...]
    expected_bits: str
    actual_bits: str
    expected: int | float | str
    actual: int | float | str
    ulp: int | None

    def to_dict(self) -> dict:
        return {"output": self.output, "index": self.index,
                "multi_index": list(self.multi_index), "expected_bits": self.expected_bits,
                "actual_bits": self.actual_bits, "expected": self.expected,
                "actual": self.actual, "ulp": self.ulp}

    def __str__(self) -> str:
        ulp = "" if self.ulp is None else f", {self.ulp} ulp"
        return (f"{self.output}[{self.index}] at {self.multi_index}: expected "
                f"{self.expected_bits} ({self.expected}), actual {self.actual_bits} "
                f"({self.actual}){ulp}")


@dataclass
class CaseResult:
    """A case's verdict. `mismatches` holds the first `max_mismatches` differing elements
    over all outputs; `differing` counts them all per output; `errors` says why an output
    could not be compared element by element (absent, wrong type or shape, unreadable)."""

    name: str
    status: str
    mismatches: list[Mismatch] = field(default_factory=list)
    differing: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    source: str | None = None

    def to_dict(self) -> dict:
        return {"name": self.name, "status": self.status,
                "mismatches": [m.to_dict() for m in self.mismatches],
                "differing": dict(self.differing), "errors": list(self.errors),
                "source": self.source}


@dataclass(frozen=True)
class Summary:
    checked: int
    passed: int
    failed: int
    missing: int

    def to_dict(self) -> dict:
        return {"checked": self.checked, "passed": self.passed, "failed": self.failed,
                "missing": self.missing}


@dataclass
class VerifyReport:
    summary: Summary
    cases: list[CaseResult]

    def ok(self, allow_missing: bool = False) -> bool:
        """Every case passed (or, with allow_missing, passed or had no actual output)."""
        return self.summary.failed == 0 and (allow_missing or self.summary.missing == 0)

    def case(self, name: str) -> CaseResult:
        for result in self.cases:
            if result.name == name:
                return result
        raise KeyError(name)

    def names(self, status: str) -> list[str]:
        """The names of the cases with that status ("pass", "fail" or "missing")."""
        if status not in STATUSES:
            raise ValueError(f"status={status!r}; allowed {', '.join(STATUSES)}")
        return [r.name for r in self.cases if r.status == status]

    def to_dict(self) -> dict:
        return {"summary": self.summary.to_dict(), "cases": [r.to_dict() for r in self.cases]}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, allow_nan=False) + "\n"

    def format(self) -> str:
        """The summary line, then each failing and missing case with its mismatches."""
        s = self.summary
        lines = [f"{s.checked} cases checked: {s.passed} passed, {s.failed} failed, "
                 f"{s.missing} missing"]
        for result in self.cases:
            if result.status != "fail":
                continue
            lines.append(f"FAIL {result.name}  ({result.source})")
            lines += [f"  {error}" for error in result.errors]
            for output, count in result.differing.items():
                if count:
                    verb = "elements differ" if count > 1 else "element differs"
                    lines.append(f"  {output}: {count} {verb}")
            lines += [f"    {m}" for m in result.mismatches]
        missing = self.names("missing")
        lines += [f"MISSING {name}" for name in missing]
        if missing:
            lines.append(f"  (no {', '.join(_LOOKED_FOR)} in ACTUAL)")
        return "\n".join(lines)


# --------------------------------------------------------------------------------------
# Codes, values, ulp


def _codes(array: np.ndarray, etype: ElementType) -> np.ndarray:
    """The storage codes of the elements as uint64: the low `bits` bits of each element's
    bytes (ml_dtypes keeps int4 sign-extended in a byte, the small floats in its low bits)."""
    flat = np.ascontiguousarray(array).reshape(-1)
    unsigned = flat.view(np.dtype(f"<u{flat.dtype.itemsize}")).astype(np.uint64)
    return unsigned & np.uint64((1 << etype.bits) - 1)


def _is_float(etype: ElementType) -> bool:
    return etype.kind in ("small_float", "scale_only") or (
        etype.kind == "value" and etype.name != "int32")


def _has_sign_bit(etype: ElementType) -> bool:
    return etype.kind != "scale_only"  # float8e8m0 is exponent only


def _decoded(value, etype: ElementType):
    if not _is_float(etype):
        return int(value)
    number = float(value)
    if math.isnan(number):
        return "nan"
    if math.isinf(number):
        return "inf" if number > 0 else "-inf"
    return number


def _ordinal(code: int, etype: ElementType) -> int:
    """Position of a code on the type's grid: sign-magnitude codes in value order."""
    if not _has_sign_bit(etype):
        return code
    sign = 1 << (etype.bits - 1)
    return -(code & (sign - 1)) if code & sign else code


def _ulp(expected_code: int, actual_code: int, expected, actual, etype: ElementType):
    if not _is_float(etype) or "nan" in (expected, actual):
        return None
    return abs(_ordinal(actual_code, etype) - _ordinal(expected_code, etype))


def compare(name: str, expected: np.ndarray, actual: np.ndarray, etype: ElementType,
            limit: int) -> tuple[int, list[Mismatch]]:
    """(number of differing elements, the first `limit` of them) of two arrays of one
    ONNX type and shape."""
    e_codes, a_codes = _codes(expected, etype), _codes(actual, etype)
    where = np.flatnonzero(e_codes != a_codes)
    digits = -(-etype.bits // 4)
    e_flat, a_flat = expected.reshape(-1), actual.reshape(-1)
    found = []
    for index in where[:limit].tolist():
        e_code, a_code = int(e_codes[index]), int(a_codes[index])
        e_value, a_value = _decoded(e_flat[index], etype), _decoded(a_flat[index], etype)
        multi = tuple(int(i) for i in np.unravel_index(index, expected.shape)) \
            if expected.ndim else ()
        found.append(Mismatch(name, index, multi, f"0x{e_code:0{digits}x}",
                              f"0x{a_code:0{digits}x}", e_value, a_value,
                              _ulp(e_code, a_code, e_value, a_value, etype)))
    return int(where.size), found


# --------------------------------------------------------------------------------------
# Reading tensors


def load_tensor(path: str, type_name: str, shape, word_bits: int | None = None) -> np.ndarray:
    """One tensor of ONNX type `type_name` from a .pb (TensorProto), .hex (the suite's
    layout; the word width from its header, else `word_bits`, else 32) or .npy (storage
    form) file. Raises ValueError when the file holds another type or shape."""
    shape = tuple(shape)
    if path.endswith(".pb"):
        onnx = writers.import_onnx()
        from onnx import numpy_helper

        proto = onnx.load_tensor(path)
        if proto.data_type != ELEMENT_TYPES[type_name].onnx_id:
            raise ValueError(f"{path} holds ONNX data type {proto.data_type}, expected "
                             f"{ELEMENT_TYPES[type_name].onnx_id} ({type_name})")
        array = numpy_helper.to_array(proto)
        array = writers.from_storage(array, type_name)
    elif path.endswith(".hex"):
        with open(path, encoding="ascii") as handle:
            text = handle.read()
        bits = None if "// words:" in text else word_bits
        array = writers.read_hex(text, type_name, shape, bits)
    elif path.endswith(".npy"):
        array = writers.from_storage(np.load(path, allow_pickle=False), type_name)
    else:
        raise ValueError(f"{path}: a tensor file is .pb, .hex or .npy")
    if array.shape != shape:
        raise ValueError(f"{path} has shape {list(array.shape)}, expected {list(shape)}")
    return array


def _npz_outputs(path: str, outputs: list[dict]) -> list[np.ndarray | str]:
    """Each output from an .npz keyed by its name, expected_<name> or output_N: the array,
    or why there is none (a file numpy cannot read fails its case, not the run)."""
    try:
        return _npz_arrays(path, outputs)
    except Exception as error:  # noqa: BLE001 - zipfile, numpy and OS errors of a corrupt file
        return [f"output {index} ({tensor['name']}): cannot read {path}: {type(error).__name__}: {error}"
                for index, tensor in enumerate(outputs)]


def _npz_arrays(path: str, outputs: list[dict]) -> list[np.ndarray | str]:
    found: list[np.ndarray | str] = []
    with np.load(path, allow_pickle=False) as archive:
        for index, tensor in enumerate(outputs):
            keys = (tensor["name"], f"expected_{tensor['name']}", f"output_{index}")
            key = next((k for k in keys if k in archive.files), None)
            if key is None:
                found.append(f"output {index} ({tensor['name']}): {path} has none of the keys "
                             f"{', '.join(keys)}; it has {', '.join(archive.files)}")
                continue
            try:
                array = writers.from_storage(archive[key], tensor["type"])
            except (TypeError, ValueError) as error:
                found.append(f"output {index} ({tensor['name']}): {path}:{key}: {error}")
                continue
            if array.shape != tuple(tensor["shape"]):
                found.append(f"output {index} ({tensor['name']}): {path}:{key} has shape "
                             f"{list(array.shape)}, expected {tensor['shape']}")
                continue
            found.append(array)
    return found


def _read(path: str, tensor: dict, word_bits) -> np.ndarray | str:
    try:
        return load_tensor(path, tensor["type"], tensor["shape"], word_bits)
    except (OSError, TypeError, ValueError) as error:
        return f"{tensor['name']}: {error}"
    except Exception as error:  # noqa: BLE001 - a corrupt .pb raises protobuf's DecodeError
        return f"{tensor['name']}: cannot read {path}: {type(error).__name__}: {error}"


def _from_directory(folder: str, outputs: list[dict], word_bits):
    """The outputs from output_N.pb / output_N.hex files or an outputs.npz in `folder`,
    or None when it holds none of them."""
    stems = [os.path.join(folder, f"output_{i}") for i in range(len(outputs))]
    present = [next((stem + ext for ext in (".pb", ".hex") if os.path.isfile(stem + ext)),
                    None) for stem in stems]
    npz = os.path.join(folder, "outputs.npz")
    if all(p is None for p in present):
        return _npz_outputs(npz, outputs) if os.path.isfile(npz) else None
    return [_read(path, tensor, word_bits) if path else
            f"output {i} ({tensor['name']}): no output_{i}.pb or output_{i}.hex in {folder}"
            for i, (path, tensor) in enumerate(zip(present, outputs))]


def _actual_outputs(actual: str, name: str, outputs: list[dict], word_bits):
    """(where, outputs) of a case in an ACTUAL directory, or (None, None)."""
    for folder in (os.path.join(actual, name),
                   os.path.join(actual, name, "test_data_set_0"),
                   os.path.join(actual, writers.NODE_DIR, name, "test_data_set_0")):
        if os.path.isdir(folder):
            found = _from_directory(folder, outputs, word_bits)
            if found is not None:
                return folder, found
    npz = os.path.join(actual, writers.NPZ_DIR, f"{name}.npz")
    if os.path.isfile(npz):
        return npz, _npz_outputs(npz, outputs)
    return None, None


def _single_file(path: str, outputs: list[dict], word_bits):
    """The outputs held by one file: an .npz may hold them all; a .pb / .hex / .npy file
    is output N when named output_N.*, else output 0; the other outputs are not checked."""
    if path.endswith(".npz"):
        return _npz_outputs(path, outputs)
    match = _OUTPUT_FILE.search(os.path.splitext(os.path.basename(path))[0])
    index = int(match.group(1)) if match else 0
    if index >= len(outputs):
        return [f"{path}: the case has {len(outputs)} outputs, no output {index}"]
    return [None] * index + [_read(path, outputs[index], word_bits)]


def _expected_outputs(golden_dir: str, entry: dict, word_bits) -> list[np.ndarray]:
    """The case's expected outputs from the suite: its .npz when written, else the .pb or
    .hex files (whichever formats the suite has)."""
    if entry.get("npz"):
        _, arrays = writers.read_npz(os.path.join(golden_dir, entry["npz"]))
        return [arrays[t["npz_key"]] for t in entry["outputs"]]
    result = []
    for tensor in entry["outputs"]:
        relative = tensor.get("pb") or tensor.get("hex")
        if relative is None:
            raise ValueError(f"golden suite {golden_dir}: case {entry['name']} has no output "
                             f"files in its manifest")
        result.append(load_tensor(os.path.join(golden_dir, relative), tensor["type"],
                                  tensor["shape"], word_bits))
    return result


# --------------------------------------------------------------------------------------


def read_manifest(golden_dir) -> dict:
    """The suite's manifest.json; ValueError naming the directory when there is none."""
    golden_dir = os.fspath(golden_dir)
    path = os.path.join(golden_dir, writers.MANIFEST)
    if not os.path.isdir(golden_dir):
        raise ValueError(f"golden_dir={golden_dir!r} is not a directory")
    if not os.path.isfile(path):
        raise ValueError(f"golden_dir={golden_dir!r} has no {writers.MANIFEST}: not a suite "
                         f"written by qemu-q golden")
    with open(path, encoding="utf-8") as handle:
        try:
            manifest = json.load(handle)
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
            raise ValueError(f"{path}: not a manifest qemu-q golden writes (not valid JSON: "
                             f"{type(error).__name__}: {error})") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("cases"), list):
        raise ValueError(f"{path}: not a manifest qemu-q golden writes (no list of 'cases')")
    for index, entry in enumerate(manifest["cases"]):
        outputs = entry.get("outputs") if isinstance(entry, dict) else None
        if not (isinstance(entry, dict) and isinstance(entry.get("name"), str) and isinstance(outputs, list)
                and all(isinstance(t, dict) and isinstance(t.get("name"), str) and isinstance(t.get("type"), str)
                        and isinstance(t.get("shape"), list) for t in outputs)):
            raise ValueError(f"{path}: cases[{index}] is not a case qemu-q golden writes (a 'name' and "
                             "'outputs', each with 'name', 'type' and 'shape')")
    return manifest


def verify(golden_dir, actual, *, case: str | None = None,
           max_mismatches: int = DEFAULT_MAX_MISMATCHES) -> VerifyReport:
    """Compare actual outputs with a golden suite bit for bit.

    golden_dir: a directory written by `qemu-q golden` (its manifest.json lists the cases).
    actual: a directory (one subdirectory per case holding output_N.pb, output_N.hex or
        outputs.npz; or the suite's own node/ and npz/ layout), or one file of the case
        named by `case`.
    case: check only this case (required when `actual` is a file).
    max_mismatches: how many differing elements each case reports (all are counted).

    Returns a VerifyReport: `report.ok()` is True when every case passed; `report.format()`
    is the text `qemu-q verify` prints. A case without actual outputs is "missing".
    Raises ValueError for a golden_dir that is no suite, a missing `actual`, an unknown
    case, or a file without `case`; RuntimeError when the suite's own files are unreadable.
    """
    if isinstance(max_mismatches, bool) or not isinstance(max_mismatches, int) \
            or max_mismatches < 0:
        raise ValueError(f"max_mismatches={max_mismatches!r}; allowed: an int >= 0")
    golden_dir, actual = os.fspath(golden_dir), os.fspath(actual)
    manifest = read_manifest(golden_dir)
    entries = manifest["cases"]
    if case is not None:
        chosen = [e for e in entries if e["name"] == case]
        if not chosen:
            example = f", e.g. {entries[0]['name']}" if entries else ""
            raise ValueError(f"case={case!r} is not in "
                             f"{os.path.join(golden_dir, writers.MANIFEST)} "
                             f"({len(entries)} cases{example})")
        entries = chosen
    if os.path.isfile(actual):
        if case is None:
            raise ValueError(f"actual={actual!r} is a file: name its case with case= "
                             f"(--case NAME)")
    elif not os.path.isdir(actual):
        raise ValueError(f"actual={actual!r}: no such file or directory")
    word_bits = manifest.get("word_bits")

    results = []
    for entry in entries:
        if os.path.isfile(actual):
            source, found = actual, _single_file(actual, entry["outputs"], word_bits)
        else:
            source, found = _actual_outputs(actual, entry["name"], entry["outputs"], word_bits)
        if found is None:
            results.append(CaseResult(entry["name"], "missing"))
            continue
        try:
            expected = _expected_outputs(golden_dir, entry, word_bits)
        except (OSError, TypeError, ValueError) as error:  # the suite, not the call, is bad
            raise RuntimeError(f"golden suite {golden_dir}, case {entry['name']}: {error}") \
                from error
        result = CaseResult(entry["name"], "pass", source=source)
        for tensor, want, got in zip(entry["outputs"], expected, found):
            if got is None:
                continue
            if isinstance(got, str):
                result.errors.append(got)
                continue
            count, mismatches = compare(tensor["name"], want, got, ELEMENT_TYPES[tensor["type"]],
                                        max_mismatches - len(result.mismatches))
            result.differing[tensor["name"]] = count
            result.mismatches += mismatches
        if result.errors or any(result.differing.values()):
            result.status = "fail"
        results.append(result)
    summary = Summary(len(results), sum(r.status == "pass" for r in results),
                      sum(r.status == "fail" for r in results),
                      sum(r.status == "missing" for r in results))
    return VerifyReport(summary, results)
