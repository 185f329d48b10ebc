"""The qemu-q command line: every subcommand, --help everywhere, and one-line errors with
exit code 2 (usage) or 1 (failure)."""

import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import qemu_q
from qemu_q import cli
from qemu_q.golden import writers

INT4 = qemu_q.ELEMENT_TYPES["int4"].dtype


def run(capsys, *argv):
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(err, code, expected_code, *fragments):
    assert code == expected_code, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@pytest.fixture
def arrays(tmp_path):
    x = np.array([[0.0, 1.5, 2.5, -2.5], [300.0, np.nan, -7.0, 0.2]], np.float32)
    paths = {
        "x": tmp_path / "x.npy", "s": tmp_path / "s.npy", "zp": tmp_path / "zp.npy",
        "s0": tmp_path / "s0.npy", "codes": tmp_path / "codes.npy", "npz": tmp_path / "in.npz",
    }
    np.save(paths["x"], x)
    np.save(paths["s"], np.array([1.0, 0.5], np.float32))
    np.save(paths["zp"], np.array([0, 3], np.int8))
    np.save(paths["s0"], np.float32(0.5))
    np.save(paths["codes"], np.array([1, -2, 7, -8, 3], np.int8))
    np.savez(paths["npz"], x=np.arange(6, dtype=np.float32), scale=np.float32(0.25))
    return x, paths


# --------------------------------------------------------------------------------------
# help and version


def test_python_dash_m_prints_help(package_home):
    done = subprocess.run([sys.executable, "-m", "qemu_q"], capture_output=True, text=True,
                          cwd=str(package_home))
    assert done.returncode == 0
    assert "usage: qemu-q" in done.stdout and "golden" in done.stdout


@pytest.mark.parametrize("argv", [["--help"], ["golden", "--help"], ["quantize", "--help"],
                                  ["dequantize", "--help"], ["spec", "--help"]])
def test_help_everywhere(capsys, argv):
    code, out, _err = run(capsys, *argv)
    assert code == 0
    assert out.startswith("usage: qemu-q")
    assert "Example" in out or "COMMAND" in out


def test_version(capsys):
    code, out, _ = run(capsys, "--version")
    assert code == 0 and out.strip() == f"qemu-q {qemu_q.__version__}"


# --------------------------------------------------------------------------------------
# golden


def test_golden_writes_a_selection(capsys, tmp_path):
    out = tmp_path / "g"
    code, stdout, err = run(capsys, "golden", "--out", out, "--op", "q", "--opset", "21",
                            "--type", "int4", "--granularity", "blocked", "--word-bits", "16")
    assert code == 0, err
    assert err == ""  # no progress bar when stderr is not a terminal
    assert stdout.startswith("qemu-q golden: 1 cases") and "files" in stdout
    assert " s -> " in stdout and ("bytes" in stdout or "KB" in stdout)
    manifest = json.loads((out / "manifest.json").read_text())
    (case,) = manifest["cases"]
    assert case["name"] == "test_quantizelinear_21_int4_blocked_random"
    assert case["granularity"] == "blocked" and case["attributes"]["block_size"] > 0
    assert manifest["word_bits"] == 16 and manifest["formats"] == ["onnx", "npz", "hex"]
    assert (out / case["onnx_dir"] / "model.onnx").is_file()
    text = (out / case["outputs"][0]["hex"]).read_text().splitlines()
    assert all(len(line) == 4 for line in text if not line.startswith("//"))


def test_golden_formats_and_force(capsys, tmp_path):
    out = tmp_path / "g"
    code, _, err = run(capsys, "golden", "--out", out, "--op", "dynamic", "--format", "npz")
    assert code == 0, err
    assert list((out / "npz").glob("*.npz")) and not (out / "node").exists()
    code, _, err = run(capsys, "golden", "--out", out, "--op", "dynamic")
    assert_one_line_error(err, code, 1, "not empty", "--force")
    (out / "mine.txt").write_text("kept")
    code, _, err = run(capsys, "golden", "--out", out, "--op", "dynamic", "--format", "hex",
                       "--force")
    assert code == 0, err
    assert not (out / "npz").exists() and (out / "mine.txt").read_text() == "kept"
    assert list((out / "node").rglob("*.hex"))


def test_golden_files_modes_repeats_and_links(capsys, tmp_path):
    """Files get the mode a plain write gives under the umask (a temporary file is 0600);
    a repeated list value is one case; a symbolic link where npz/ goes is replaced, not
    written through."""
    import os
    import stat

    previous = os.umask(0o022)
    try:
        out = tmp_path / "g"
        code, _, err = run(capsys, "golden", "--out", out, "--op", "q", "--opset", "21", "--type", "int4",
                           "--granularity", "blocked", "--block-size", "4,4", "--block-size", "4")
        assert code == 0, err
        manifest = json.loads((out / "manifest.json").read_text())
        assert [case["name"] for case in manifest["cases"]].count(manifest["cases"][0]["name"]) == 1
        modes = {stat.S_IMODE(path.stat().st_mode) for path in out.rglob("*") if path.is_file()}
        assert modes == {0o644}, modes
    finally:
        os.umask(previous)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("kept")
    (out / "npz").rename(tmp_path / "old_npz")
    (out / "npz").symlink_to(elsewhere)
    code, _, err = run(capsys, "golden", "--out", out, "--force", "--op", "dynamic", "--format", "npz")
    assert code == 0, err
    assert not (out / "npz").is_symlink() and list((out / "npz").glob("*.npz"))
    assert sorted(p.name for p in elsewhere.iterdir()) == ["keep.txt"]


