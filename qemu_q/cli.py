"""The `qemu-q` command line: golden vectors, quantize / dequantize on files, op specs.

    qemu-q golden --out DIR           the conformance suite (docs/golden.md)
    qemu-q quantize X SCALE [ZP]      QuantizeLinear on .npy / .npz arrays
    qemu-q dequantize X SCALE [ZP]    DequantizeLinear on .npy / .npz arrays
    qemu-q spec OP [--opset N]        the op-spec entry a model at that opset runs
    qemu-q verify GOLDEN_DIR ACTUAL   compare outputs with a golden suite, bit for bit

Errors are one line on stderr; the exit code is 2 for a usage error and 1 for a failure.
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import sys
import tempfile
import time

import numpy as np

PROG = "qemu-q"


class UsageError(Exception):
    """A bad command line: exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, not argparse's usage block
        raise UsageError(f"{self.prog}: {message} (see {self.prog} --help)")


def _csv(value: str) -> list[str]:
    return [part.strip() for part in value.split(",") if part.strip()]


class _CsvAppend(argparse.Action):
    """--opt a,b --opt c  ->  [a, b, c]"""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, (getattr(namespace, self.dest) or []) + _csv(values))


def _int(text: str) -> int:
    try:
        return int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def _op_names() -> str:
    """The ops and their short names, for help texts: from the spec table's aliases."""
    from ._opspec import OP_ALIASES

    return ", ".join(f"{op} ({', '.join(aliases)})" if aliases else op
                     for op, aliases in OP_ALIASES.items())


def _precision_names() -> str:
    from ._opspec import PRECISION_TYPES

    return ", ".join(f"{name} ({code})" for code, name in PRECISION_TYPES.items())


