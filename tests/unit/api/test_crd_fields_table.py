"""docs/crd-fields.md has one row per field of every CRD spec, and every test it names exists.

The project rule: every CRD field acts (with a test showing the effect) or is refused with an
error naming it. The table says, per leaf field path of each kind's `spec` (as the generated CRD
YAML has it: `[]` for list items, maps and lists of scalars are leaves), what the field does and
which tests show it. Kubernetes types passed through as they are get one row for their whole
subtree, written `<path>.*`; only the subtrees named in `PASS_THROUGH` may be covered that way.

This test reads the CRDs and the table and fails when a field has no row (a new field landed
without saying what it does), a row names a field that does not exist, a field is covered twice,
a row names no test, or a named test does not exist (its file is parsed with `ast`; nothing is
imported or run).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator, Mapping
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
TABLE = ROOT / "docs/crd-fields.md"
CRDS = ROOT / "charts/splitserve/crds"

PASS_THROUGH = frozenset(
    {
        "affinity",
        "authSecret",
        "env[]",
        "envFrom[]",
        "metricsFrom[]",
        "resourceClaims[]",
        "resources",
        "routerFrom[]",
        "tolerations[]",
        "topologySpread[]",
        "volumeMounts[]",
        "volumes[]",
    }
)
"""Last path segments whose subtree may have one `<path>.*` row: Kubernetes objects (or our
shortened forms of them) that the operator copies into the pod or policy as they are."""

NODE_ID = re.compile(r"`(tests/[^`:]+\.py(?:::[A-Za-z_][A-Za-z0-9_]*)+)`")
ROW = re.compile(r"^\|\s*`(spec\.[^`]+)`\s*\|(.*)\|\s*$")


def schema_paths(node: Mapping[str, Any], prefix: str) -> Iterator[tuple[str, bool]]:
    """(path, is_leaf) for every field under `node`; `[]` marks list items."""
    for name, sub in (node.get("properties") or {}).items():
        path = f"{prefix}.{name}"
        target, inner = sub, path
        if sub.get("type") == "array":
            target, inner = sub.get("items") or {}, f"{path}[]"
        nested = bool(target.get("properties"))
        yield (inner if nested else path), not nested
        if nested:
            yield from schema_paths(target, inner)


@cache
def crd_specs() -> dict[str, dict[str, Any]]:
    out = {}
    for p in sorted(CRDS.glob("*.yaml")):
        doc = yaml.safe_load(p.read_text())
        schema = doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        out[doc["spec"]["names"]["kind"]] = schema["properties"]["spec"]
    return out


def table_rows(text: str) -> dict[str, list[tuple[str, list[str]]]]:
    """{kind: [(field path, named test ids)]} from the `## <Kind>` sections' tables."""
    out: dict[str, list[tuple[str, list[str]]]] = {}
    kind = None
    for line in text.splitlines():
        if line.startswith("## "):
            kind = line[3:].strip()
            out.setdefault(kind, [])
            continue
        m = ROW.match(line)
        if m and kind is not None:
            out[kind].append((m.group(1), NODE_ID.findall(m.group(2))))
    return out


def coverage_problems(
    paths: list[tuple[str, bool]], rows: list[tuple[str, list[str]]]
) -> list[str]:
    """What is wrong between a kind's schema paths and its table rows."""
    leaves = {p for p, leaf in paths if leaf}
    inner = {p for p, leaf in paths if not leaf}
    problems: list[str] = []
    covered: dict[str, str] = {}
    for row, tests in rows:
        if not tests:
            problems.append(f"{row}: names no test")
        if row.endswith(".*"):
            base = row[: -len(".*")]
            last = base.rsplit(".", 1)[-1]
            if base not in inner:
                problems.append(f"{row}: no object field {base} in the schema")
                continue
            if last not in PASS_THROUGH:
                problems.append(f"{row}: {last} is not a pass-through subtree (one row a field)")
            under = {p for p in leaves if p.startswith((f"{base}.", f"{base}[]."))}
        elif row in leaves:
            under = {row}
        else:
            problems.append(f"{row}: no such field in the schema")
            continue
        for p in sorted(under):
            if p in covered:
                problems.append(f"{p}: covered by {covered[p]} and {row}")
            covered[p] = row
    problems += [f"{p}: no row" for p in sorted(leaves - covered.keys())]
    return problems


