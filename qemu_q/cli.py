"""The `qemu-q` command line: golden vectors, quantize / dequantize on files, op specs.

    qemu-q golden --out DIR           the conformance suite (docs/golden.md); with
                                      --datapath FILE.json, under a described datapath
    qemu-q quantize X SCALE [ZP]      QuantizeLinear on .npy / .npz / .pb / .hex files
    qemu-q dequantize X SCALE [ZP]    DequantizeLinear on .npy / .npz / .pb / .hex files
    qemu-q spec OP [--opset N]        the op-spec entry a model at that opset runs
    qemu-q verify GOLDEN_DIR ACTUAL   compare outputs with a golden suite, bit for bit
    qemu-q run MODEL.onnx --input NAME=FILE ... --dump DIR
                                      run a whole model with qemu_q's bits at every node
                                      it implements; dump every tensor (.pb, .hex)

Errors are one line on stderr; the exit code is 2 for a usage error (an unknown option,
op, type or opset, an option combination that cannot work, an input whose type must be
named) and 1 for a failure (a missing or unreadable file, an attribute the version lacks,
values the op rejects). When stdout is closed early (`qemu-q golden --list | head`) the
command stops quietly with 141, the shell's code for SIGPIPE.
"""

from __future__ import annotations

import argparse
import errno
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
    """--opt a,b --opt c  ->  [a, b, c]: each value once, in order. An option given with no
    value ("", ",") is refused: it would select everything, as the option left out does
    (an empty shell variable would generate the whole suite)."""

    def __call__(self, parser, namespace, values, option_string=None):
        parts = _csv(values)
        if not parts:
            raise UsageError(f"{parser.prog}: {option_string} {values!r} names nothing; leave the option "
                             f"out to select every value (see {parser.prog} --help)")
        merged = getattr(namespace, self.dest) or []
        setattr(namespace, self.dest, merged + [part for part in dict.fromkeys(parts) if part not in merged])


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
    g.add_argument("--out", "-o", metavar="DIR", help="output directory (not with --list)")
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
    g.add_argument("--variant", action=_CsvAppend, metavar="V",
                   help="variants, glob patterns allowed, e.g. base,per_axis,'x_*' "
                        "(docs/golden.md)")
    g.add_argument("--block-size", action=_CsvAppend, metavar="N",
                   help="block sizes of the blocked cases, one case per size (variant "
                        "blocked_b<N>); default: one case whose block size leaves a "
                        "partial last block (3)")
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
    g.add_argument("--datapath", metavar="FILE.json",
                   help="compute every case under this qemu_q.Datapath: a JSON object of its "
                        "fields by keyword name, e.g. {\"rounding\": \"half_away\"}; "
                        "a non-default datapath writes npz and hex only (docs/golden.md)")

    for name, (scale, zp) in {"quantize": ("y_scale", "y_zero_point"),
                              "dequantize": ("x_scale", "x_zero_point")}.items():
        op = "QuantizeLinear" if name == "quantize" else "DequantizeLinear"
        p = commands.add_parser(
            name, help=f"apply {op} to arrays in .npy / .npz files",
            description=f"Apply {op} to arrays read from .npy files, .npz members "
                        f"(FILE.npz:KEY), ONNX TensorProto .pb files or qemu-q .hex files, "
                        f"or from a golden case .npz (--npz). .pb, .hex and the .npz files "
                        f"qemu-q writes carry the ONNX type; .npy files do not: types numpy "
                        f"lacks (int4, float8...) are there in storage form (sub-byte "
                        f"integers as int8/uint8 values, bfloat16 and the small floats as "
                        f"their bit patterns) and --x-type etc. must name them.",
            epilog=f"Example: qemu-q {name} x.npy scale.npy zp.npy --axis 0 -o y.npz",
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
                       help="ONNX type of the zero point's array (default for dequantize: "
                            "x's type when the stored dtypes match)")
        p.add_argument("--cast", action="store_true",
                       help="convert float arrays of untyped files (.npy, e.g. float64) to "
                            "the float type --x-type / --scale-type names, rounding to "
                            "nearest even")
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
                       help="write y to FILE.npz (y in storage form and its ONNX type), "
                            "FILE.pb (ONNX TensorProto), FILE.hex ($readmemh, 32-bit words) "
                            "or FILE.npy (only for types numpy has); without it, print y "
                            "(codes in hex beside the values of types numpy lacks)")

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

    r = commands.add_parser(
        "run", help="run a whole ONNX model and dump every tensor",
        description="Run an ONNX model with onnx.reference, qemu_q computing every node it "
                    "implements (the Q/DQ family, Cast, the integer ops), and write every "
                    "tensor of the run (graph inputs, the initializers the nodes read, every "
                    "node output) to DIR as an ONNX TensorProto .pb and a $readmemh .hex, "
                    "with manifest.json mapping tensor names to files, types, shapes and "
                    "producing nodes. Needs the onnx extra.",
        epilog="Example: qemu-q run model.onnx --input image=image.npy --dump golden_net",
    )
    r.add_argument("model", metavar="MODEL", help="the .onnx model")
    r.add_argument("--input", action="append", default=[], metavar="NAME=FILE",
                   help="a graph input: .npy (numpy types), or a typed .npz / .pb / .hex as "
                        "the quantize command reads them; once per input")
    r.add_argument("--dump", required=True, metavar="DIR",
                   help="directory for the tensors (created; must be empty unless --force)")
    r.add_argument("--force", action="store_true", help="write into a non-empty DIR")
    r.add_argument("--word-bits", type=_int, default=32, choices=(8, 16, 32, 64),
                   help="word width of the .hex files (default 32)")
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

    def integers(values, option):
        if not values:
            return None
        try:
            return tuple(int(v, 0) for v in values)
        except ValueError:
            raise UsageError(f"{PROG} golden: {option} takes integers, got "
                             f"{','.join(values)}") from None

    opsets = integers(args.opset, "--opset")
    block_sizes = integers(args.block_size, "--block-size")
    try:
        return Selection(
            ops=tuple(args.op) if args.op else None,
            opsets=opsets,
            types=tuple(args.type) if args.type else None,
            granularities=tuple(args.granularity) if args.granularity else None,
            families=tuple(args.family) if args.family else None,
            variants=tuple(args.variant) if args.variant else None,
            block_sizes=block_sizes,
        )
    except (ValueError, TypeError) as error:
        raise UsageError(f"{PROG} golden: {error}") from None


