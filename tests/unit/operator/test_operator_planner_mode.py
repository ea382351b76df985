"""`planner.mode` in the live loop against the in-memory API server: Advise reports a plan
(status.decisions, an Event) and writes nothing else; Apply (with `scaling.mode: Manual`) writes
it to the LLMPools and `spec.pools`; Off does nothing; Apply with another scaling mode is
refused by validation; no plan without signals."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from splitserve.api import v1alpha1 as v1
from splitserve.core.roles import Role
from splitserve.policy.planner.aladdin import AladdinPerfModel
from splitserve.policy.planner.autoscaler import AutoscalerParams
from splitserve.policy.planner.capacity import plan_capacity
from splitserve.policy.planner.signals import Observation, PoolSignal
from tests.unit.operator.test_operator_control import Env


def planner_env(mode: str, scaling: str, interval: float = 60.0) -> Env:
    env = Env(mode=scaling, planner={"mode": mode, "intervalSeconds": interval})
    env.tick(0.0)
    return env


def plans(env: Env) -> list[dict[str, Any]]:
    return [d for d in env.status().get("decisions") or [] if d["kind"] == "plan"]


def test_advise_reports_the_plan_and_writes_no_replicas() -> None:
    env = planner_env("Advise", "Manual")
    env.tick(n=300, prompt=2000, output=200)
    assert env.pools_spec() == {"prefill": 1, "decode": 1}
    [plan] = plans(env)
    assert plan["reason"] == "PlanAdvised"
    assert "prefill 1 ->" in plan["message"]
    assert "P:D" in plan["message"]
    assert plan["inputs"]["rate"].endswith("req/s")
    assert any(e["reason"] == "PlanAdvised" for e in env.events())
    # Not again before planner.intervalSeconds has passed (status keeps only the last
    # decisions: count the Events).
    for _ in range(4):
        assert env.tick(n=300, prompt=2000, output=200).plan is None
    assert env.tick(20.0, n=300, prompt=2000, output=200).plan is not None
    assert sum(e["reason"] == "PlanAdvised" for e in env.events()) == 2
    assert env.pools_spec() == {"prefill": 1, "decode": 1}


def test_apply_with_manual_scaling_writes_the_plan() -> None:
    env = planner_env("Apply", "Manual")
    result = env.tick(n=300, prompt=2000, output=200)
    assert result.plan is not None
    assert result.plan_applied
    want = {r.value: p.recommended for r, p in result.plan.pools.items()}
    assert want["prefill"] > 1
    assert env.pools_spec() == want
    [plan] = plans(env)
    assert plan["reason"] == "PlanApplied"
    assert any(e["reason"] == "PlanApplied" for e in env.events())


def test_off_makes_no_plan() -> None:
    env = planner_env("Off", "Manual")
    for _ in range(3):
        result = env.tick(n=300, prompt=2000, output=200)
        assert result.plan is None
    assert plans(env) == []
    assert env.pools_spec() == {"prefill": 1, "decode": 1}


def test_no_plan_without_signals() -> None:
    env = planner_env("Apply", "Manual")
    env.down = True
    for _ in range(3):
        assert env.tick(n=300, prompt=2000, output=200).plan is None
    assert plans(env) == []
    assert env.pools_spec() == {"prefill": 1, "decode": 1}


@pytest.mark.parametrize("scaling", ["Managed", "External"])
def test_apply_needs_manual_scaling(scaling: str) -> None:
    env = Env()
    spec = dict(env.svc()["spec"])
    spec["planner"] = {"mode": "Apply"}
    spec["scaling"] = {"mode": scaling}
    with pytest.raises(ValidationError, match=r"planner\.mode Apply needs scaling\.mode Manual"):
        v1.LLMServiceSpec.model_validate(spec)


def test_plan_is_within_bounds_and_grows_with_the_rate() -> None:
    pools = {
        Role.PREFILL: PoolSignal(Role.PREFILL, 2, 2, 1, 5, ()),
        Role.DECODE: PoolSignal(Role.DECODE, 2, 2, 1, 5, ()),
    }
    last = {Role.PREFILL: 0, Role.DECODE: 0}
    for rate in (0.0, 1.0, 5.0, 20.0, 200.0):
        obs = Observation(0.0, 60.0, rate, 2000.0, 200.0, (), pools)
        plan = plan_capacity(obs, AladdinPerfModel(), AutoscalerParams())
        for role, p in plan.pools.items():
            assert 1 <= p.recommended <= 5
            assert p.recommended >= last[role]
            last[role] = p.recommended
    assert last == {Role.PREFILL: 5, Role.DECODE: 5}


def test_an_applied_plan_reaches_the_llmpools_that_size_manual_mode() -> None:
    """Found by the operator probe: Apply wrote the plan to `spec.pools.<role>.replicas` only,
    which Manual mode does not apply once the pools exist (their `spec.replicas` decides): the
    next reconcile said `SpecApplied=False PoolReplicasDecide` ("spec.pools.prefill.replicas
    (N) is not applied") and no worker moved. Now the pools get the plan too, so the reconcile
    sizes the Deployments from it and the spec is applied as written."""
    env = planner_env("Apply", "Manual")
    result = env.tick(n=300, prompt=2000, output=200)
    assert result.plan_applied
    want = {r.value: p.recommended for r, p in result.plan.pools.items()}
    assert want != {"prefill": 1, "decode": 1}
    pools = {}
    for r in want:
        pool = env.kube.get(v1.API_VERSION, "LLMPool", "default", f"svc-{r}")
        assert pool is not None
        pools[r] = pool["spec"]["replicas"]
    assert pools == want
    env.reconcile()
    applied = env.condition("SpecApplied")
    assert (applied["status"], applied["reason"]) == ("True", "AsSpecified"), applied
    deployment = env.kube.get("apps/v1", "Deployment", "default", "svc-w")
    assert deployment is not None
    assert deployment["spec"]["replicas"] == sum(want.values())
