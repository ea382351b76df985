"""Example CRs validate; invalid ones fail with a message that names the field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from splitserve.operator import validate

ROOT = Path(__file__).resolve().parents[3]
CRDS = ROOT / "charts/splitserve/crds"
EXAMPLES = sorted((ROOT / "deploy/examples").glob("*.yaml"))


def test_examples_are_valid() -> None:
    assert EXAMPLES
    assert validate.validate_files(EXAMPLES, CRDS) == []


def service(**spec_overrides: Any) -> dict[str, Any]:
    obj = yaml.safe_load((ROOT / "deploy/examples/llmservice-sim.yaml").read_text())
    obj["spec"].update(spec_overrides)
    return dict(obj)


@pytest.mark.parametrize(
    ("overrides", "field", "needle"),
    [
        ({"pools": {"decode": {"replicas": -1}}}, "spec.pools.decode.replicas", "minimum"),
        ({"bogus": True}, "spec", "bogus"),
        ({"scaling": {"mode": "Auto"}}, "spec.scaling.mode", "is not one of"),
        (
            {"workerGroups": [{"name": "w", "roles": ["prefill"]}]},
            "spec.pools.decode",
            "no worker group",
        ),
        ({"engine": {"kind": "sim"}}, "spec.engine", "'image' is a required property"),
    ],
    ids=["negative-replicas", "unknown-field", "bad-enum", "cross-field", "missing-required"],
)
def test_invalid_objects_name_the_field(overrides: dict[str, Any], field: str, needle: str) -> None:
    schemas = validate.load_crd_schemas(CRDS)
    errors = validate.validate_object(service(**overrides), schemas)
    assert errors, "expected a validation error"
    assert any(f": {field}" in e and needle in e for e in errors), errors


def test_unknown_kind() -> None:
    errors = validate.validate_object({"apiVersion": "splitserve.io/v1alpha1", "kind": "Nope"}, {})
    assert errors
    assert "no CRD" in errors[0]