def _formats(args, datapath=None) -> tuple[str, ...]:
    from .golden import writers

    expressible = datapath is None or datapath.is_onnx
    if args.format and "onnx" in args.format and not expressible:
        raise UsageError(f"{PROG} golden: --format onnx with a non-default --datapath: no ONNX "
                         f"op expresses it (npz and hex carry the cases)")
    if not args.format:
        found = writers.available_formats()
        if not expressible:
            return tuple(f for f in found if f != "onnx")
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


def _prepare_out(out: str, force: bool) -> str:
    """The staging directory the suite is written into (inside `out`): _replace_suite
    moves it into place once every case is written, so that a command that fails
    halfway (a case the datapath refuses, a full disk, Ctrl-C) leaves no partial suite
    and, with --force, the previous suite as it was."""
    from .golden import writers

    if os.path.exists(out) and not os.path.isdir(out):
        raise RuntimeError(f"--out {out} exists and is not a directory")
    if os.path.isdir(out) and os.listdir(out) and not force:
        raise RuntimeError(f"--out {out} is not empty; use --force to replace the suite "
                           f"there (its {writers.MANIFEST}, {writers.NODE_DIR}/ and "
                           f"{writers.NPZ_DIR}/)")
    os.makedirs(out, exist_ok=True)
    return tempfile.mkdtemp(prefix=".qemu-q-staging-", dir=out)


def _replace_suite(out: str, staging: str) -> None:
    """The staged suite in place of `out`'s (its manifest last). A symbolic link where a
    part of the suite goes is removed, not written through."""
    from .golden import writers

    parts = (writers.NODE_DIR, writers.NPZ_DIR, writers.MANIFEST)
    for name in parts:
        path = os.path.join(out, name)
        if os.path.islink(path) or os.path.isfile(path):
            os.unlink(path)
        elif os.path.isdir(path):
            shutil.rmtree(path)
    for name in parts:
        if os.path.exists(os.path.join(staging, name)):
            os.replace(os.path.join(staging, name), os.path.join(out, name))
    os.rmdir(staging)
    for name in os.listdir(out):  # the staging of a run killed before it could clean up
        if name.startswith(".qemu-q-staging-") and os.path.isdir(os.path.join(out, name)):
            shutil.rmtree(os.path.join(out, name), ignore_errors=True)