def test_golden_failing_halfway_leaves_the_previous_suite(capsys, tmp_path):
    """A case the datapath refuses stops the command after other cases were built: the
    suite in DIR (replaced with --force) is left as it was, with no staging files."""
    out = tmp_path / "g"
    assert run(capsys, "golden", "--out", out, "--op", "dynamic", "--format", "npz")[0] == 0
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    dp_file = _datapath_file(tmp_path, {"float8_encoder": "onnxruntime", "rounding": "half_away"})
    code, _, err = run(capsys, "golden", "--out", out, "--force", "--datapath", dp_file, "--op", "q",
                       "--opset", "21", "--type", "int8,float8e4m3fn", "--format", "npz")
    assert_one_line_error(err, code, 1, "half_away", "float8_encoder='onnxruntime'")
    after = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert after == before and sorted(p.name for p in out.iterdir()) == ["manifest.json", "npz"]
    # the staging directory of a run killed before it could clean up goes with --force
    (out / ".qemu-q-staging-killed" / "npz").mkdir(parents=True)
    assert run(capsys, "golden", "--out", out, "--force", "--op", "dynamic", "--format", "npz")[0] == 0
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "npz"]


def test_golden_list(capsys):
    code, out, _ = run(capsys, "golden", "--list", "--op", "dynamic")
    assert code == 0
    lines = out.splitlines()
    assert len(lines) == 8 and all(line.startswith("test_dynamicquantizelinear_11") for line in lines)
    assert any("[divergence: DynamicQuantizeLinear: NaN in x]" in line for line in lines)


