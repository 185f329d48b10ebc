"""docs/api.md's table of supported types per op version is the spec table's
(qemu_q/_opspec.py), regenerated here; `python tests/test_docs.py` rewrites it in place."""

import pathlib
import re
import sys

API_DOC = pathlib.Path(__file__).resolve().parents[1] / "docs" / "api.md"
BEGIN = "<!-- types table: generated from qemu_q/_opspec.py by tests/test_docs.py -->"
END = "<!-- end of types table -->"


def types_table() -> str:
    from qemu_q import ELEMENT_TYPES, OP_VERSIONS, get_spec

    order = {f"tensor({name})": index for index, name in enumerate([*ELEMENT_TYPES, "string"])}
    sections = []
    for op, versions in OP_VERSIONS.items():
        params = get_spec(op, versions[-1])
        names = [p.name for p in params.inputs + params.outputs]
        lines = [f"**{op}**", "",
                 "| version | " + " | ".join(f"`{n}`" for n in names) + " | attributes (default) |",
                 "| --- " * (len(names) + 2) + "|"]
        for version in versions:
            spec = get_spec(op, version)
            cells = []
            for name in names:
                types = sorted(spec.allowed_types(name), key=order.__getitem__)
                cells.append(", ".join(t[len("tensor("):-1] for t in types))
            attributes = ", ".join(
                f"{name} ({'none' if default is None else default})" for name, default in spec.attributes.items()
            ) or "none"
            lines.append(f"| {version} | " + " | ".join(cells) + f" | {attributes} |")
        sections.append("\n".join(lines))
    return "\n\n".join(sections)


def documented_table(text: str) -> str:
    match = re.search(re.escape(BEGIN) + r"\n(.*?)\n" + re.escape(END), text, re.S)
    assert match, f"docs/api.md lacks the markers {BEGIN!r} ... {END!r}"
    return match.group(1).strip()


def test_types_table_matches_the_spec_table():
    assert documented_table(API_DOC.read_text()) == types_table(), (
        "docs/api.md's types table is stale: run `python tests/test_docs.py` from the project root"
    )


def test_examples_run():
    # The examples state their results; they run in order as one script.
    namespace: dict = {}
    for block in re.findall(r"```python\n(.*?)```", API_DOC.read_text(), re.S):
        exec(compile(block, str(API_DOC), "exec"), namespace)


def test_readme_examples_run():
    # README's examples run in order as one script, and its first states its int8 codes:
    # 0, 1.5 and 2.5 to even (2, 2), -2.5 to -2, 300 saturated, NaN to the minimum.
    import numpy as np

    namespace: dict = {}
    readme = API_DOC.parents[1] / "README.md"
    blocks = re.findall(r"```python\n(.*?)```", readme.read_text(), re.S)
    assert blocks, "README.md has no python example"
    first = blocks[0].splitlines()
    upto = next(i for i, line in enumerate(first) if line.startswith("y = "))
    exec(compile("\n".join(first[:upto + 1]), str(readme), "exec"), namespace)
    assert namespace["y"].dtype == np.int8 and namespace["y"].tolist() == [0, 2, 2, -2, 127, -128]
    for block in blocks:
        exec(compile(block, str(readme), "exec"), namespace)


def test_every_export_is_documented():
    import qemu_q

    text = API_DOC.read_text()
    missing = [name for name in qemu_q.__all__ if f"`{name}" not in text]
    assert not missing, f"docs/api.md does not document {missing}"


if __name__ == "__main__":
    sys.path.insert(0, str(API_DOC.parents[1]))
    text = API_DOC.read_text()
    start = text.index(BEGIN) + len(BEGIN) + 1
    API_DOC.write_text(text[:start] + types_table() + "\n" + text[text.index(END):])
    print(f"updated the types table in {API_DOC}")