def _umask() -> int:
    mask = os.umask(0o022)  # (reading it sets it: put it back)
    os.umask(mask)
    return mask


def _write_file(path: str, data: bytes) -> None:
    """Write `data` to `path` whole or not at all: into a temporary name beside it, then
    renamed over it, so that an interrupted or failed write (Ctrl-C, a full disk) leaves
    no empty or truncated file under the real name."""
    directory = os.path.dirname(path) or "."
    if not os.path.isdir(directory):
        raise FileNotFoundError(errno.ENOENT, "no such directory to write into", directory)
    handle = tempfile.NamedTemporaryFile(dir=directory, prefix=".qemu-q-", suffix=".tmp", delete=False)
    try:
        with handle:
            handle.write(data)
        # a temporary file is made 0600; the file keeps the mode a plain open() would give
        os.chmod(handle.name, 0o666 & ~_umask())
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


def _datapath(args):
    """The --datapath file's Datapath (the ONNX default without the option)."""
    from .datapath import ONNX
    from .golden import datapaths

    if args.datapath is None:
        return ONNX
    try:
        return datapaths.load_datapath(args.datapath)
    except datapaths.DatapathFileError as error:
        raise UsageError(f"{PROG} golden: {error}") from None


def cmd_golden(args) -> int:
    from . import __version__, golden
    from .golden import datapaths, writers

    start = time.monotonic()
    if not args.out and not args.list:
        raise UsageError(f"{PROG} golden: the following arguments are required: --out "
                         f"(or --list)")
    selection = _selection(args)
    if args.size < 1:
        raise UsageError(f"{PROG} golden: --size must be >= 1, got {args.size}")
    datapath = _datapath(args)
    configs = list(golden.iter_configs(selection))
    omitted = {}
    if not datapath.is_onnx:
        omitted = {op: reason for op, reason in datapaths.NO_DATAPATH_OPS.items()
                   if any(c.op_type == op for c in configs)}
        configs = [c for c in configs if c.op_type not in omitted]
        if not configs:
            raise UsageError(f"{PROG} golden: the options select no case that takes a datapath "
                             f"({'; '.join(omitted.values())})")
    if not configs:
        raise UsageError(f"{PROG} golden: the options select no case")
    if args.list:
        # A reader that stops early (`| head`) ends the listing, not with a traceback.
        for config in configs:
            divergences = golden.divergences_of(config) if datapath.is_onnx else []
            note = f"  [divergence: {divergences[0][0]}]" if divergences else ""
            print(f"{config.name}{note}")
        return 0
    if not args.out:
        raise UsageError(f"{PROG} golden: --out DIR is required (except with --list)")
    formats = _formats(args, datapath)
    if not datapath.is_onnx:
        # An op that does not take the datapath (or refuses a field) stops the command
        # before anything is written: its first case is built here.
        for op_type in dict.fromkeys(c.op_type for c in configs):
            golden.build_case(next(c for c in configs if c.op_type == op_type), args.seed,
                              args.size, datapath)
    staging = _prepare_out(args.out, args.force)
    header = {
        "qemu_q_version": __version__,
        "seed": args.seed,
        "size": args.size,
        "formats": list(formats),
        "word_bits": args.word_bits if "hex" in formats else None,
        "selection": {
            "op": args.op, "opset": args.opset, "type": args.type,
            "granularity": args.granularity, "family": args.family,
            "variant": args.variant, "block_size": args.block_size,
        },
        "layout": {"onnx": f"{writers.NODE_DIR}/<name>/model.onnx, "
                           f"{writers.NODE_DIR}/<name>/test_data_set_0/{{input,output}}_N.pb",
                   "hex": "beside each tensor's .pb, same stem",
                   "npz": f"{writers.NPZ_DIR}/<name>.npz"},
        "datapath": datapaths.datapath_fields(datapath),
        "datapath_is_onnx": datapath.is_onnx,
    }
    if not datapath.is_onnx:
        header["onnx_folders"] = (
            "not written: no ONNX op expresses a non-default datapath; the .npz and hex files "
            "carry the cases (no model.onnx or .pb, runs_on and divergences empty)")
        header["datapath_omitted_ops"] = omitted
        if datapath.rounding == "stochastic":
            header["random_bits"] = datapaths.RANDOM_BITS_RULE
    progress = _Progress(len(configs))
    entries, n_files, n_bytes, made = [], 0, 0, set()
    try:
        try:
            for done, config in enumerate(configs, 1):
                case = golden.build_case(config, args.seed, args.size, datapath)
                files, entry = writers.case_files(case, formats, args.word_bits)
                for relative, data in files:
                    _write(staging, relative, data, made)
                    n_bytes += len(data)
                n_files += len(files)
                entries.append(entry)
                progress.update(done)
        finally:
            progress.close()
        manifest = writers.manifest_bytes(header, entries)
        _write(staging, writers.MANIFEST, manifest, made)
        _replace_suite(args.out, staging)
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # (gone already where the suite was moved)
    n_files += 1
    n_bytes += len(manifest)
    n_divergent = sum(1 for e in entries if e["divergence"])
    seconds = time.monotonic() - start
    print(f"{PROG} golden: {len(entries)} cases ({n_divergent} marked as divergences), "
          f"{n_files} files, {_format_bytes(n_bytes)}, {seconds:.1f} s -> {args.out}")
    return 0


