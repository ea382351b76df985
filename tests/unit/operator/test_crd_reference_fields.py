"""docs/crd-reference.md names exactly the fields of the CRD schemas, and their printer columns.

Both are generated from `splitserve.api.v1alpha1` (the drift check compares each with the
models); this test compares the two with each other, so a field the doc generator skips or
invents (or a column it misreads) fails here. `metadata` is ObjectMeta's, not ours."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
CRD_DIRS = (ROOT / "charts/splitserve/crds", ROOT / "deploy/crds")
DOC = ROOT / "docs/crd-reference.md"
KINDS = ("LLMService", "LLMPool")


def schema_fields(schema: dict[str, Any], path: str = "") -> Iterator[str]:
    """Dotted paths of every property under `schema` (`[]` for list items, as the doc)."""
    for name, sub in (schema.get("properties") or {}).items():
        where = f"{path}.{name}" if path else name
        yield where
        yield from schema_fields(sub, where)
    items = schema.get("items")
    if isinstance(items, dict):
        yield from schema_fields(items, f"{path}[]")


def crd(directory: Path, kind: str) -> dict[str, Any]:
    for p in sorted(directory.glob("*.yaml")):
        doc: dict[str, Any] = yaml.safe_load(p.read_text())
        if doc["spec"]["names"]["kind"] == kind:
            return doc
    raise AssertionError(f"no CRD for {kind} in {directory}")


def doc_tables(text: str) -> dict[str, list[list[str]]]:
    """Rows (cells) of each table, keyed by the nearest heading (or `Title:` line) above it."""
    tables: dict[str, list[list[str]]] = {}
    heading = ""
    for line in text.splitlines():
        if line.startswith("#"):
            heading = line.lstrip("#").strip()
        elif line.endswith(":") and not line.startswith(("|", "-", " ")):
            heading = line.rstrip(":")
        elif line.startswith("| ") and not line.startswith("|---"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            tables.setdefault(heading, []).append(cells[:2])
    return tables


def doc_fields(rows: list[list[str]]) -> set[str]:
    out = set()
    for cells in rows:
        m = re.match(r"`([^`]+)`", cells[0])
        if m and cells[0] != "Field":
            out.add(m.group(1))
    return out


def section(text: str, kind: str) -> str:
    """The doc's text for one kind: from `## Kind` to the next `## `."""
    m = re.search(rf"^## {kind}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert m, f"docs/crd-reference.md has no section for {kind}"
    return m.group(1)


@pytest.mark.parametrize("directory", CRD_DIRS, ids=lambda d: d.parent.name)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("part", ["spec", "status"])
def test_doc_names_exactly_the_schema_fields(directory: Path, kind: str, part: str) -> None:
    version = crd(directory, kind)["spec"]["versions"][0]
    schema = version["schema"]["openAPIV3Schema"]["properties"][part]
    tables = doc_tables(section(DOC.read_text(), kind))
    documented = doc_fields(tables[f"{kind}.{part}"])
    in_schema = set(schema_fields(schema))
    assert sorted(in_schema - documented) == [], "in the CRD schema, not in crd-reference.md"
    assert sorted(documented - in_schema) == [], "in crd-reference.md, not in the CRD schema"


@pytest.mark.parametrize("kind", KINDS)
def test_doc_printer_columns_are_the_crds(kind: str) -> None:
    version = crd(CRD_DIRS[0], kind)["spec"]["versions"][0]
    columns = [[c["name"], f"`{c['jsonPath']}`"] for c in version["additionalPrinterColumns"]]
    rows = doc_tables(section(DOC.read_text(), kind))["Printer columns"]
    assert rows[1:] == columns  # rows[0] is the header


def test_the_comparison_sees_a_missing_and_an_invented_field() -> None:
    schema = {
        "properties": {"a": {"properties": {"b": {}}}, "c": {"items": {"properties": {"d": {}}}}}
    }
    assert set(schema_fields(schema)) == {"a", "a.b", "c", "c[].d"}
    rows = doc_tables(
        "## K\n### K.spec\n| Field | Type |\n|---|---|\n"
        "| `a` | object |\n| `x` **(required)** | string |\n"
    )
    assert doc_fields(rows["K.spec"]) == {"a", "x"}


@pytest.mark.parametrize("kind", KINDS)
def test_doc_short_names_are_the_crds(kind: str) -> None:
    names = crd(CRD_DIRS[0], kind)["spec"]["names"]
    m = re.search(r"\(short names: ([^)]*)\)", section(DOC.read_text(), kind))
    assert m, f"crd-reference.md gives no short names for {kind}"
    assert re.findall(r"`([^`]+)`", m.group(1)) == names["shortNames"]
    assert f"`kubectl get {names['plural']}`" in section(DOC.read_text(), kind)
