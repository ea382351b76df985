"""The chart's values: what a real API server or the operator would refuse, or what the chart
would leave unused, is refused at `helm install` (values.schema.json, generated from
`splitserve.api.chart.ChartValues`), naming the value."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from pydantic import ValidationError

from splitserve.api.chart import ChartValues

ROOT = Path(__file__).resolve().parents[3]
SCHEMA = json.loads((ROOT / "charts/splitserve/values.schema.json").read_text())


def _schema_errors(values: dict[str, Any]) -> list[str]:
    validator = jsonschema.Draft7Validator(SCHEMA)
    return [
        "/".join(str(p) for p in e.absolute_path) + ": " + e.message
        for e in validator.iter_errors(values)
    ]


@pytest.mark.parametrize(
    "namespaces",
    [["team-a", "team-a"], ["Team_A"], [""], ["a" * 64], ["team-a."]],
    ids=["duplicate", "uppercase", "empty", "too-long", "dot"],
)
def test_watch_namespaces_must_be_distinct_namespace_names(namespaces: list[str]) -> None:
    """A duplicate renders the same Role twice (the install fails half-way); a name that is
    no namespace's renders a Role the API server refuses and an operator watching nothing."""
    values = {"operator": {"watchNamespaces": namespaces}}
    errors = _schema_errors(values)
    assert errors
    assert all(e.startswith("operator/watchNamespaces") for e in errors), errors
    with pytest.raises(ValidationError, match="watchNamespaces"):
        ChartValues.model_validate(values)


def test_watch_namespaces_take_namespace_names() -> None:
    values = {"operator": {"watchNamespaces": ["team-a", "0ps", "b" * 63]}}
    assert _schema_errors(values) == []
    assert ChartValues.model_validate(values).operator.watch_namespaces == [
        "team-a",
        "0ps",
        "b" * 63,
    ]
