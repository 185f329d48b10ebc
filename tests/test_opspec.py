import dataclasses
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import qemu_q

from qemu_q._opspec import (
    NEWEST_OPSET,
    OP_VERSIONS,
    FormalParameter,
    OpSpec,
    first_version_allowing,
    first_version_with_attribute,
    get_spec,
)

PAIRS = [(op, version) for op, versions in OP_VERSIONS.items() for version in versions]
OPS = sorted(OP_VERSIONS)


@pytest.fixture
def defs():
    return pytest.importorskip("onnx.defs", reason="onnx is needed to compare with its schemas")


def onnx_attributes(schema):
    result = {}
    for name, attr in schema.attributes.items():
        default = attr.default_value
        # an AttributeProto with no type set means the schema gives no default
        if default.type == 0:
            result[name] = None
        else:
            assert default.type in (default.INT, default.STRING), f"{schema.name}.{name}"
            result[name] = default.i if default.type == default.INT else default.s.decode()
    return result


def test_table_has_the_seventeen_pairs():
    assert OP_VERSIONS == {
        "QuantizeLinear": (10, 13, 19, 21, 23, 24, 25, 28),
        "DequantizeLinear": (10, 13, 19, 21, 23, 24, 25, 28),
        "DynamicQuantizeLinear": (11,),
        "MatMulInteger": (10,),
        "ConvInteger": (10,),
        "QLinearMatMul": (10, 21),
        "QLinearConv": (10,),
        "Cast": (1, 6, 9, 13, 19, 21, 23, 24, 25, 28),
        "CastLike": (15, 19, 21, 23, 24, 25),
    }
    assert len(PAIRS) == 38
    assert NEWEST_OPSET == 28


def test_table_lists_every_onnx_version(defs):
    found = {op: set() for op in OPS}
    for schema in defs.get_all_schemas_with_history():
        if schema.domain == "" and schema.name in found and schema.since_version <= NEWEST_OPSET:
            found[schema.name].add(schema.since_version)
    assert {op: tuple(sorted(v)) for op, v in found.items()} == dict(OP_VERSIONS)


@pytest.mark.parametrize("op_type, version", PAIRS)
def test_spec_matches_onnx_schema(defs, op_type, version):
    schema = defs.get_schema(op_type, version)
    assert schema.since_version == version
    spec = get_spec(op_type, version)
    assert spec.op_type == op_type
    assert spec.since_version == version

    def params(formal_parameters):
        return [
            (p.name, p.type_str, p.option == defs.OpSchema.FormalParameterOption.Optional)
            for p in formal_parameters
        ]

    assert [(p.name, p.type_param, p.optional) for p in spec.inputs] == params(schema.inputs)
    assert [(p.name, p.type_param, p.optional) for p in spec.outputs] == params(schema.outputs)
    assert dict(spec.attributes) == onnx_attributes(schema)
    assert dict(spec.type_constraints) == {
        c.type_param_str: frozenset(c.allowed_type_strs) for c in schema.type_constraints
    }


@pytest.mark.parametrize("op_type", OPS)
@pytest.mark.parametrize("opset", range(1, NEWEST_OPSET + 1))
def test_opset_resolves_like_onnx(defs, op_type, opset):
    try:
        expected = defs.get_schema(op_type, opset).since_version
    except defs.SchemaError:
        with pytest.raises(ValueError, match="is older than all of them"):
            get_spec(op_type, opset)
    else:
        assert get_spec(op_type, opset).since_version == expected


@pytest.mark.parametrize("op_type", OPS)
@pytest.mark.parametrize("param", ["inputs", "outputs"])
def test_first_version_allowing_matches_onnx(defs, op_type, param):
    versions = OP_VERSIONS[op_type]
    schemas = [defs.get_schema(op_type, v) for v in versions]
    all_types = {t for s in schemas for c in s.type_constraints for t in c.allowed_type_strs}
    all_types |= {"tensor(float)", "tensor(double)", "tensor(string)"}
    for name in {p.name for s in schemas for p in getattr(s, param)}:
        for type_str in sorted(all_types):
            expected = None
            for schema in schemas:
                formal = next(p for p in getattr(schema, param) if p.name == name)
                constraint = {c.type_param_str: c.allowed_type_strs for c in schema.type_constraints}
                allowed = constraint.get(formal.type_str, [formal.type_str])
                if type_str in allowed:
                    expected = schema.since_version
                    break
            assert first_version_allowing(op_type, name, type_str) == expected, (name, type_str)


