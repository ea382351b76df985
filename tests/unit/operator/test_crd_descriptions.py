"""`kubectl explain` shows a description for every field of the generated CRDs.

`metadata` is the exception: a CRD may not describe it (the API server serves ObjectMeta's
own documentation for it)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

CRDS = Path(__file__).resolve().parents[3] / "charts/splitserve/crds"


def undescribed(schema: dict[str, Any], path: str) -> Iterator[str]:
    """Fields (dotted paths) under `schema` that have no description."""
    for name, sub in (schema.get("properties") or {}).items():
        where = f"{path}.{name}"
        if where.endswith(":.metadata"):
            continue
        if not str(sub.get("description") or "").strip():
            yield where
        yield from undescribed(sub, where)
    items = schema.get("items")
    if isinstance(items, dict):
        yield from undescribed(items, f"{path}[]")
    extra = schema.get("additionalProperties")
    if isinstance(extra, dict):
        yield from undescribed(extra, f"{path}{{}}")


def crds() -> list[dict[str, Any]]:
    return [yaml.safe_load(p.read_text()) for p in sorted(CRDS.glob("*.yaml"))]


@pytest.mark.parametrize("crd", crds(), ids=lambda c: c["metadata"]["name"])
def test_every_field_has_a_description(crd: dict[str, Any]) -> None:
    missing: list[str] = []
    for version in crd["spec"]["versions"]:
        schema = version["schema"]["openAPIV3Schema"]
        missing += undescribed(schema, f"{version['name']}:")
    assert missing == []


def test_the_walk_finds_an_undescribed_field() -> None:
    schema = {"properties": {"a": {"description": "x", "properties": {"b": {"type": "string"}}}}}
    assert list(undescribed(schema, "spec")) == ["spec.a.b"]