def test_golden_list_into_a_closed_pipe(package_home):
    """`qemu-q golden --list | head -1`: the reader goes away; no traceback, no
    'Broken pipe' message, exit 141 (SIGPIPE's shell code, docs/golden.md)."""
    import os

    env = dict(os.environ, PYTHONPATH=str(package_home))
    process = subprocess.Popen([sys.executable, "-m", "qemu_q", "golden", "--list"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               cwd=str(package_home), env=env)
    first = process.stdout.readline()
    process.stdout.close()
    with process.stderr:
        err = process.stderr.read().decode()
    assert process.wait(timeout=120) == 141
    assert first.startswith(b"test_quantizelinear_10_")
    assert err == ""


def test_golden_seed_and_size(capsys, tmp_path):
    def x_of(out):
        meta, arrays = writers.read_npz(out / "npz" / "test_dynamicquantizelinear_11_uint8_random.npz")
        return arrays["x"]

    base = ["golden", "--op", "dynamic", "--family", "random", "--format", "npz"]
    assert run(capsys, *base, "--out", tmp_path / "a")[0] == 0
    assert run(capsys, *base, "--out", tmp_path / "b", "--seed", "7")[0] == 0
    assert run(capsys, *base, "--out", tmp_path / "c", "--size", "600")[0] == 0
    assert x_of(tmp_path / "a").shape == x_of(tmp_path / "b").shape
    assert not np.array_equal(x_of(tmp_path / "a"), x_of(tmp_path / "b"))
    assert x_of(tmp_path / "c").size >= 600
    assert json.loads((tmp_path / "b" / "manifest.json").read_text())["seed"] == 7


@pytest.mark.parametrize("argv, code, fragments", [
    (["golden"], 2, ["--out"]),
    (["golden", "--out", "{tmp}/g", "--op", "Conv"], 2, ["unknown op 'Conv'"]),
    (["golden", "--out", "{tmp}/g", "--opset", "9"], 2, ["opset 9"]),
    (["golden", "--out", "{tmp}/g", "--opset", "x"], 2, ["--opset"]),
    (["golden", "--out", "{tmp}/g", "--type", "int3"], 2, ["int3"]),
    (["golden", "--out", "{tmp}/g", "--granularity", "per_row"], 2, ["per_row"]),
    (["golden", "--out", "{tmp}/g", "--family", "edges"], 2, ["edges"]),
    (["golden", "--out", "{tmp}/g", "--format", "pdf"], 2, ["pdf"]),
    (["golden", "--out", "{tmp}/g", "--word-bits", "12"], 2, ["--word-bits"]),
    (["golden", "--out", "{tmp}/g", "--size", "0"], 2, ["--size"]),
    # an empty list value names nothing (an empty shell variable): not the whole suite
    (["golden", "--out", "{tmp}/g", "--type", ""], 2, ["--type ''", "names nothing"]),
    (["golden", "--out", "{tmp}/g", "--op", ","], 2, ["--op ','", "names nothing"]),
    (["golden", "--out", "{tmp}/g", "--op", "dynamic", "--type", "int4"], 2, ["no case"]),
    (["golden", "--out", "{tmp}/file.txt"], 1, ["not a directory"]),
    (["frobnicate"], 2, ["frobnicate"]),
    (["--bogus"], 2, ["--bogus"]),
])
def test_golden_errors(capsys, tmp_path, argv, code, fragments):
    (tmp_path / "file.txt").write_text("x")
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    got, _out, err = run(capsys, *argv)
    assert_one_line_error(err, got, code, *fragments)
    assert not (tmp_path / "g").exists()


# --------------------------------------------------------------------------------------
# quantize / dequantize


def test_quantize_prints_and_writes(capsys, arrays, tmp_path):
    x, p = arrays
    code, out, err = run(capsys, "quantize", p["x"], p["s"], p["zp"], "--axis", "0")
    assert code == 0, err
    expected = qemu_q.quantize_linear(x, np.array([1.0, 0.5], np.float32),
                                      np.array([0, 3], np.int8), axis=0)
    assert out.splitlines()[0] == "y: int8 [2, 4]"
    y_path = tmp_path / "y.npy"
    code, out, err = run(capsys, "quantize", p["x"], p["s"], p["zp"], "--axis", "0", "-o", y_path)
    assert code == 0 and np.array_equal(np.load(y_path), expected)


def test_quantize_sub_byte_and_float8_outputs(capsys, arrays, tmp_path):
    x, p = arrays
    y_path = tmp_path / "y4.npz"
    code, out, err = run(capsys, "quantize", p["x"], p["s0"], "--output-dtype", "int4",
                         "-o", y_path)
    assert code == 0, err
    assert out.strip() == f"y: int4 [2, 4] -> {y_path}"
    expected = qemu_q.quantize_linear(x, np.float32(0.5), output_dtype="int4")
    meta, stored = writers.read_npz(y_path)
    assert [t["type"] for t in meta["tensors"]] == ["int4"]
    assert stored["y"].dtype == INT4 and _bits(stored["y"]) == _bits(expected)
    y_path = tmp_path / "y8.pb"
    code, out, err = run(capsys, "quantize", p["x"], p["s0"], "--output-dtype", "17",
                         "--saturate", "0", "--precision", "float16", "--opset", "23",
                         "-o", y_path)
    assert code == 0, err
    expected = qemu_q.quantize_linear(x, np.float32(0.5), output_dtype="float8e4m3fn",
                                      saturate=0, precision=10, opset=23)
    loaded = writers.read_tensor_proto(y_path.read_bytes())
    assert loaded.dtype == expected.dtype and _bits(loaded) == _bits(expected)


def _bits(array):
    return np.ascontiguousarray(array).tobytes()


# float8e4m3fn codes, by hand: 1.0 = 0x38, 1.5 = 0x3c, -2.5 = 0xc2, 0x7f and 0xff the two NaNs
F8_CODES = [0x38, 0x3C, 0xC2, 0x7F, 0xFF]


@pytest.mark.parametrize("extension", [".npz", ".pb", ".hex"])
def test_typed_files_round_trip(capsys, tmp_path, extension):
    """quantize -o y.<ext> then dequantize y.<ext>: float8 codes are read as float8, and
    the file holds exactly the bits of the API call."""
    x = np.array([1.0, 1.5, -2.5, np.nan, -np.nan], np.float32)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "s.npy", np.float32(0.5))
    y_path = tmp_path / f"y{extension}"
    code, out, err = run(capsys, "quantize", tmp_path / "x.npy", tmp_path / "s.npy",
                         "--output-dtype", "float8e4m3fn", "--x-type", "float", "-o", y_path)
    assert code == 0, err
    assert out.strip() == f"y: float8e4m3fn [5] -> {y_path}"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["x.npy", "s.npy", y_path.name])
    # x / 0.5 = 2, 3, -5: codes 0x40, 0x44, 0xca; NaN keeps its sign
    expected_codes = [0x40, 0x44, 0xCA, 0x7F, 0xFF]
    api = qemu_q.quantize_linear(x, np.float32(0.5), output_dtype="float8e4m3fn")
    assert list(api.view(np.uint8)) == expected_codes
    code, out, err = run(capsys, "dequantize", y_path, tmp_path / "s.npy",
                         "-o", tmp_path / "back.npy")
    assert code == 0, err
    back = np.load(tmp_path / "back.npy")
    assert list(back.view(np.uint32)) == [0x3F800000, 0x3FC00000, 0xC0200000, 0x7FC00000,
                                          0xFFC00000]


def test_untyped_uint8_needs_x_type(capsys, tmp_path):
    np.save(tmp_path / "codes.npy", np.array(F8_CODES, np.uint8))
    np.save(tmp_path / "s.npy", np.float32(1.0))
    code, _out, err = run(capsys, "dequantize", tmp_path / "codes.npy", tmp_path / "s.npy")
    assert_one_line_error(err, code, 2, "untyped uint8", "--x-type", "float8e4m3fn", "uint4")
    code, out, err = run(capsys, "dequantize", tmp_path / "codes.npy", tmp_path / "s.npy",
                         "--x-type", "float8e4m3fn", "-o", tmp_path / "y.npy")
    assert code == 0, err
    assert list(np.load(tmp_path / "y.npy")[:3]) == [1.0, 1.5, -2.5]
    # the zero point of an untyped x takes x's type when stored alike
    np.save(tmp_path / "zp.npy", np.array(0, np.uint8))
    code, out, err = run(capsys, "dequantize", tmp_path / "codes.npy", tmp_path / "s.npy",
                         tmp_path / "zp.npy", "--x-type", "float8e4m3fn")
    assert code == 0, err
    # uint8 is the type when said so
    code, out, err = run(capsys, "dequantize", tmp_path / "codes.npy", tmp_path / "s.npy",
                         "--x-type", "uint8")
    assert code == 0 and "[ 56.  60. 194. 127. 255.]" in out, err
    # a typed file and a contradicting --x-type
    np.savez(tmp_path / "plain.npz", x=np.array(F8_CODES, np.uint8))
    code, _out, err = run(capsys, "dequantize", f"{tmp_path / 'plain.npz'}:x",
                          tmp_path / "s.npy")
    assert_one_line_error(err, code, 2, "--x-type")
    y_path = tmp_path / "y.npz"
    assert run(capsys, "quantize", tmp_path / "s.npy", tmp_path / "s.npy", "--output-dtype",
               "int4", "-o", y_path)[0] == 0
    code, _out, err = run(capsys, "dequantize", y_path, tmp_path / "s.npy", "--x-type", "uint4")
    assert_one_line_error(err, code, 2, "--x-type uint4", "says int4")