@pytest.mark.parametrize("op_type", OPS)
def test_first_version_with_attribute_matches_onnx(defs, op_type):
    schemas = [defs.get_schema(op_type, v) for v in OP_VERSIONS[op_type]]
    names = {a for s in schemas for a in s.attributes} | {"no_such_attribute"}
    for name in names:
        expected = next((s.since_version for s in schemas if name in s.attributes), None)
        assert first_version_with_attribute(op_type, name) == expected, name


def test_core_imports_without_onnx():
    # The whole package, not only the table, and with onnx made unimportable; run from
    # the directory holding the qemu_q under test (installed or built in place).
    import qemu_q

    home = pathlib.Path(qemu_q.__file__).resolve().parents[1]
    code = (
        "import sys; sys.modules['onnx'] = None; sys.modules['onnxruntime'] = None\n"
        "import numpy as np, qemu_q\n"
        "y = qemu_q.quantize_linear(np.array([1.5], np.float32), np.float32(1.0), np.int8(0))\n"
        "assert y.tolist() == [2], y\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=home)


@pytest.mark.parametrize("opset", [None, NEWEST_OPSET])
def test_newest_is_the_default(opset):
    assert get_spec("QuantizeLinear", opset).since_version == 28
    assert get_spec("DequantizeLinear", opset).since_version == 28
    assert get_spec("DynamicQuantizeLinear", opset).since_version == 11


@pytest.mark.parametrize("op_type", [1, None, b"QuantizeLinear"])
def test_op_type_must_be_str(op_type):
    with pytest.raises(TypeError, match="op_type must be a str"):
        get_spec(op_type)


@pytest.mark.parametrize("opset", [True, False, 13.0, "13"])
def test_opset_must_be_int(opset):
    with pytest.raises(TypeError, match="opset must be an int or None, got"):
        get_spec("QuantizeLinear", opset)


def test_unknown_op_names_the_known_ops():
    with pytest.raises(ValueError) as info:
        get_spec("quantizelinear", 13)
    message = str(info.value)
    assert "'quantizelinear'" in message
    for op in OPS:
        assert op in message


def test_opset_older_than_first_version():
    with pytest.raises(ValueError) as info:
        get_spec("QuantizeLinear", 9)
    assert str(info.value) == (
        "QuantizeLinear has versions 10, 13, 19, 21, 23, 24, 25, 28; "
        "opset 9 is older than all of them"
    )
    with pytest.raises(ValueError, match=r"DynamicQuantizeLinear has versions 11; opset 10 "):
        get_spec("DynamicQuantizeLinear", 10)


@pytest.mark.parametrize("opset", [0, -1])
def test_opset_below_one(opset):
    with pytest.raises(ValueError, match=rf"versions 10, .*, 28; opset {opset} is not an opset"):
        get_spec("DequantizeLinear", opset)


def test_opset_above_newest():
    with pytest.raises(ValueError, match=r"opset 29 is newer than the newest .* \(28\)"):
        get_spec("DequantizeLinear", 29)


@pytest.mark.parametrize(
    "op_type, version, granularities, division, multiplication, output_rule, saturates",
    [
        ("QuantizeLinear", 10, {"per_tensor"}, "float32", None, "zero_point_or_uint8", False),
        ("QuantizeLinear", 13, {"per_tensor", "per_axis"}, "float32", None,
         "zero_point_or_uint8", False),
        ("QuantizeLinear", 19, {"per_tensor", "per_axis"}, "scale", None,
         "zero_point_or_uint8", True),
        ("QuantizeLinear", 21, {"per_tensor", "per_axis", "blocked"}, "scale", None,
         "output_dtype_or_zero_point_or_uint8", True),
        ("QuantizeLinear", 23, {"per_tensor", "per_axis", "blocked"}, "precision_or_scale", None,
         "output_dtype_or_zero_point_or_uint8", True),
        ("QuantizeLinear", 28, {"per_tensor", "per_axis", "blocked"}, "precision_or_scale", None,
         "output_dtype_or_zero_point_or_uint8", True),
        ("DequantizeLinear", 10, {"per_tensor"}, None, "float32", "float32", False),
        ("DequantizeLinear", 13, {"per_tensor", "per_axis"}, None, "float32", "float32", False),
        ("DequantizeLinear", 19, {"per_tensor", "per_axis"}, None, "scale", "scale", False),
        ("DequantizeLinear", 21, {"per_tensor", "per_axis", "blocked"}, None, "scale", "scale",
         False),
        ("DequantizeLinear", 24, {"per_tensor", "per_axis", "blocked"}, None,
         "output_dtype_or_scale", "output_dtype_or_scale", False),
        ("DynamicQuantizeLinear", 11, {"per_tensor"}, None, None, "uint8", False),
        ("MatMulInteger", 10, {"per_tensor"}, None, None, "int32", False),
        ("ConvInteger", 10, {"per_tensor"}, None, None, "int32", False),
        ("QLinearMatMul", 10, {"per_tensor"}, None, None, "zero_point", False),
        ("QLinearMatMul", 21, {"per_tensor"}, None, None, "zero_point", False),
        ("QLinearConv", 10, {"per_tensor"}, None, None, "zero_point", False),
    ],
)
def test_semantic_fields(
    op_type, version, granularities, division, multiplication, output_rule, saturates
):
    spec = get_spec(op_type, version)
    assert spec.granularities == granularities
    assert spec.division_precision == division
    assert spec.multiplication_precision == multiplication
    assert spec.output_type_rule == output_rule
    float8 = {
        "tensor(float8e4m3fn)",
        "tensor(float8e4m3fnuz)",
        "tensor(float8e5m2)",
        "tensor(float8e5m2fnuz)",
    }
    assert spec.saturate_types == (float8 if saturates else set())
    # saturate is meaningful exactly when the attribute exists
    assert bool(spec.saturate_types) == ("saturate" in spec.attributes)


@pytest.mark.parametrize("op_type, version", PAIRS)
def test_granularities_follow_attributes(op_type, version):
    spec = get_spec(op_type, version)
    assert ("per_axis" in spec.granularities) == ("axis" in spec.attributes)
    assert ("blocked" in spec.granularities) == ("block_size" in spec.attributes)
    assert "per_tensor" in spec.granularities


def test_allowed_types_resolves_type_params():
    ql21 = get_spec("QuantizeLinear", 21)
    t1 = {"tensor(float)", "tensor(float16)", "tensor(bfloat16)", "tensor(int32)"}
    assert ql21.allowed_types("x") == t1
    assert ql21.allowed_types("y_scale") == t1
    assert ql21.allowed_types("y") == ql21.allowed_types("y_zero_point")
    assert "tensor(int4)" in ql21.allowed_types("y")
    assert get_spec("QuantizeLinear", 10).allowed_types("y_scale") == {"tensor(float)"}
    assert get_spec("DequantizeLinear", 13).allowed_types("y") == {"tensor(float)"}
    dynamic = get_spec("DynamicQuantizeLinear")
    assert dynamic.allowed_types("y_scale") == {"tensor(float)"}
    assert dynamic.allowed_types("y_zero_point") == {"tensor(uint8)"}
    with pytest.raises(ValueError, match=r"no input or output named 'scale'.*x, y_scale"):
        ql21.allowed_types("scale")


def test_input_index():
    spec = get_spec("DequantizeLinear", 21)
    assert [spec.input_index(n) for n in ("x", "x_scale", "x_zero_point")] == [0, 1, 2]
    with pytest.raises(ValueError, match=r"no input named 'y'; its inputs are x, x_scale"):
        spec.input_index("y")


@pytest.mark.parametrize(
    "op_type, name, type_str, expected",
    [
        ("QuantizeLinear", "y", "tensor(int8)", 10),
        ("QuantizeLinear", "y", "tensor(float8e4m3fn)", 19),
        ("QuantizeLinear", "y", "tensor(int4)", 21),
        ("QuantizeLinear", "y", "tensor(float4e2m1)", 23),
        ("QuantizeLinear", "y", "tensor(int2)", 25),
        ("QuantizeLinear", "y", "tensor(float6e2m3)", 28),
        ("QuantizeLinear", "y", "tensor(int32)", None),
        ("QuantizeLinear", "x", "tensor(float16)", 19),
        ("QuantizeLinear", "y_scale", "tensor(float8e8m0)", 24),
        ("DequantizeLinear", "x", "tensor(int32)", 10),
        ("DequantizeLinear", "x_scale", "tensor(float8e8m0)", 24),
        ("DequantizeLinear", "y", "tensor(bfloat16)", 19),
        ("DequantizeLinear", "y", "tensor(double)", None),
        ("DynamicQuantizeLinear", "y", "tensor(uint8)", 11),
        ("DynamicQuantizeLinear", "y", "tensor(int8)", None),
    ],
)
def test_first_version_allowing(op_type, name, type_str, expected):
    assert first_version_allowing(op_type, name, type_str) == expected


def test_first_version_allowing_errors():
    with pytest.raises(ValueError, match=r"no input or output named 'scale'"):
        first_version_allowing("QuantizeLinear", "scale", "tensor(float)")
    with pytest.raises(ValueError, match="unknown op 'Quantize'"):
        first_version_allowing("Quantize", "y", "tensor(int8)")


@pytest.mark.parametrize(
    "op_type, attr, expected",
    [
        ("QuantizeLinear", "axis", 13),
        ("QuantizeLinear", "saturate", 19),
        ("QuantizeLinear", "block_size", 21),
        ("QuantizeLinear", "output_dtype", 21),
        ("QuantizeLinear", "precision", 23),
        ("DequantizeLinear", "output_dtype", 23),
        ("DequantizeLinear", "saturate", None),
        ("DynamicQuantizeLinear", "axis", None),
    ],
)
def test_first_version_with_attribute(op_type, attr, expected):
    assert first_version_with_attribute(op_type, attr) == expected


def test_specs_are_read_only_and_hashable():
    spec = get_spec("QuantizeLinear", 21)
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.since_version = 22
    with pytest.raises(TypeError):
        spec.attributes["axis"] = 0
    with pytest.raises(TypeError):
        spec.type_constraints["T3"] = frozenset()
    assert isinstance(spec, OpSpec)
    assert all(isinstance(p, FormalParameter) for p in spec.inputs + spec.outputs)
    assert {spec, get_spec("QuantizeLinear", 22)} == {spec}


@pytest.mark.parametrize("op_type, version", PAIRS)
def test_describe_mentions_every_field(op_type, version):
    spec = get_spec(op_type, version)
    text = spec.describe()
    assert text.splitlines()[0] == f"{op_type}, since opset {version}"
    for param in spec.inputs + spec.outputs:
        assert f"{param.name}: {param.type_param}" in text
    for name in spec.attributes:
        assert name in text
    for allowed in spec.type_constraints.values():
        for type_str in allowed:
            assert type_str in text
    assert spec.output_type_rule in text


# ------------------------------------------------ the float8 tables of each Cast version

def cast_float8_rows(doc: str) -> dict[int, dict[str, dict[str, str]]]:
    """The two float8 tables of a Cast doc: {saturate: {row: {format: result}}}, read from
    the markdown ("\\[x\\] > FLT_MAX" becomes "[x] > FLT_MAX")."""
    tables, current, header = [], None, None
    for line in doc.splitlines():
        cells = [c.strip().replace("\\", "") for c in line.strip().strip("|").split("|")]
        if line.startswith("| x ") and "E4M3FN" in line:
            header, current = cells[1:], {}
            tables.append(current)
        elif current is not None and line.startswith("|") and not set(cells[0]) <= {"-", " "}:
            current[cells[0]] = dict(zip(header, cells[1:]))
        elif current is not None and not line.startswith("|"):
            current = None
    saturating, non_saturating = tables[:2]  # the doc's order: saturate=1, then saturate=0
    return {1: saturating, 0: non_saturating}


def test_cast_float8_tables_match_the_cast_docs(defs):
    from qemu_q._opspec import CAST_FLOAT8_TABLES, cast_float8_table

    versions = sorted({s.since_version for s in defs.get_all_schemas_with_history()
                       if s.name == "Cast" and s.domain == "" and s.since_version >= 19})
    assert [t.since_version for t in CAST_FLOAT8_TABLES] == versions
    for table in CAST_FLOAT8_TABLES:
        rows = cast_float8_rows(defs.get_schema("Cast", table.since_version).doc)
        for fmt in ("E4M3FNUZ", "E5M2FNUZ"):
            assert rows[1]["Inf"][fmt] == ("NaN" if table.fnuz_inf_to_nan else "FLT_MAX")
            assert rows[1]["-Inf"][fmt] == ("NaN" if table.fnuz_inf_to_nan else "-FLT_MAX")
        for fmt in ("E4M3FN", "E5M2"):
            assert (rows[0].get("-NaN", {}).get(fmt) == "-NaN") == table.negative_nan_row
        assert "-NaN" not in rows[1]  # the saturate=1 table has no sign row for NaN
    assert cast_float8_table(None) is CAST_FLOAT8_TABLES[-1]
    assert [cast_float8_table(n).since_version for n in (19, 20, 22, 23, 24, 26, 27, 28)] == [
        19, 19, 21, 23, 24, 25, 25, 28]


def test_the_oracle_transcribes_the_cast_docs(defs):
    # tests/float_oracle.py's CAST_ROWS are the tests' reading of the tables: every row
    # they name, as the doc of every version writes it.
    import float_oracle as fo

    names = {"float8_e4m3fn": "E4M3FN", "float8_e4m3fnuz": "E4M3FNUZ",
             "float8_e5m2": "E5M2", "float8_e5m2fnuz": "E5M2FNUZ"}
    doc_row = {"NaN": "NaN", "-NaN": "-NaN", "Inf": "Inf", "-Inf": "-Inf",
               ">max": "[x] > FLT_MAX", "<-max": "[x] < -FLT_MAX"}
    for version in (19, 21, 23, 24, 25, 28):
        rows = cast_float8_rows(defs.get_schema("Cast", version).doc)
        for saturate in (0, 1):
            for row, text in doc_row.items():
                for name, column in names.items():
                    if saturate and row == "-NaN":
                        continue  # no such row: the oracle's reading is in docs/semantics.md
                    got = fo.cast_row(name, row, saturate, version)
                    assert got == rows[saturate][text][column], (version, saturate, row, name)


# --- the table's rules are data the code reads -------------------------------------------------


def _attribute_reads_outside_opspec() -> set[str]:
    """Every `.name` attribute access in the qemu_q package's Python sources outside
    _opspec.py (which defines the table and may mention its fields freely), plus the
    `self.name` reads of the table classes' own methods (allowed_types reads
    type_constraints for every caller)."""
    import ast

    package = pathlib.Path(qemu_q.__file__).resolve().parent
    names = set()
    for path in package.rglob("*.py"):
        tree = ast.parse(path.read_text(), str(path))
        if path.name == "_opspec.py":
            for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
                for method in (n for n in cls.body if isinstance(n, ast.FunctionDef)):
                    if method.name in ("__hash__", "describe"):
                        continue  # identity and printing apply no rule
                    names.update(n.attr for n in ast.walk(method) if isinstance(n, ast.Attribute)
                                 and isinstance(n.value, ast.Name) and n.value.id == "self")
            continue
        names.update(n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute))
    return names