# --------------------------------------------------------------------------------------
# quantize / dequantize


_OUTPUT_EXTENSIONS = (".npy", ".npz", ".pb", ".hex")


def _load_array(spec: str, role: str) -> tuple[np.ndarray, bool]:
    """(array, typed): typed when the file names the ONNX type (.pb, .hex, an .npz with
    qemu-q's `meta`); a .npy or plain .npz member is untyped storage."""
    from .golden import writers

    path, key = spec, None
    if ":" in spec and not os.path.exists(spec):
        path, _, key = spec.rpartition(":")
    if not os.path.exists(path):
        raise RuntimeError(f"{role}: no such file {path}")
    try:
        if path.endswith(".pb"):
            with open(path, "rb") as handle:
                return writers.read_tensor_proto(handle.read()), True
        if path.endswith(".hex"):
            with open(path) as handle:
                text = handle.read()
            return writers.read_hex(text, *writers.hex_type_and_shape(text)), True
        if path.endswith(".npz") or key is not None:
            with np.load(path, allow_pickle=False) as archive:
                typed = "meta" in archive.files
                arrays = None if typed else {k: archive[k] for k in archive.files}
            if typed:
                arrays = writers.read_npz(path)[1]
            if key is None:
                if len(arrays) != 1:
                    raise RuntimeError(
                        f"{role}: {path} holds {len(arrays)} arrays "
                        f"({', '.join(arrays)}); name one as {path}:KEY")
                key = next(iter(arrays))
            if key not in arrays:
                raise RuntimeError(f"{role}: {path} has no array {key!r}; it has "
                                   f"{', '.join(arrays)}")
            return arrays[key], typed
        return np.load(path, allow_pickle=False), False
    except RuntimeError:
        raise
    except Exception as error:  # noqa: BLE001 - zipfile's BadZipFile, protobuf's DecodeError
        raise RuntimeError(f"{role}: cannot read {spec}: {type(error).__name__}: {error}") from None


def _type_arg(text: str, option: str, command: str):
    """An ElementType from a type option; an unknown name is a usage error."""
    from ._dtypes import element_type

    try:
        return element_type(int(text) if text.isdigit() else text, option)
    except (TypeError, ValueError) as error:
        raise UsageError(f"{PROG} {command}: {error}") from None


def cast_to(array: np.ndarray, etype) -> np.ndarray:
    """A float array converted to the float type `etype` by ONNX Cast (qemu_q.cast, the
    newest version): rounded to nearest even once, saturate=0 (overflow gives inf, or the
    Cast table's NaN / +-max where the type has no inf), float8e8m0 to the nearest power
    of two."""
    from .ops.cast import cast

    return cast(array, etype, saturate=0, round_mode="nearest")


