"""The API models: defaults, wire names, cross-field rules (each with an error naming the field)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from splitserve.api import v1alpha1 as v1
from splitserve.core.roles import Role


def make_spec(**overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "model": {"name": "m", "source": "org/m"},
        "engine": {"kind": "sim", "image": "img:1"},
        "workerGroups": [{"name": "w", "roles": ["prefill", "decode"]}],
        "pools": {"prefill": {"replicas": 1}, "decode": {"replicas": 2}},
    }
    spec.update(overrides)
    return spec


def test_minimal_spec_gets_defaults() -> None:
    spec = v1.LLMServiceSpec.model_validate(make_spec())
    assert spec.scaling.mode is v1.ScalingMode.MANAGED
    assert spec.router.http_port == 8000
    assert spec.flipping.enabled
    assert [r for r, _ in spec.pools.items()] == [Role.PREFILL, Role.DECODE]
    assert spec.worker_groups[0].tensor_parallel == 1


def test_wire_is_camel_case_and_round_trips() -> None:
    spec = v1.LLMServiceSpec.model_validate(make_spec())
    wire = spec.wire()
    assert "workerGroups" in wire
    assert "tensorParallel" in wire["workerGroups"][0]
    assert "maxReplicas" not in wire["pools"]["prefill"]  # unset optionals are left out
    assert v1.LLMServiceSpec.model_validate(wire) == spec


def test_models_are_frozen() -> None:
    spec = v1.LLMServiceSpec.model_validate(make_spec())
    with pytest.raises(ValidationError):
        spec.engine = spec.engine  # type: ignore[misc]


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        ({"pools": {}}, "pools: set at least one"),
        ({"pools": {"mixed": {"replicas": 1}}}, "pools.mixed: no worker group"),
        ({"pools": {"decode": {"replicas": 5, "maxReplicas": 3}}}, "maxReplicas"),
        ({"pools": {"decode": {"replicas": 0, "minReplicas": 1}}}, "minReplicas"),
        ({"workerGroups": [{"name": "w", "roles": ["decode", "decode"]}]}, "distinct"),
        (
            {
                "workerGroups": [
                    {"name": "w", "roles": ["decode"]},
                    {"name": "w", "roles": ["prefill"]},
                ]
            },
            "unique",
        ),
        ({"workerGroups": [{"name": "Bad_Name", "roles": ["decode"]}]}, "pattern"),
        ({"sloClasses": [{"name": "a"}]}, "ttftMs and tpotMs"),
        ({"sloClasses": [{"name": "a", "ttftMs": 1, "tpotMs": 1}] * 2}, "unique"),
        ({"defaultSloClass": "nope"}, "defaultSloClass"),
        ({"bogus": 1}, "Extra inputs"),
        ({"scaling": {"mode": "Auto"}}, "Managed"),
    ],
    ids=[
        "no-pool",
        "pool-without-group",
        "above-max",
        "below-min",
        "dup-roles",
        "dup-groups",
        "bad-name",
        "slo-without-targets",
        "dup-classes",
        "default-class",
        "unknown",
        "bad-mode",
    ],
)
def test_invalid_specs_are_rejected(overrides: dict[str, Any], needle: str) -> None:
    with pytest.raises(ValidationError, match=needle):
        v1.LLMServiceSpec.model_validate(make_spec(**overrides))


def test_offline_class_needs_no_latency_targets() -> None:
    spec = v1.LLMServiceSpec.model_validate(
        make_spec(
            sloClasses=[{"name": "batch", "jobCompletionSeconds": 60}], defaultSloClass="batch"
        )
    )
    assert spec.slo_classes[0].job_completion_seconds == 60


def test_every_field_has_a_description() -> None:
    """Attribute docstrings are the `kubectl explain` text: none may be missing."""
    missing = []
    for model in (
        v1.LLMServiceSpec,
        v1.LLMServiceStatus,
        v1.LLMPoolSpec,
        v1.LLMPoolStatus,
        v1.ModelSpec,
        v1.EngineSpec,
        v1.WorkerGroup,
        v1.PoolSpec,
        v1.Pools,
        v1.SloClassSpec,
        v1.RouterSpec,
        v1.ScalingSpec,
        v1.FlippingSpec,
        v1.PlannerSpec,
        v1.Condition,
        v1.PoolStatus,
        v1.RoleSummary,
        v1.SloClassStatus,
        v1.Decision,
        v1.EnvVar,
        v1.ResourceRequirements,
    ):
        missing += [
            f"{model.__name__}.{n}" for n, f in model.model_fields.items() if not f.description
        ]
    assert missing == []


@given(
    replicas=st.integers(0, 50),
    lo=st.integers(0, 50),
    hi=st.one_of(st.none(), st.integers(0, 50)),
)
def test_pool_bounds_accept_exactly_the_ordered_triples(
    replicas: int, lo: int, hi: int | None
) -> None:
    ok = lo <= replicas and (hi is None or replicas <= hi)
    try:
        v1.PoolSpec(replicas=replicas, min_replicas=lo, max_replicas=hi)
    except ValidationError:
        assert not ok
    else:
        assert ok