@pytest.mark.parametrize("x_type, stored, message", [
    ("float4e2m1", [0x07, 0x87], "stored float4e2m1 codes: the array holds the code 0x87, wider than "
                                 "float4e2m1's 4 bits"),
    ("float6e2m3", [0x21, 0xA1], "stored float6e2m3 codes: the array holds the code 0xa1, wider than "
                                 "float6e2m3's 6 bits"),
    ("int4", [7, 23], "values out of the int4 range [-8, 7]"),
])
def test_stored_codes_wider_than_their_type_are_refused(capsys, tmp_path, x_type, stored, message):
    # a float4 byte 0x87 read by its low bits would be the code 0x7 (6.0): another value
    np.save(tmp_path / "codes.npy", np.array(stored, np.int8 if x_type == "int4" else np.uint8))
    np.save(tmp_path / "s.npy", np.float32(1.0))
    code, _out, err = run(capsys, "dequantize", tmp_path / "codes.npy", tmp_path / "s.npy", "--x-type", x_type)
    assert_one_line_error(err, code, 1, message)


@pytest.mark.parametrize("name, fragments", [
    ("y.npy", ["numpy has no float8e4m3fn dtype", "y.npz", "y.pb", "y.hex"]),
    ("y.txt", ["extension .txt", ".npy, .npz, .pb, .hex"]),
    ("y", ["extension (none)"]),
    ("outdir", ["is a directory"]),
])
def test_output_paths_refused(capsys, arrays, tmp_path, name, fragments):
    _x, p = arrays
    (tmp_path / "outdir").mkdir()
    before = sorted(tmp_path.iterdir())
    code, _out, err = run(capsys, "quantize", p["x"], p["s0"], "--output-dtype",
                          "float8e4m3fn", "-o", tmp_path / name)
    assert_one_line_error(err, code, 2, *fragments)
    assert sorted(tmp_path.iterdir()) == before  # nothing written, no y.npy.npy


def test_outputs_never_overwrite_inputs(capsys, arrays, tmp_path):
    _x, p = arrays
    before = p["x"].read_bytes()
    code, _out, err = run(capsys, "quantize", p["x"], p["s0"], "-o", p["x"])
    assert_one_line_error(err, code, 2, "-o", "would overwrite the input")
    assert p["x"].read_bytes() == before
    out = tmp_path / "g"
    assert run(capsys, "golden", "--out", out, "--op", "dynamic", "--format", "npz")[0] == 0
    manifest = (out / "manifest.json").read_bytes()
    code, _out, err = run(capsys, "verify", out, out, "--json", out / "manifest.json")
    assert_one_line_error(err, code, 2, "--json", "would overwrite a file in the input")
    assert (out / "manifest.json").read_bytes() == manifest
    code, _out, err = run(capsys, "quantize", p["x"], p["s0"], "-o", tmp_path / "no_dir" / "y.npy")
    assert_one_line_error(err, code, 1, "no such directory to write into", "no_dir")


def test_corrupt_input_files_are_named(capsys, arrays, tmp_path):
    _x, p = arrays
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not a zip file at all")
    code, _out, err = run(capsys, "quantize", "--npz", bad)
    assert_one_line_error(err, code, 1, "--npz: cannot read", "bad.npz")
    code, _out, err = run(capsys, "quantize", bad, p["s0"])
    assert_one_line_error(err, code, 1, "x: cannot read", "bad.npz")


def test_hex_output_is_the_named_file(capsys, arrays, tmp_path):
    x, p = arrays
    code, out, err = run(capsys, "quantize", p["x"], p["s0"], "--output-dtype", "int4",
                         "-o", tmp_path / "y.hex")
    assert code == 0, err
    assert not (tmp_path / "y.hex.npy").exists()
    text = (tmp_path / "y.hex").read_text()
    assert "// type: int4" in text and "// shape: [2, 4]" in text
    # int4 of x / 0.5 = 0, 3, 5, -5 | 600 (saturates to 7), NaN -> -8 (the minimum,
    # docs/semantics.md), -14 -> -8, 0.4 -> 0: nibbles, low first: 0 3 5 b | 7 8 8 0
    words = [line for line in text.splitlines() if not line.startswith("//")]
    assert words == ["0887b530"]