def _typed(array: np.ndarray, typed: bool, type_name: str | None, role: str, args,
           default=None) -> np.ndarray:
    """The input as its ONNX type: as the file says, or as the type option names."""
    from ._dtypes import ELEMENT_TYPES, array_element_type
    from .golden.writers import from_storage, storage_dtype

    command = args.command
    option = f"--{role.replace('_', '-')}-type"
    etype = None if type_name is None else _type_arg(type_name, option, command)
    if typed:
        found = array_element_type(array, role)
        if etype is not None and etype.name != found.name:
            raise UsageError(f"{PROG} {command}: {option} {type_name}, but the {role} file "
                             f"says {found.name} (typed files need no {option})")
        return array
    if etype is None and default is not None and array.dtype == storage_dtype(default):
        etype = default
    if etype is None:
        if array.dtype.kind == "f" and array.dtype not in (np.float32, np.float16):
            raise UsageError(
                f"{PROG} {command}: {role} is {array.dtype}, which is no ONNX type of these "
                f"ops; convert it with {option} float --cast (or float16, bfloat16...: "
                f"rounds to nearest even)")
        stored_as = [t.name for t in ELEMENT_TYPES.values()
                     if storage_dtype(t) == array.dtype]
        if command == "dequantize" and role == "x" and len(stored_as) > 1:
            raise UsageError(
                f"{PROG} {command}: x is untyped {array.dtype} data (a .npy or plain .npz "
                f"member); name its type with --x-type ({', '.join(stored_as)}), or pass a typed file "
                f"(.npz, .pb or .hex as qemu-q quantize -o writes them)")
        try:
            array_element_type(array, role)
        except TypeError:
            raise UsageError(f"{PROG} {command}: {role} has dtype {array.dtype}, which is "
                             f"no ONNX type; name its type with {option}") from None
        return array
    if args.cast and array.dtype.kind == "f" and array.dtype != etype.dtype:
        if etype.kind == "integer":
            raise UsageError(f"{PROG} {command}: --cast converts to float types, not "
                             f"{option} {etype.name}")
        return cast_to(array, etype)
    if array.dtype.kind == "f" and array.dtype != etype.dtype:
        raise UsageError(
            f"{PROG} {command}: {role} is {array.dtype}; {option} {etype.name} reads "
            f"stored {etype.name} values or bit patterns; add --cast to convert "
            f"{array.dtype} to {etype.name} (round to nearest even)")
    try:
        return from_storage(array, etype.name)
    except TypeError as error:  # the option names a type the data is not stored as
        raise UsageError(f"{PROG} {command}: {role} ({option} {etype.name}): {error}") from None
    except ValueError as error:  # values outside the named type
        raise RuntimeError(f"{role} ({option} {etype.name}): {error}") from None


def _attribute_args(args, op: str) -> dict:
    attributes = {}
    if args.axis is not None:
        attributes["axis"] = args.axis
    if args.block_size is not None:
        attributes["block_size"] = args.block_size
    if args.output_dtype is not None:
        attributes["output_dtype"] = _type_arg(args.output_dtype, "--output-dtype",
                                               args.command).onnx_id
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
    from ._dtypes import array_element_type
    from ._opspec import NEWEST_OPSET, get_spec
    from ._registry import run_op
    from .golden.writers import read_npz

    command = args.command
    if args.opset is not None:
        try:
            get_spec(op, args.opset)
        except ValueError as error:
            raise UsageError(f"{PROG} {command}: {error}") from None
    if args.out:
        _check_output_path(args.out, command)
        _check_not_an_input(args.out, "-o", [args.npz, args.x, args.scale, args.zero_point], command)
    spec_for_names = get_spec(op, None)
    names = [p.name for p in spec_for_names.inputs]  # x, *_scale, *_zero_point
    opset = args.opset
    attributes = {}
    if args.npz:
        if args.x or args.scale or args.zero_point:
            raise UsageError(f"{PROG} {command}: give the inputs as files or with --npz, "
                             f"not both")
        values, meta = _inputs_from_npz(args.npz, names, read_npz)
        typed = [meta is not None] * 3
        if meta:
            if meta.get("op_type") != op:
                raise RuntimeError(f"{args.npz} is a {meta.get('op_type')} case, not {op}")
            if meta.get("datapath"):
                raise RuntimeError(
                    f"{args.npz} is a case of a described datapath ({meta['datapath']}); qemu-q "
                    f"{command} runs the ONNX op: call qemu_q.{'quantize_linear' if op == 'QuantizeLinear' else 'dequantize_linear'} "
                    "with that Datapath (and the case's random_bits) instead")
            attributes = dict(meta.get("attributes", {}))
            opset = opset if opset is not None else meta.get("opset")
    else:
        if not args.x or not args.scale:
            raise UsageError(f"{PROG} {command}: needs X and SCALE (files), or --npz FILE")
        files = [args.x, args.scale, args.zero_point]
        loaded = [None if f is None else _load_array(f, r)
                  for f, r in zip(files, ("x", "scale", "zero_point"))]
        values = [None if item is None else item[0] for item in loaded]
        typed = [item is not None and item[1] for item in loaded]
    x, scale, zero_point = values
    x = _typed(x, typed[0], args.x_type, "x", args)
    scale = _typed(scale, typed[1], args.scale_type, "scale", args)
    if zero_point is not None:
        # DequantizeLinear's zero point has x's type: an untyped one stored as x is, is x's
        zero_point = _typed(zero_point, typed[2], args.zero_point_type, "zero_point", args,
                            default=_element_type_of(x) if op == "DequantizeLinear" else None)
    attributes.update(_attribute_args(args, op))
    opset = NEWEST_OPSET if opset is None else opset
    inputs = [x, scale] + ([] if zero_point is None else [zero_point])
    (y,) = run_op(op, inputs, attributes, opset)
    etype = array_element_type(y, "y")
    if args.out:
        _write_output(y, args.out, command)
        print(f"y: {etype.name} {list(y.shape)} -> {args.out}")
    else:
        print(f"y: {etype.name} {list(y.shape)}")
        print(format_array(y))
    return 0