def _build_parser() -> argparse.ArgumentParser:
    from . import __version__
    from ._opspec import NEWEST_OPSET

    parser = _Parser(
        prog=PROG,
        description="Bit-exact ONNX QuantizeLinear / DequantizeLinear emulation and golden "
                    "test vectors.",
        epilog="Run 'qemu-q COMMAND --help' for a command's options. Docs: docs/golden.md.",
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    g = commands.add_parser(
        "golden", help="generate the golden-vector suite",
        description="Generate golden test vectors: ONNX node-test folders (model.onnx, "
                    "test_data_set_0/input_N.pb, output_N.pb), .npz archives and Verilog "
                    "$readmemh hex files, with manifest.json. Same options and seed give "
                    "byte-identical files.",
        epilog="Example: qemu-q golden --out golden --op dq --opset 21 --type int4,uint4",
    )
    g.add_argument("--out", "-o", metavar="DIR", help="output directory (not needed with --list)")
    g.add_argument("--op", action=_CsvAppend, metavar="OP",
                   help=f"ops to include: {_op_names()}; repeat or comma-separate")
    g.add_argument("--opset", action=_CsvAppend, metavar="N",
                   help="opsets to include; each selects, per op, the version a model at "
                        f"that opset runs (10..{NEWEST_OPSET})")
    g.add_argument("--type", action=_CsvAppend, metavar="TYPE",
                   help="quantized types to include (QuantizeLinear's output, "
                        "DequantizeLinear's input), e.g. int4,float8e4m3fn")
    g.add_argument("--granularity", action=_CsvAppend, metavar="G",
                   help="per_tensor, per_axis, blocked")
    g.add_argument("--family", action=_CsvAppend, metavar="F",
                   help="input families, e.g. grid,codes,random (docs/golden.md)")
    g.add_argument("--seed", type=_int, default=0, help="seed of the random tensors (default 0)")
    g.add_argument("--size", type=_int, default=64, metavar="N",
                   help="element count of the random tensors (default 64)")
    g.add_argument("--format", action=_CsvAppend, metavar="FMT",
                   help="onnx, npz, hex (default: all that are available; onnx needs the "
                        "onnx package)")
    g.add_argument("--word-bits", type=_int, default=32, choices=(8, 16, 32, 64),
                   metavar="{8,16,32,64}", help="hex word width in bits (default 32)")
    g.add_argument("--force", action="store_true",
                   help="replace a suite already in DIR (its manifest.json, node/ and npz/)")
    g.add_argument("--list", action="store_true",
                   help="print the selected case names (and divergences) and write nothing")

    for name, (scale, zp) in {"quantize": ("y_scale", "y_zero_point"),
                              "dequantize": ("x_scale", "x_zero_point")}.items():
        op = "QuantizeLinear" if name == "quantize" else "DequantizeLinear"
        p = commands.add_parser(
            name, help=f"apply {op} to arrays in .npy / .npz files",
            description=f"Apply {op} to arrays read from .npy files or .npz members "
                        f"(FILE.npz:KEY), or from a golden case .npz (--npz). Types numpy "
                        f"lacks (int4, float8...) are read and written in storage form: "
                        f"sub-byte integers as int8/uint8 values, bfloat16 and the small "
                        f"floats as their bit patterns; --x-type etc. say how to read them.",
            epilog=f"Example: qemu-q {name} x.npy scale.npy zp.npy --axis 0 -o y.npy",
        )
        p.add_argument("x", nargs="?", metavar="X", help="x: FILE.npy or FILE.npz:KEY")
        p.add_argument("scale", nargs="?", metavar="SCALE", help=f"{scale}")
        p.add_argument("zero_point", nargs="?", metavar="ZERO_POINT",
                       help=f"{zp} (optional)")
        p.add_argument("--npz", metavar="FILE",
                       help="take the inputs (and, unless given, the attributes and opset) "
                            "from a golden case .npz or any .npz keyed by the ONNX input names")
        p.add_argument("--x-type", metavar="TYPE", help="ONNX type of x's stored array")
        p.add_argument("--scale-type", metavar="TYPE", help="ONNX type of the scale's array")
        p.add_argument("--zero-point-type", metavar="TYPE",
                       help="ONNX type of the zero point's array")
        p.add_argument("--cast", metavar="ROLE=TYPE", action="append", default=[],
                       help="convert a float64 input (x, scale or zero_point) to float or "
                            "float16 first, rounding to nearest even: e.g. --cast x=float")
        p.add_argument("--opset", type=_int, help=f"opset (default {NEWEST_OPSET})")
        p.add_argument("--axis", type=_int, help="axis attribute (default 1)")
        p.add_argument("--block-size", type=_int, help="block_size attribute (default 0)")
        p.add_argument("--output-dtype", metavar="TYPE",
                       help="output_dtype attribute: a type name or ONNX data-type number")
        if name == "quantize":
            p.add_argument("--saturate", type=_int, choices=(0, 1),
                           help="saturate attribute for float8 outputs (default 1)")
            p.add_argument("--precision", metavar="TYPE",
                           help=f"precision attribute: {_precision_names()}")
        p.add_argument("--out", "-o", metavar="FILE",
                       help="write y here (.npy, storage form); without it, print y")

    s = commands.add_parser(
        "spec", help="print the op-spec entry of an op",
        description="Print the resolved op-spec entry: the version a model at --opset runs, "
                    "its inputs, outputs, attributes, type constraints and rules.",
        epilog="Example: qemu-q spec QuantizeLinear --opset 21",
    )
    s.add_argument("op", metavar="OP", help=_op_names())
    s.add_argument("--opset", type=_int, help=f"opset (default {NEWEST_OPSET})")

    v = commands.add_parser(
        "verify", help="compare actual outputs with a golden suite, bit for bit",
        description="Compare each case's actual outputs with the golden suite bit for bit "
                    "and print a summary and, per failing case, the first mismatching "
                    "elements. ACTUAL is a directory with one subdirectory per case holding "
                    "output_N.pb, output_N.hex or outputs.npz (a suite's own node/ and npz/ "
                    "layout also works), or one file with --case. Exit 0 when every case "
                    "passes, 1 otherwise.",
        epilog="Example: qemu-q verify golden dut_out --allow-missing --json report.json",
    )
    v.add_argument("golden_dir", metavar="GOLDEN_DIR", help="a suite written by qemu-q golden")
    v.add_argument("actual", metavar="ACTUAL", help="the outputs to check: a directory or a file")
    v.add_argument("--case", metavar="NAME", help="check only this case (needed when ACTUAL "
                                                  "is a file)")
    v.add_argument("--allow-missing", action="store_true",
                   help="cases without actual outputs do not fail the run")
    v.add_argument("--json", metavar="FILE", help="also write the report as JSON")
    v.add_argument("--max-mismatches", type=_int, default=10, metavar="N",
                   help="mismatching elements shown per case (default 10)")
    return parser


# --------------------------------------------------------------------------------------
# golden


class _Progress:
    """A progress bar on stderr when it is a terminal; nothing otherwise."""

    def __init__(self, total: int, stream=None):
        self.stream = stream or sys.stderr
        self.total = total
        self.enabled = total > 0 and hasattr(self.stream, "isatty") and self.stream.isatty()
        self.last = -1.0

    def update(self, done: int) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if done != self.total and now - self.last < 0.1:
            return
        self.last = now
        width = 30
        filled = width * done // self.total
        self.stream.write(f"\r{PROG} golden [{'#' * filled}{'.' * (width - filled)}] "
                          f"{done}/{self.total} cases")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\r\033[K")
            self.stream.flush()


def _selection(args):
    from .golden import Selection

    opsets = None
    if args.opset:
        try:
            opsets = tuple(int(v, 0) for v in args.opset)
        except ValueError:
            raise UsageError(f"{PROG} golden: --opset takes integers, got "
                             f"{','.join(args.opset)}") from None
    try:
        return Selection(
            ops=tuple(args.op) if args.op else None,
            opsets=opsets,
            types=tuple(args.type) if args.type else None,
            granularities=tuple(args.granularity) if args.granularity else None,
            families=tuple(args.family) if args.family else None,
        )
    except (ValueError, TypeError) as error:
        raise UsageError(f"{PROG} golden: {error}") from None


def _formats(args) -> tuple[str, ...]:
    from .golden import writers

    if not args.format:
        found = writers.available_formats()
        if "onnx" not in found and not args.list:
            print(f"{PROG} golden: onnx is not installed, writing npz and hex only "
                  f"(pip install qemu_q[onnx] for ONNX folders)", file=sys.stderr)
        return found
    unknown = [f for f in args.format if f not in writers.FORMATS]
    if unknown:
        raise UsageError(f"{PROG} golden: unknown format {unknown[0]!r}; known: "
                         f"{', '.join(writers.FORMATS)}")
    if "onnx" in args.format:
        writers.import_onnx()  # raises MissingDependency with the one-line message
    return tuple(f for f in writers.FORMATS if f in args.format)


def _prepare_out(out: str, force: bool) -> None:
    from .golden import writers

    if os.path.exists(out) and not os.path.isdir(out):
        raise RuntimeError(f"--out {out} exists and is not a directory")
    if os.path.isdir(out) and os.listdir(out):
        if not force:
            raise RuntimeError(f"--out {out} is not empty; use --force to replace the suite "
                               f"there (its {writers.MANIFEST}, {writers.NODE_DIR}/ and "
                               f"{writers.NPZ_DIR}/)")
        for name in (writers.NODE_DIR, writers.NPZ_DIR):
            shutil.rmtree(os.path.join(out, name), ignore_errors=True)
        manifest = os.path.join(out, writers.MANIFEST)
        if os.path.exists(manifest):
            os.remove(manifest)
    os.makedirs(out, exist_ok=True)


def _write_file(path: str, data: bytes) -> None:
    """Write `data` to `path` whole or not at all: into a temporary name beside it, then
    renamed over it, so that an interrupted or failed write (Ctrl-C, a full disk) leaves
    no empty or truncated file under the real name."""
    directory = os.path.dirname(path) or "."
    handle = tempfile.NamedTemporaryFile(dir=directory, prefix=".qemu-q-", suffix=".tmp", delete=False)
    try:
        with handle:
            handle.write(data)
        os.replace(handle.name, path)
    except BaseException:
        try:
            os.unlink(handle.name)
        except OSError:
            pass
        raise


def _write(root: str, relative: str, data: bytes, made: set) -> None:
    directory = os.path.dirname(relative)
    if directory not in made:
        os.makedirs(os.path.join(root, directory), exist_ok=True)
        made.add(directory)
    _write_file(os.path.join(root, relative), data)


def _format_bytes(n: int) -> str:
    if n < 1000:
        return f"{n} bytes"
    for unit in ("KB", "MB"):
        n /= 1000
        if n < 1000:
            return f"{n:.1f} {unit}"
    return f"{n / 1000:.1f} GB"


def cmd_golden(args) -> int:
    from . import __version__, golden
    from .golden import writers

    start = time.monotonic()
    selection = _selection(args)
    if args.size < 1:
        raise UsageError(f"{PROG} golden: --size must be >= 1, got {args.size}")
    configs = list(golden.iter_configs(selection))
    if not configs:
        raise UsageError(f"{PROG} golden: the options select no case")
    if args.list:
        # A reader that stops early (`| head`) ends the listing, not with a traceback.
        for config in configs:
            divergences = golden.divergences_of(config)
            note = f"  [divergence: {divergences[0][0]}]" if divergences else ""
            print(f"{config.name}{note}")
        return 0
    if not args.out:
        raise UsageError(f"{PROG} golden: --out DIR is required (except with --list)")
    formats = _formats(args)
    _prepare_out(args.out, args.force)
    header = {
        "qemu_q_version": __version__,
        "seed": args.seed,
        "size": args.size,
        "formats": list(formats),
        "word_bits": args.word_bits if "hex" in formats else None,
        "selection": {
            "op": args.op, "opset": args.opset, "type": args.type,
            "granularity": args.granularity, "family": args.family,
        },
        "layout": {"onnx": f"{writers.NODE_DIR}/<name>/model.onnx, "
                           f"{writers.NODE_DIR}/<name>/test_data_set_0/{{input,output}}_N.pb",
                   "hex": "beside each tensor's .pb, same stem",
                   "npz": f"{writers.NPZ_DIR}/<name>.npz"},
    }
    progress = _Progress(len(configs))
    entries, n_files, n_bytes, made = [], 0, 0, set()
    try:
        for done, config in enumerate(configs, 1):
            case = golden.build_case(config, args.seed, args.size)
            files, entry = writers.case_files(case, formats, args.word_bits)
            for relative, data in files:
                _write(args.out, relative, data, made)
                n_bytes += len(data)
            n_files += len(files)
            entries.append(entry)
            progress.update(done)
    finally:
        progress.close()
    manifest = writers.manifest_bytes(header, entries)
    _write(args.out, writers.MANIFEST, manifest, made)
    n_files += 1
    n_bytes += len(manifest)
    n_divergent = sum(1 for e in entries if e["divergence"])
    seconds = time.monotonic() - start
    print(f"{PROG} golden: {len(entries)} cases ({n_divergent} marked as divergences), "
          f"{n_files} files, {_format_bytes(n_bytes)}, {seconds:.1f} s -> {args.out}")
    return 0


# --------------------------------------------------------------------------------------
# quantize / dequantize


def _load_array(spec: str, role: str) -> np.ndarray:
    path, key = spec, None
    if ":" in spec and not os.path.exists(spec):
        path, _, key = spec.rpartition(":")
    if not os.path.exists(path):
        raise RuntimeError(f"{role}: no such file {path}")
    try:
        if path.endswith(".npz") or key is not None:
            with np.load(path, allow_pickle=False) as archive:
                if key is None:
                    if len(archive.files) != 1:
                        raise RuntimeError(
                            f"{role}: {path} holds {len(archive.files)} arrays "
                            f"({', '.join(archive.files)}); name one as {path}:KEY")
                    key = archive.files[0]
                if key not in archive.files:
                    raise RuntimeError(f"{role}: {path} has no array {key!r}; it has "
                                       f"{', '.join(archive.files)}")
                return archive[key]
        return np.load(path, allow_pickle=False)
    except (ValueError, OSError) as error:
        raise RuntimeError(f"{role}: cannot read {spec}: {error}") from None


def _typed(array: np.ndarray, type_name: str | None, role: str) -> np.ndarray:
    from ._dtypes import element_type
    from .golden.writers import from_storage

    option = f"--{role.replace('_', '-')}-type"
    if type_name is None:
        try:
            element_type(array.dtype)
        except (TypeError, ValueError):
            raise UsageError(
                f"{PROG}: {role}: arrays of dtype {array.dtype} are no ONNX type; say which type "
                f"the array holds with {option}, or convert the file (e.g. float64 values with "
                f"--cast {option.lstrip('-').replace('-type', '')}=float, rounding to nearest even)") from None
        return array
    try:
        etype = element_type(type_name, option)
    except (TypeError, ValueError) as error:
        raise UsageError(f"{PROG}: {error}") from None
    if array.dtype == np.float64 and etype.kind == "value":
        raise UsageError(f"{PROG}: {role}: the file holds float64 values, not {etype.name}; "
                         f"convert them with --cast {role}={etype.name if etype.name != 'bfloat16' else 'float'} "
                         f"(rounding to nearest even)")
    return from_storage(array, etype.name)


# The types --cast converts to: numpy rounds float64 to these directly, to nearest even.
_CAST_TYPES = {"float": np.float32, "float32": np.float32, "float16": np.float16}


def _apply_casts(values, roles, casts, command):
    """The inputs with --cast ROLE=TYPE applied: float64 arrays rounded once (nearest even)
    to float32 or float16, which the ops take; the types ONNX has no float64 input for."""
    values = list(values)
    for text in casts:
        role, _, type_name = text.partition("=")
        role = role.strip().replace("-", "_")
        if role not in roles or type_name.strip() not in _CAST_TYPES:
            raise UsageError(f"{PROG} {command}: --cast {text!r}; expected ROLE=TYPE with ROLE "
                             f"one of {', '.join(roles)} and TYPE one of float, float16")
        index = roles.index(role)
        if values[index] is None:
            raise UsageError(f"{PROG} {command}: --cast {text!r}: no {role} given")
        if values[index].dtype != np.float64:
            raise UsageError(f"{PROG} {command}: --cast {text!r}: {role} is {values[index].dtype}, "
                             f"not float64; --cast converts float64 only")
        values[index] = values[index].astype(_CAST_TYPES[type_name.strip()])
    return values


def _attribute_args(args, op: str) -> dict:
    from ._dtypes import element_type

    attributes = {}
    if args.axis is not None:
        attributes["axis"] = args.axis
    if args.block_size is not None:
        attributes["block_size"] = args.block_size
    if args.output_dtype is not None:
        text = args.output_dtype
        try:
            attributes["output_dtype"] = element_type(int(text) if text.isdigit() else text,
                                                      "--output-dtype").onnx_id
        except (TypeError, ValueError) as error:
            raise UsageError(f"{PROG}: {error}") from None
    if op == "QuantizeLinear":
        if args.saturate is not None:
            attributes["saturate"] = args.saturate
        if args.precision is not None:
            attributes["precision"] = _precision_code(args.precision)
    return attributes


def _precision_code(text: str) -> int:
    """--precision as the attribute's int: a number as given (run_op checks it), or a
    type name in any spelling element_type knows (fp16, bf16...)."""
    from ._dtypes import element_type
    from ._opspec import PRECISION_TYPES

    if text.isdigit():
        return int(text)
    codes = {name: code for code, name in PRECISION_TYPES.items()}
    try:
        name = element_type(text, "--precision").name
    except ValueError:
        name = None
    if name not in codes:
        raise UsageError(f"{PROG} quantize: --precision {text!r}; allowed {_precision_names()}")
    return codes[name]


def cmd_apply(args, op: str) -> int:
    from ._opspec import NEWEST_OPSET, get_spec
    from ._registry import run_op
    from .golden.writers import read_npz, to_storage

    command = args.command
    spec_for_names = get_spec(op, None)
    names = [p.name for p in spec_for_names.inputs]  # x, *_scale, *_zero_point
    opset = args.opset
    attributes = {}
    if args.npz:
        if args.x or args.scale or args.zero_point:
            raise UsageError(f"{PROG} {command}: give the inputs as files or with --npz, "
                             f"not both")
        values, meta = _inputs_from_npz(args.npz, names, read_npz)
        if meta:
            if meta.get("op_type") != op:
                raise RuntimeError(f"{args.npz} is a {meta.get('op_type')} case, not {op}")
            attributes = dict(meta.get("attributes", {}))
            opset = opset if opset is not None else meta.get("opset")
    else:
        if not args.x or not args.scale:
            raise UsageError(f"{PROG} {command}: needs X and SCALE (files), or --npz FILE")
        values = [_load_array(args.x, "x"), _load_array(args.scale, "scale")]
        values.append(_load_array(args.zero_point, "zero_point") if args.zero_point else None)
        if op == "DequantizeLinear" and values[0].dtype == np.uint8 and args.x_type is None:
            # uint8 is both a type and the storage of every 8-bit-or-narrower type (what
            # `quantize -o` writes for float8, int4, ...): reading it as uint8 codes
            # unasked would decode float8 codes as integers.
            raise UsageError(
                f"{PROG} {command}: x holds uint8 data, which is uint8 codes or the stored "
                f"codes of another type (float8, int4, ...); say which with --x-type, e.g. "
                f"--x-type uint8 or --x-type float8e4m3fn")
    types = [args.x_type, args.scale_type, args.zero_point_type]
    roles = ["x", "scale", "zero_point"]
    values = _apply_casts(values, roles, args.cast, command)
    inputs = [None if v is None else _typed(v, t, r) for v, t, r in zip(values, types, roles)]
    attributes.update(_attribute_args(args, op))
    opset = NEWEST_OPSET if opset is None else opset
    try:
        get_spec(op, opset)
    except (TypeError, ValueError) as error:
        raise UsageError(f"{PROG} {command}: --opset: {error}") from None
    while inputs and inputs[-1] is None:
        inputs.pop()
    (y,) = run_op(op, inputs, attributes, opset)
    from ._dtypes import array_element_type

    etype = array_element_type(y, "y")
    stored = to_storage(y)
    if args.out:
        if not args.out.endswith(".npy"):
            raise UsageError(f"{PROG} {command}: -o {args.out}: only .npy files are written; "
                             f"name the file FILE.npy")
        buffer = io.BytesIO()
        np.save(buffer, stored, allow_pickle=False)
        _write_file(args.out, buffer.getvalue())
        how = "" if stored.dtype == y.dtype else f", stored as {stored.dtype}"
        print(f"y: {etype.name} {list(y.shape)}{how} -> {args.out}")
    else:
        print(f"y: {etype.name} {list(y.shape)}")
        with np.printoptions(threshold=1000):
            print(y)
            if stored.dtype != y.dtype:
                # float8 NaN 0x7F and 0xFF print alike: the codes tell them apart.
                print(f"codes ({etype.name}, hex):")
                print(np.vectorize(lambda code: f"0x{int(code):02X}")(stored))
    return 0


def _inputs_from_npz(path, names, read_npz):
    if not os.path.exists(path):
        raise RuntimeError(f"--npz: no such file {path}")
    with np.load(path, allow_pickle=False) as archive:
        has_meta = "meta" in archive.files
        files = list(archive.files)
    if has_meta:
        meta, arrays = read_npz(path)
    else:
        meta = None
        with np.load(path, allow_pickle=False) as archive:
            arrays = {k: archive[k] for k in files}
    missing = [n for n in names[:2] if n not in arrays]
    if missing:
        raise RuntimeError(f"--npz {path} has no {missing[0]!r}; it has {', '.join(files)}")
    return [arrays.get(n) for n in names], meta


# --------------------------------------------------------------------------------------
# spec


def cmd_spec(args) -> int:
    from ._opspec import get_spec, resolve_op_name

    try:
        spec = get_spec(resolve_op_name(args.op), args.opset)
    except ValueError as error:
        raise UsageError(f"{PROG} spec: {error}") from None
    print(spec.describe())
    return 0


# --------------------------------------------------------------------------------------
# verify


def cmd_verify(args) -> int:
    from .golden.verify import verify

    if args.max_mismatches < 0:
        raise UsageError(f"{PROG} verify: --max-mismatches must be >= 0, got "
                         f"{args.max_mismatches}")
    try:
        report = verify(args.golden_dir, args.actual, case=args.case,
                        max_mismatches=args.max_mismatches)
    except ValueError as error:
        raise UsageError(f"{PROG} verify: {error}") from None
    print(report.format())
    if args.json:
        _write_file(args.json, report.to_json().encode())
    return 0 if report.ok(args.allow_missing) else 1


# --------------------------------------------------------------------------------------


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        parser = _build_parser()
        if not argv:
            parser.print_help()
            return 0
        args = parser.parse_args(argv)
        if args.command is None:
            parser.print_help()
            return 0
        if args.command == "golden":
            return cmd_golden(args)
        if args.command == "quantize":
            return cmd_apply(args, "QuantizeLinear")
        if args.command == "dequantize":
            return cmd_apply(args, "DequantizeLinear")
        if args.command == "verify":
            return cmd_verify(args)
        return cmd_spec(args)
    except SystemExit as done:  # --help and --version
        return done.code if isinstance(done.code, int) else 0
    except UsageError as error:
        print(str(error), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader closed the pipe (`qemu-q golden --list | head`): what it wanted was
        # written. Point stdout at /dev/null so that the interpreter's final flush is quiet.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except Exception as error:  # one line, no traceback: the message names the problem
        if os.environ.get("QEMU_Q_TRACEBACK"):
            raise
        message = str(error).strip().splitlines()[0] if str(error).strip() else \
            type(error).__name__
        if isinstance(error, (OSError,)) and getattr(error, "filename", None):
            message = f"{error.strerror}: {error.filename}"
        print(f"{PROG}: error: {message}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