def test_float64_input(capsys, tmp_path):
    # 1 + 2^-8 + 2^-40: above the bfloat16 midpoint between 1 and 1 + 2^-7, which a cast
    # through float32 (round to nearest) would land on and round to even, down
    x = np.array([1.0, 1 + 2.0**-8 + 2.0**-40, 2.5], np.float64)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "s.npy", np.float32(1.0))
    argv = ["quantize", tmp_path / "x.npy", tmp_path / "s.npy"]
    code, _out, err = run(capsys, *argv)
    assert_one_line_error(err, code, 2, "float64", "--x-type float --cast")
    code, _out, err = run(capsys, *argv, "--x-type", "float")
    assert_one_line_error(err, code, 2, "--cast")
    code, out, err = run(capsys, *argv, "--x-type", "float", "--cast")
    assert code == 0, err
    assert out.splitlines()[1] == "[1 1 2]"  # 2.5 rounds to even
    code, _out, err = run(capsys, *argv, "--x-type", "int8", "--cast")
    assert_one_line_error(err, code, 2, "--cast converts to float types")
    bf16 = cli.cast_to(x, qemu_q.ELEMENT_TYPES["bfloat16"])
    assert list(bf16.view(np.uint16)) == [0x3F80, 0x3F81, 0x4020]
    f8 = cli.cast_to(np.array([1 + 2.0**-4 + 2.0**-40, 1 + 2.0**-4, -1e300]),
                     qemu_q.ELEMENT_TYPES["float8e4m3fn"])
    assert list(f8.view(np.uint8)) == [0x39, 0x38, 0xFF]


def test_printing_shows_codes(capsys, tmp_path):
    np.save(tmp_path / "codes.npy", np.array(F8_CODES, np.uint8))
    np.save(tmp_path / "s.npy", np.float32(1.0))
    np.save(tmp_path / "i4.npy", np.array([-1, 7, -8], np.int8))
    # dequantize with output float prints plain floats; the codes show when printing codes
    code, out, err = run(capsys, "quantize", tmp_path / "s.npy", tmp_path / "s.npy",
                         "--output-dtype", "float8e4m3fn")
    assert code == 0 and out.splitlines()[1] == "1.0(0x38)", err
    y = np.array(F8_CODES, np.uint8).view(qemu_q.ELEMENT_TYPES["float8e4m3fn"].dtype)
    assert cli.format_array(y) == "[1.0(0x38) 1.5(0x3c) -2.5(0xc2) nan(0x7f) nan(0xff)]"
    i4 = np.array([-1, 7, -8], np.int8).astype(INT4).reshape(1, 3)
    assert cli.format_array(i4) == "[[-1(0xf) 7(0x7) -8(0x8)]]"
    assert cli.format_array(np.array([1, 2], np.int8)) == "[1 2]"


def test_dequantize_with_types(capsys, arrays, tmp_path):
    _x, p = arrays
    y_path = tmp_path / "y.npy"
    code, out, err = run(capsys, "dequantize", p["codes"], p["s0"], "--x-type", "int4",
                         "--output-dtype", "float16", "-o", y_path)
    assert code == 0, err
    codes = np.array([1, -2, 7, -8, 3], np.int8).astype(INT4)
    expected = qemu_q.dequantize_linear(codes, np.float32(0.5), output_dtype="float16")
    y = np.load(y_path)
    assert y.dtype == np.float16 and np.array_equal(y, expected)


def test_npz_members_and_golden_cases(capsys, arrays, tmp_path):
    _x, p = arrays
    code, out, err = run(capsys, "quantize", f"{p['npz']}:x", f"{p['npz']}:scale")
    assert code == 0, err
    assert out.splitlines()[0] == "y: uint8 [6]"
    # re-run a golden case from its .npz: inputs, attributes and opset come from it
    out_dir = tmp_path / "g"
    assert run(capsys, "golden", "--out", out_dir, "--op", "dq", "--opset", "21", "--type",
               "int4", "--granularity", "blocked", "--format", "npz")[0] == 0
    (npz,) = (out_dir / "npz").glob("*.npz")
    y_path = tmp_path / "y.npy"
    code, out, err = run(capsys, "dequantize", "--npz", npz, "-o", y_path)
    assert code == 0, err
    _meta, stored = writers.read_npz(npz)
    assert np.array_equal(np.load(y_path), stored["expected_y"])


@pytest.mark.parametrize("argv, code, fragments", [
    (["quantize", "{x}"], 2, ["needs X and SCALE"]),
    (["quantize", "{tmp}/none.npy", "{s0}"], 1, ["no such file", "none.npy"]),
    (["quantize", "{x}", "{s0}", "--block-size", "2", "--opset", "13"], 1, ["block_size"]),
    (["quantize", "{x}", "{s0}", "--precision", "fp8"], 2, ["--precision"]),
    (["quantize", "{x}", "{s0}", "--saturate", "2"], 2, ["--saturate"]),
    (["quantize", "{x}", "{s0}", "--axis", "one"], 2, ["--axis"]),
    (["quantize", "{x}", "{s0}", "--output-dtype", "int3"], 2, ["int3"]),
    (["quantize", "{x}", "{s0}", "--opset", "9"], 2, ["opset 9"]),
    (["dequantize", "{codes}", "{s0}", "--opset", "29"], 2, ["opset 29"]),
    (["quantize", "{x}", "{s0}", "--x-type", "float99"], 2, ["float99"]),
    (["quantize", "{npz}", "{s0}"], 1, ["holds 2 arrays"]),
    (["quantize", "{npz}:y", "{s0}"], 1, ["no array 'y'"]),
    (["quantize", "{x}", "{s0}", "--npz", "{npz}"], 2, ["not both"]),
    (["quantize", "--npz", "{tmp}/none.npz"], 1, ["no such file"]),
    (["dequantize", "{codes}", "{s0}", "--x-type", "int3"], 2, ["int3"]),
    (["dequantize", "{void}", "{s0}"], 2, ["--x-type"]),
    (["dequantize", "{codes}", "{s0}", "--x-type", "int2"], 1, ["int2"]),
    # int8 data named bfloat16: the message names x and the option
    (["dequantize", "{codes}", "{s0}", "--x-type", "bfloat16"], 2,
     ["x (--x-type bfloat16)", "uint16 bit patterns, got int8"]),
    (["run", "{x}", "--input", "x={x}", "--dump", "{tmp}/dump"], 1, ["x.npy: not an ONNX model"]),
])
def test_apply_errors(capsys, arrays, tmp_path, argv, code, fragments):
    _x, p = arrays
    np.save(tmp_path / "void.npy", np.zeros(3, dtype="V1"))
    names = {"x": p["x"], "s0": p["s0"], "npz": p["npz"], "codes": p["codes"],
             "void": tmp_path / "void.npy", "tmp": tmp_path}
    argv = [a.format(**{k: str(v) for k, v in names.items()}) for a in argv]
    got, _out, err = run(capsys, *argv)
    assert_one_line_error(err, got, code, *fragments)


