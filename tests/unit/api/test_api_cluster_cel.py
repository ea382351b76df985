"""The CEL rules of the cluster fields (gpus / tensorParallel / nodes, env value / valueFrom)
agree with the pydantic validators, as `test_api_cel` checks for the service-level rules."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("celpy")

from tests.unit.api.test_api_cel import cel_accepts, pydantic_accepts

env: st.SearchStrategy[dict[str, Any]] = st.fixed_dictionaries(
    {"name": st.sampled_from(["A", "B"])},
    optional={
        "value": st.sampled_from(["", "1"]),
        "valueFrom": st.just({"fieldRef": {"fieldPath": "status.podIP"}}),
    },
)


@st.composite
def specs(draw: st.DrawFn) -> dict[str, Any]:
    group: dict[str, Any] = {"name": "w", "roles": ["decode"]}
    for key, values in (("gpus", st.integers(0, 4)), ("tensorParallel", st.integers(1, 4))):
        if draw(st.booleans()):
            group[key] = draw(values)
    if draw(st.booleans()):
        group["nodes"] = draw(st.integers(1, 2))
    return {
        "model": {"name": "m", "source": "s"},
        "engine": {
            "image": "i",
            "env": draw(st.lists(env, max_size=2, unique_by=lambda e: str(e["name"]))),
        },
        "workerGroups": [group],
        "pools": {"decode": {"replicas": 1, "minReplicas": 0}},
    }


@settings(max_examples=200, deadline=None)
@given(specs())
def test_cluster_cel_rules_match_pydantic(spec: dict[str, Any]) -> None:
    assert cel_accepts(spec) == pydantic_accepts(spec), spec