def _element_type_of(array: np.ndarray):
    from ._dtypes import array_element_type

    return array_element_type(array, "x")


def _check_not_an_input(out: str, option: str, inputs, command: str) -> None:
    """An output file that is one of the inputs, or lies inside an input directory (a
    suite's manifest, an ACTUAL case), would overwrite what the command reads."""
    target = os.path.realpath(out)
    for given in inputs:
        if not given:
            continue
        source = os.path.realpath(given)
        inside = os.path.isdir(source) and os.path.commonpath([source, target]) == source
        if target == source or inside:
            raise UsageError(f"{PROG} {command}: {option} {out} would overwrite "
                             f"{'a file in ' if inside else ''}the input {given}; write elsewhere")


def _check_output_path(out: str, command: str) -> str:
    """The -o file's extension; anything but a file named .npy/.npz/.pb/.hex is refused
    before the op runs."""
    if os.path.isdir(out):
        raise UsageError(f"{PROG} {command}: -o {out} is a directory; name a file ending in "
                         f"{', '.join(_OUTPUT_EXTENSIONS)}")
    extension = os.path.splitext(out)[1].lower()
    if extension not in _OUTPUT_EXTENSIONS:
        raise UsageError(f"{PROG} {command}: -o {out}: the extension "
                         f"{extension or '(none)'} names no format qemu-q writes; use "
                         f"{', '.join(_OUTPUT_EXTENSIONS)}")
    return extension


def _write_output(y: np.ndarray, out: str, command: str) -> None:
    """y to exactly `out`, in the format its extension names (docs/golden.md)."""
    from ._dtypes import array_element_type
    from .golden import writers

    extension = _check_output_path(out, command)
    etype = array_element_type(y, "y")
    if extension == ".npy":
        if not writers.numpy_native(etype):
            stem = os.path.splitext(out)[0]
            raise UsageError(
                f"{PROG} {command}: -o {out}: numpy has no {etype.name} dtype, so a .npy "
                f"would hold untyped {writers.storage_dtype(etype)} data; write {stem}.npz, "
                f"{stem}.pb or {stem}.hex, which carry the ONNX type")
        buffer = io.BytesIO()
        np.lib.format.write_array(buffer, y, allow_pickle=False)
        data = buffer.getvalue()
    elif extension == ".npz":
        data = writers.typed_npz((("output", "", [("y", y)]),), {"producer": f"{PROG} {command}"})
    elif extension == ".pb":
        data = writers.tensor_proto_bytes(y, "y")
    else:
        data = writers.hex_text(y, writers.DEFAULT_WORD_BITS, "y").encode()
    _write_file(out, data)