# --------------------------------------------------------------------------------------
# spec


def test_spec(capsys):
    code, out, _ = run(capsys, "spec", "QuantizeLinear", "--opset", "20")
    assert code == 0
    assert out.strip() == qemu_q.get_spec("QuantizeLinear", 20).describe()
    code, out, _ = run(capsys, "spec", "dq")
    assert code == 0 and out.startswith("DequantizeLinear, since opset 28")


@pytest.mark.parametrize("argv, fragments", [
    (["spec"], ["OP"]),
    (["spec", "Conv"], ["unknown op"]),
    (["spec", "q", "--opset", "29"], ["opset 29"]),
])
def test_spec_errors(capsys, argv, fragments):
    code, _out, err = run(capsys, *argv)
    assert_one_line_error(err, code, 2, *fragments)


# --------------------------------------------------------------------------------------
# golden --datapath FILE.json (docs/golden.md, "A described datapath")

TIES_AWAY_RECIPROCAL = {"rounding": "half_away", "scale": "reciprocal", "scale_precision": "float32"}
DATAPATH_SELECTION = ["--op", "q", "--opset", "21", "--type", "int8", "--granularity",
                      "per_tensor", "--variant", "base"]


def _datapath_file(tmp_path, fields, name="dp.json"):
    path = tmp_path / name
    path.write_text(json.dumps(fields) if not isinstance(fields, str) else fields)
    return path


def test_golden_datapath_writes_npz_and_hex_with_the_datapath(capsys, tmp_path):
    import datapath_oracle
    from qemu_q.golden import datapaths

    out = tmp_path / "g"
    dp_file = _datapath_file(tmp_path, TIES_AWAY_RECIPROCAL)
    code, stdout, err = run(capsys, "golden", "--out", out, "--datapath", dp_file,
                            *DATAPATH_SELECTION)
    assert code == 0, err
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["datapath"] == {
        "rounding": "half_away", "scale": "reciprocal", "scale_precision": "float32",
        "nan": "spec", "nan_to_integer": "min", "subnormals": "keep", "accumulator": "int32",
        "requantization": None, "by_version": [], "float8_encoder": "exact"}
    assert manifest["datapath_is_onnx"] is False
    assert "not written" in manifest["onnx_folders"] and manifest["formats"] == ["npz", "hex"]
    assert not list(out.rglob("*.onnx")) and not list(out.rglob("*.pb"))
    assert list(out.rglob("*.hex"))
    dp = qemu_q.Datapath(**TIES_AWAY_RECIPROCAL)
    differs = 0
    assert len(manifest["cases"]) == 6
    for entry in manifest["cases"]:
        assert entry["onnx_dir"] is None and entry["runs_on"] == [] and entry["divergences"] == []
        meta, arrays = writers.read_npz(out / entry["npz"])
        x, scale, zp = arrays["x"], arrays["y_scale"], arrays["y_zero_point"]
        y = arrays["expected_y"]
        direct = qemu_q.quantize_linear(x, scale, zp, opset=21, datapath=dp)
        assert y.dtype == direct.dtype and y.tobytes() == direct.tobytes(), entry["name"]
        # and from the definition (tests/datapath_oracle.py), not from the op
        codes = datapath_oracle.quantize_array(x, float(scale.reshape(-1)[0]), int(zp.reshape(-1)[0]),
                                               "int8", TIES_AWAY_RECIPROCAL | {"nan": "spec",
                                               "nan_to_integer": "min", "subnormals": "keep"},
                                               precision="float", x_type="float", opset=21)
        assert y.view(np.uint8).tolist() == codes.astype(np.uint8).tolist(), entry["name"]
        onnx_bits = qemu_q.quantize_linear(x, scale, zp, opset=21)
        differs += int(onnx_bits.tobytes() != y.tobytes())
        hexed = writers.read_hex((out / entry["outputs"][0]["hex"]).read_text(), "int8", y.shape)
        assert hexed.tobytes() == y.tobytes()
    assert differs >= 2  # the datapath changed the grid and near-tie cases
    assert datapaths.FIELDS == tuple(manifest["datapath"])