@pytest.mark.parametrize("table_class", ["OpSpec", "CastFloat8Table"])
def test_every_table_field_is_read(table_class):
    # A field nothing reads is a rule stated as data that no code applies.
    import dataclasses

    from qemu_q import _opspec

    fields = {f.name for f in dataclasses.fields(getattr(_opspec, table_class))}
    unread = sorted(fields - _attribute_reads_outside_opspec())
    assert not unread, f"{table_class} fields no module outside _opspec.py reads: {unread}"


def test_python_enums_are_the_kernels():
    # qemu_q/_dtypes.py takes the kernels' enumerations from the compiled code: every one
    # it names must be the exported value, and every format id must decode as ml_dtypes does.
    from qemu_q import _dequantize, _dtypes
    from qemu_q._parallel import ENUMS

    for name, value in ENUMS.items():
        if hasattr(_dtypes, name):
            assert getattr(_dtypes, name) == value, name
    for etype in qemu_q.ELEMENT_TYPES.values():
        if etype.kind != "small_float":
            continue
        table = _dequantize.decode_table(etype.small_float_id)
        codes = np.arange(1 << etype.bits, dtype=np.uint8)
        # ml_dtypes keeps a sub-byte value in the low bits of its byte.
        expected = codes.view(etype.dtype).astype(np.float32)
        got = table[: 1 << etype.bits]
        finite = ~np.isnan(expected)
        assert np.array_equal(got[finite].view(np.uint32), expected[finite].view(np.uint32)), etype.name
        assert np.array_equal(np.isnan(got), np.isnan(expected)), etype.name