def format_array(array: np.ndarray) -> str:
    """The array as numpy prints it; for types numpy lacks each value is followed by its
    code in hex (float8 NaN 0x7f and 0xff, int4 -1 as 0xf), since the values alone can
    hide which bits they are."""
    from ._dtypes import array_element_type
    from .golden.writers import numpy_native, to_storage

    etype = array_element_type(array, "array")
    if numpy_native(etype):
        with np.printoptions(threshold=1000):
            return str(array)
    flat = array.reshape(-1)
    codes = to_storage(flat).astype(np.int64) & ((1 << etype.bits) - 1)
    digits = -(-etype.bits // 4)
    index = np.arange(flat.size).reshape(array.shape)
    return np.array2string(index, threshold=1000, formatter={
        "int": lambda i: f"{flat[i]}(0x{codes[i]:0{digits}x})"})


def _inputs_from_npz(path, names, read_npz):
    if not os.path.exists(path):
        raise RuntimeError(f"--npz: no such file {path}")
    try:
        with np.load(path, allow_pickle=False) as archive:
            has_meta = "meta" in archive.files
            files = list(archive.files)
        if has_meta:
            meta, arrays = read_npz(path)
        else:
            meta = None
            with np.load(path, allow_pickle=False) as archive:
                arrays = {k: archive[k] for k in files}
    except Exception as error:  # noqa: BLE001 - zipfile's BadZipFile and numpy's errors
        raise RuntimeError(f"--npz: cannot read {path}: {type(error).__name__}: {error}") from None
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
    if args.json:
        _check_not_an_input(args.json, "--json", [args.golden_dir, args.actual], "verify")
    try:
        report = verify(args.golden_dir, args.actual, case=args.case,
                        max_mismatches=args.max_mismatches)
    except ValueError as error:
        raise UsageError(f"{PROG} verify: {error}") from None
    print(report.format())
    if args.json:
        _write_file(args.json, report.to_json().encode())
    return 0 if report.ok(args.allow_missing) else 1


def cmd_run(args) -> int:
    from .golden.writers import import_onnx
    from .model_run import ModelInputError, dump, run_model

    import_onnx()  # a clear message when the onnx extra is missing
    if not os.path.isfile(args.model):
        raise RuntimeError(f"no such model file {args.model}")
    feeds = {}
    for item in args.input:
        name, separator, path = item.partition("=")
        if not separator or not name or not path:
            raise UsageError(f"{PROG} run: --input {item!r}: expected NAME=FILE")
        if name in feeds:
            raise UsageError(f"{PROG} run: --input {name} is given twice")
        feeds[name], _typed = _load_array(path, f"--input {name}")
    if os.path.exists(args.dump) and not os.path.isdir(args.dump):
        raise UsageError(f"{PROG} run: --dump {args.dump} exists and is not a directory")
    if os.path.isdir(args.dump) and os.listdir(args.dump) and not args.force:
        raise UsageError(f"{PROG} run: --dump {args.dump} is not empty; use --force")
    try:
        tensors = run_model(args.model, feeds)
    except ModelInputError as error:
        raise UsageError(f"{PROG} run: {error}") from None
    except Exception as error:  # noqa: BLE001 - protobuf's DecodeError for a file that is no model
        if type(error).__name__ != "DecodeError":
            raise
        raise RuntimeError(f"{args.model}: not an ONNX model ({error})") from None
    os.makedirs(args.dump, exist_ok=True)
    manifest = dump(tensors, args.dump, _write_file, args.word_bits)
    print(f"{PROG} run: {len(manifest['tensors'])} tensors -> {args.dump}/ (.pb, .hex, "
          f"manifest.json)")
    return 0


# --------------------------------------------------------------------------------------


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        code = _main(argv)
        sys.stdout.flush()  # here, where a closed pipe can still be caught
        return code
    except BrokenPipeError:
        # The reader stopped reading (| head). Python would flush again at exit and print
        # "Exception ignored ... Broken pipe": point stdout at /dev/null first.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 128 + 13  # what a shell reports for a command killed by SIGPIPE


def _main(argv) -> int:
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
        if args.command == "run":
            return cmd_run(args)
        return cmd_spec(args)
    except SystemExit as done:  # --help and --version
        return done.code if isinstance(done.code, int) else 0
    except UsageError as error:
        print(str(error), file=sys.stderr)
        return 2
    except BrokenPipeError:
        raise
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
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