def test_golden_datapath_case_files_name_their_datapath(capsys, tmp_path):
    """A case .npz of a described datapath says so in its meta; `quantize --npz` (the
    ONNX op) refuses it rather than give other bits than the file's own."""
    fields = {"rounding": "half_away", "scale": "reciprocal", "scale_precision": "float32"}
    dp_file = _datapath_file(tmp_path, fields)
    out = tmp_path / "g"
    assert run(capsys, "golden", "--out", out, "--datapath", dp_file, "--op", "q", "--opset", "21",
               "--type", "int4", "--family", "near_ties")[0] == 0
    case = out / "npz" / "test_quantizelinear_21_int4_near_ties.npz"
    meta, _arrays = writers.read_npz(str(case))
    assert {k: meta["datapath"][k] for k in fields} == fields
    code, _out, err = run(capsys, "quantize", "--npz", case, "-o", tmp_path / "y.npz")
    assert_one_line_error(err, code, 1, "a case of a described datapath", "qemu_q.quantize_linear")
    assert not (tmp_path / "y.npz").exists()


def test_golden_default_datapath_file_changes_no_byte(capsys, tmp_path):
    selection = ["--op", "q", "--opset", "21", "--type", "uint8", "--family", "grid"]
    assert run(capsys, "golden", "--out", tmp_path / "a", *selection)[0] == 0
    code, _, err = run(capsys, "golden", "--out", tmp_path / "b", "--datapath",
                       _datapath_file(tmp_path, {}), *selection)
    assert code == 0, err
    a = {p.relative_to(tmp_path / "a"): p.read_bytes() for p in (tmp_path / "a").rglob("*")
         if p.is_file()}
    b = {p.relative_to(tmp_path / "b"): p.read_bytes() for p in (tmp_path / "b").rglob("*")
         if p.is_file()}
    assert a.keys() == b.keys() and any(p.suffix == ".onnx" for p in a)
    for path in a:
        if path.name != "manifest.json":
            assert a[path] == b[path], path
    manifest = json.loads(b[pathlib.Path("manifest.json")])
    assert manifest["datapath_is_onnx"] is True and "onnx_folders" not in manifest


def test_golden_stochastic_datapath_writes_its_words(capsys, tmp_path):
    import hashlib

    out = tmp_path / "g"
    code, _, err = run(capsys, "golden", "--out", out, "--datapath",
                       _datapath_file(tmp_path, {"rounding": "stochastic"}), "--seed", "3",
                       "--op", "q", "--opset", "21", "--type", "int8", "--family", "near_ties",
                       "--variant", "base")
    assert code == 0, err
    manifest = json.loads((out / "manifest.json").read_text())
    assert "random_bits" in manifest and "sha256" in manifest["random_bits"]
    (entry,) = manifest["cases"]
    assert [t["name"] for t in entry["inputs"]] == ["x", "y_scale", "y_zero_point", "random_bits"]
    _, arrays = writers.read_npz(out / entry["npz"])
    x, words = arrays["x"], arrays["random_bits"]
    # The rule as the manifest states it, written out here.
    digest = hashlib.sha256(f"3:{entry['name']}:random_bits".encode()).digest()
    rng = np.random.default_rng(int.from_bytes(digest[:8], "little"))
    assert words.dtype == np.uint32 and words.tolist() == \
        rng.integers(0, 2**32, x.shape, dtype=np.uint32).tolist()
    direct = qemu_q.quantize_linear(x, arrays["y_scale"], arrays["y_zero_point"], opset=21,
                                    datapath=qemu_q.Datapath(rounding="stochastic"),
                                    random_bits=words)
    assert arrays["expected_y"].tobytes() == direct.tobytes()


def test_golden_datapath_leaves_out_ops_without_datapath(capsys, tmp_path):
    out = tmp_path / "g"
    code, _, err = run(capsys, "golden", "--out", out, "--datapath",
                       _datapath_file(tmp_path, {"rounding": "up"}), "--op", "q,dynamic",
                       "--opset", "21", "--type", "uint8", "--family", "random", "--variant",
                       "base")
    assert code == 0, err
    manifest = json.loads((out / "manifest.json").read_text())
    assert [c["op_type"] for c in manifest["cases"]] == ["QuantizeLinear"]
    assert "DynamicQuantizeLinear" in manifest["datapath_omitted_ops"]


def test_golden_datapath_list_has_no_divergence_notes(capsys, tmp_path):
    code, out, _ = run(capsys, "golden", "--list", "--datapath",
                       _datapath_file(tmp_path, {"rounding": "down"}), "--op", "q",
                       "--opset", "21", "--type", "uint8", "--family", "overflow")
    assert code == 0 and out.strip() and "[divergence" not in out