def defined_tests(source: str) -> set[str]:
    """`name` and `Class::name` of the test functions a file defines (top level and classes)."""
    out: set[str] = set()
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            out.add(node.name)
        elif isinstance(node, ast.ClassDef):
            for sub in node.body:
                if isinstance(sub, ast.FunctionDef | ast.AsyncFunctionDef):
                    out.add(f"{node.name}::{sub.name}")
    return out


def missing_tests(ids: list[str], root: Path) -> list[str]:
    problems = []
    for node_id in ids:
        file, _, name = node_id.partition("::")
        path = root / file
        if not path.is_file():
            problems.append(f"{node_id}: no file {file}")
        elif not name.split("::")[-1].startswith("test"):
            problems.append(f"{node_id}: not a test")
        elif name not in defined_tests(path.read_text()):
            problems.append(f"{node_id}: {file} defines no {name}")
    return problems


@pytest.mark.parametrize("kind", ["LLMService", "LLMPool"])
def test_every_spec_field_has_exactly_one_row(kind: str) -> None:
    assert kind in crd_specs(), f"no CRD for {kind} in {CRDS}"
    rows = table_rows(TABLE.read_text())
    assert kind in rows, f"{TABLE.name} has no `## {kind}` section"
    paths = list(schema_paths(crd_specs()[kind], "spec"))
    assert coverage_problems(paths, rows[kind]) == []


def test_every_kind_the_project_ships_has_a_section() -> None:
    assert sorted(table_rows(TABLE.read_text())) == sorted(crd_specs())


def test_every_named_test_exists() -> None:
    ids = sorted(
        {t for rows in table_rows(TABLE.read_text()).values() for _, ts in rows for t in ts}
    )
    assert ids, "the table names no test"
    assert missing_tests(ids, ROOT) == []


SCHEMA: dict[str, Any] = {
    "properties": {
        "a": {"type": "integer"},
        "env": {"type": "array", "items": {"properties": {"name": {}, "value": {}}}},
        "pod": {"properties": {"labels": {"type": "object", "additionalProperties": {}}}},
        "args": {"type": "array", "items": {"type": "string"}},
    }
}


def test_the_checks_see_a_missing_an_invented_and_a_doubly_covered_field() -> None:
    paths = list(schema_paths(SCHEMA, "spec"))
    assert paths == [
        ("spec.a", True),
        ("spec.env[]", False),
        ("spec.env[].name", True),
        ("spec.env[].value", True),
        ("spec.pod", False),
        ("spec.pod.labels", True),
        ("spec.args", True),
    ]
    t = ["tests/x.py::test_x"]
    full = [("spec.a", t), ("spec.env[].*", t), ("spec.pod.labels", t), ("spec.args", t)]
    assert coverage_problems(paths, full) == []
    assert coverage_problems(paths, full[1:]) == ["spec.a: no row"]
    assert coverage_problems(paths, [*full, ("spec.b", t)]) == [
        "spec.b: no such field in the schema"
    ]
    assert coverage_problems(paths, [*full, ("spec.env[].name", t)]) == [
        "spec.env[].name: covered by spec.env[].* and spec.env[].name"
    ]
    assert coverage_problems(paths, [*full[:2], ("spec.pod.*", t), full[3]]) == [
        "spec.pod.*: pod is not a pass-through subtree (one row a field)"
    ]
    assert coverage_problems(paths, [("spec.a", []), *full[1:]]) == ["spec.a: names no test"]


def test_the_checks_see_a_test_that_does_not_exist(tmp_path: Path) -> None:
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests/test_a.py").write_text(
        "def test_one():\n    pass\n\nclass TestB:\n    def test_two(self):\n        pass\n"
    )
    good = ["tests/test_a.py::test_one", "tests/test_a.py::TestB::test_two"]
    assert missing_tests(good, tmp_path) == []
    assert missing_tests(
        ["tests/test_a.py::test_three", "tests/test_c.py::test_one"], tmp_path
    ) == [
        "tests/test_a.py::test_three: tests/test_a.py defines no test_three",
        "tests/test_c.py::test_one: no file tests/test_c.py",
    ]
    row = "| `spec.a` | does a | `tests/test_a.py::TestB::test_two`, `tests/test_a.py::test_one` |"
    assert table_rows(f"## K\n\n{row}\n") == {"K": [("spec.a", good[::-1])]}