@pytest.mark.parametrize("content, code, fragments", [
    ('{"roundin": "half_away"}', 2, ["unknown key 'roundin'", "rounding"]),
    ('{"rounding": "half"}', 2, ["rounding='half'", "half_away"]),
    ('{"rounding": 1}', 2, ["rounding=1", "string"]),
    ('{"scale": "reciprocal"}', 2, ["scale_precision"]),
    ('{"accumulator": "int99"}', 2, ["accumulator", "int99"]),
    ('["half_away"]', 2, ["JSON object", "list"]),
    ('{"rounding": ', 2, ["not valid JSON"]),
    # JSON readers disagree on a repeated key: refused, in by_version's objects too
    ('{"rounding": "half_away", "rounding": "half_even"}', 2, ["'rounding' is given twice"]),
    ('{"by_version": [["QuantizeLinear", 19, 21, {"rounding": "up", "rounding": "down"}]]}', 2,
     ["'rounding' is given twice"]),
    ("[" * 100000, 2, ["nested too deeply"]),
    (None, 1, ["No such file"]),
])
def test_golden_datapath_file_errors(capsys, tmp_path, content, code, fragments):
    path = tmp_path / "missing.json" if content is None else _datapath_file(tmp_path, content)
    got, _out, err = run(capsys, "golden", "--out", tmp_path / "g", "--datapath", path,
                         "--op", "q", "--opset", "21")
    assert_one_line_error(err, got, code, *fragments)
    assert not (tmp_path / "g").exists()


def test_golden_datapath_option_combinations(capsys, tmp_path):
    dp_file = _datapath_file(tmp_path, {"rounding": "up"})
    got, _out, err = run(capsys, "golden", "--out", tmp_path / "g", "--datapath", dp_file,
                         "--format", "onnx,npz", "--op", "q", "--opset", "21")
    assert_one_line_error(err, got, 2, "--format onnx", "non-default")
    got, _out, err = run(capsys, "golden", "--out", tmp_path / "g", "--datapath", dp_file,
                         "--op", "dynamic")
    assert_one_line_error(err, got, 2, "no case that takes a datapath", "DynamicQuantizeLinear")
    assert not (tmp_path / "g").exists()


def test_golden_stochastic_datapath_words_for_qlinear_and_block_scaled(capsys, tmp_path):
    # The QLinear ops round y's elements: one word per element of y (a 1-D operand's
    # dimension dropped); the MX and NVFP4 quantizers round x's: an extra beside x.
    import hashlib

    out = tmp_path / "g"
    code, _, err = run(capsys, "golden", "--out", out, "--datapath",
                       _datapath_file(tmp_path, {"rounding": "stochastic"}), "--seed", "5",
                       "--op", "qlinearmatmul,mx,nvfp4", "--opset", "24", "--type",
                       "int8,float8e4m3fn,float4e2m1", "--family", "random")
    assert code == 0, err
    manifest = json.loads((out / "manifest.json").read_text())
    seen = set()
    for entry in manifest["cases"]:
        _, arrays = writers.read_npz(out / entry["npz"])
        digest = hashlib.sha256(f"5:{entry['name']}:random_bits".encode()).digest()
        rng = np.random.default_rng(int.from_bytes(digest[:8], "little"))
        dp = qemu_q.Datapath(rounding="stochastic")
        if entry["op_type"] == "QLinearMatMul":
            y = arrays["expected_y"]
            words = arrays["random_bits"]
            assert words.shape == y.shape
            assert words.tolist() == rng.integers(0, 2**32, y.shape, dtype=np.uint32).tolist()
            names = ["a", "a_scale", "a_zero_point", "b", "b_scale", "b_zero_point", "y_scale", "y_zero_point"]
            direct = qemu_q.qlinear_matmul(*[arrays[n] for n in names], opset=entry["opset"],
                                           datapath=dp, random_bits=words)
            assert direct.tobytes() == y.tobytes()
        else:
            x, words = arrays["extra_x"], arrays["extra_random_bits"]
            assert words.tolist() == rng.integers(0, 2**32, x.shape, dtype=np.uint32).tolist()
            if entry["op_type"] == "MX":
                codes, scales = qemu_q.mx_quantize(x, entry["inputs"][0]["type"], axis=-1, block_size=32,
                                                   scale_rule=entry["name"].split("_")[4], datapath=dp,
                                                   random_bits=words)
                assert codes.tobytes() == arrays["codes"].tobytes()
                assert scales.tobytes() == arrays["scales"].tobytes()
        seen.add(entry["op_type"])
    assert seen == {"QLinearMatMul", "MX", "NVFP4"}


def test_qlinear_matmul_random_bits_take_y_shape_with_1d_operands():
    a = np.array([3, -7, 11, -4], np.int8)
    b = np.arange(-8, 12, dtype=np.int8).reshape(4, 5)
    dp = qemu_q.Datapath(rounding="stochastic")
    args = (a, np.float32(0.5), np.int8(0), b, np.float32(0.25), np.int8(0), np.float32(3.0), np.int8(0))
    # acc = a @ b = [-9, -6, -3, 0, 3]; y = acc * 0.5 * 0.25 / 3 = acc / 24. The word is
    # added to the magnitude's dropped bits: 0 truncates, 2**32 - 1 carries any fraction.
    acc = [sum(int(a[k]) * int(b[k, j]) for k in range(4)) for j in range(5)]
    assert acc == [-9, -6, -3, 0, 3]
    for word in (0, 2**32 - 1):
        y = qemu_q.qlinear_matmul(*args, datapath=dp, random_bits=np.full((5,), word, np.uint32))
        assert y.shape == (5,)
        magnitudes = [abs(v) // 24 + (1 if word and abs(v) % 24 else 0) for v in acc]
        assert y.tolist() == [-m if v < 0 else m for m, v in zip(magnitudes, acc)]
    with pytest.raises(ValueError, match=r"random_bits has shape \(1, 5\); y has shape \(5,\)"):
        qemu_q.qlinear_matmul(*args, datapath=dp, random_bits=np.zeros((1, 5), np.uint32))
