"""Conditions: reasons a person can act on, and stable transition times."""

from __future__ import annotations

import pytest

from splitserve.api import v1alpha1 as v1
from splitserve.core.roles import Role
from splitserve.operator import render, status
from splitserve.policy.planner.flip import WorkerObs

REF = render.ServiceRef("tiny", "ml", "u")
SPEC = v1.LLMServiceSpec.model_validate(
    {
        "model": {"name": "m", "source": "s"},
        "engine": {"image": "i"},
        "workerGroups": [{"name": "w", "roles": ["prefill", "decode"]}],
        "pools": {"prefill": {"replicas": 1}, "decode": {"replicas": 1}},
    }
)
PD = frozenset({Role.PREFILL, Role.DECODE})
ROUTER_OK = status.DeploymentObs("tiny-router", 1, 1)


def compute(
    workers: list[WorkerObs],
    pods: status.PodCounts,
    router: status.DeploymentObs | None = ROUTER_OK,
    previous: v1.LLMServiceStatus | None = None,
    now: str = "t1",
) -> v1.LLMServiceStatus:
    return status.service_status(
        spec=SPEC,
        ref=REF,
        desired={Role.PREFILL: 1, Role.DECODE: 1},
        workers=workers,
        pods=pods,
        router=router,
        previous=previous,
        now=now,
        generation=3,
    )


def conds(st: v1.LLMServiceStatus) -> dict[str, v1.Condition]:
    return {c.type: c for c in st.conditions}


@pytest.mark.parametrize(
    ("workers", "pods", "reason", "needle"),
    [
        ([], status.PodCounts(), "NoWorkerPods", "matched 0 pods"),
        (
            [WorkerObs("a", PD, ready=False)],
            status.PodCounts(1, 0, 0),
            "NoReadyWorkers",
            "none ready",
        ),
        ([WorkerObs("a", PD)], status.PodCounts(1, 1, 1), "AssigningRoles", "waiting for a role"),
        (
            [WorkerObs("a", PD, Role.PREFILL)],
            status.PodCounts(1, 1, 0),
            "NoDecodeWorkers",
            "decode 0/1",
        ),
    ],
    ids=["no-pods", "none-ready", "unassigned", "no-decode"],
)
def test_not_routable_says_why(
    workers: list[WorkerObs], pods: status.PodCounts, reason: str, needle: str
) -> None:
    c = conds(compute(workers, pods))
    assert c["NotRoutable"].status is v1.ConditionStatus.TRUE
    assert c["NotRoutable"].reason == reason
    assert needle in c["NotRoutable"].message
    assert c["Ready"].status is v1.ConditionStatus.FALSE
    assert c["Ready"].reason == reason


def test_ready_when_every_pool_is_full() -> None:
    workers = [WorkerObs("a", PD, Role.PREFILL), WorkerObs("b", PD, Role.DECODE)]
    st = compute(workers, status.PodCounts(2, 2, 0))
    c = conds(st)
    assert c["Ready"].status is v1.ConditionStatus.TRUE
    assert c["Degraded"].status is v1.ConditionStatus.FALSE
    assert c["NotRoutable"].status is v1.ConditionStatus.FALSE
    assert st.summary == v1.RoleSummary(prefill="1/1", decode="1/1")
    assert st.router_endpoint == "http://tiny.ml.svc:8000/v1"
    assert all(x.observed_generation == 3 for x in st.conditions)


def test_degraded_but_routable() -> None:
    workers = [WorkerObs("b", PD, Role.DECODE)]
    c = conds(compute(workers, status.PodCounts(1, 1, 0)))
    assert c["NotRoutable"].status is v1.ConditionStatus.FALSE
    assert c["Degraded"].status is v1.ConditionStatus.TRUE
    assert c["Degraded"].message == "prefill 0/1 ready"


def test_transition_time_moves_only_on_change() -> None:
    workers = [WorkerObs("a", PD, Role.PREFILL), WorkerObs("b", PD, Role.DECODE)]
    first = compute(workers, status.PodCounts(2, 2, 0), now="t1")
    again = compute(workers, status.PodCounts(2, 2, 0), previous=first, now="t2")
    assert again == first
    broken = compute(workers[:1], status.PodCounts(1, 1, 0), previous=first, now="t3")
    assert conds(broken)["Ready"].last_transition_time == "t3"
    assert conds(broken)["Degraded"].last_transition_time == "t3"


def test_no_router_is_not_ready_and_not_routable() -> None:
    """`router.replicas: 0` reported Ready=True and Routable (0 >= min(0, 1)) while nothing
    could serve a request (a new-user probe)."""
    workers = [WorkerObs("a", PD, Role.PREFILL), WorkerObs("b", PD, Role.DECODE)]
    c = conds(compute(workers, status.PodCounts(2, 2, 0), status.DeploymentObs("r", 0, 0)))
    assert c["Ready"].status is v1.ConditionStatus.FALSE
    assert c["Ready"].reason == "NoRouter"
    assert c["NotRoutable"].status is v1.ConditionStatus.TRUE
    assert "spec.router.replicas is 0" in c["NotRoutable"].message


def _sized_to_zero(spec: v1.LLMServiceSpec) -> v1.LLMServiceStatus:
    """The status of `spec` with both pools sized to 0 and no workers."""
    return status.service_status(
        spec=spec,
        ref=REF,
        desired={Role.PREFILL: 0, Role.DECODE: 0},
        workers=[],
        pods=status.PodCounts(),
        router=ROUTER_OK,
        previous=None,
        now="t1",
        generation=3,
    )


def test_pools_sized_to_zero_say_so() -> None:
    """Scale-to-zero said "matched 0 pods ... check ... for quota, image or scheduling errors"
    (a new-user probe): the pods are missing on purpose."""
    c = conds(_sized_to_zero(SPEC))
    assert c["NotRoutable"].status is v1.ConditionStatus.TRUE
    assert c["NotRoutable"].reason == "NoDecodeWorkers"
    assert "sized to 0" in c["NotRoutable"].message
    assert "quota" not in c["NotRoutable"].message
    assert c["Ready"].reason == "NoDecodeWorkers"


@pytest.mark.parametrize(
    ("mode", "says", "not_says"),
    [
        ("Manual", "kubectl scale llmpool/tiny-decode --replicas=N", "minReplicas"),
        ("External", "kubectl scale llmpool/tiny-decode --replicas=N", "raise spec.pools"),
        ("Managed", "raise spec.pools.decode.minReplicas", "kubectl scale"),
    ],
)
def test_pools_sized_to_zero_say_what_sizes_them_in_each_mode(
    mode: str, says: str, not_says: str
) -> None:
    """Found by the operator probe: "raise spec.pools.decode or .mixed replicas to serve" in
    every mode, but in Manual and External mode the LLMPool's spec.replicas decides (a raised
    spec.pools value is not applied: SpecApplied=False PoolReplicasDecide), and in Managed the
    autoscaler starts workers when requests arrive and takes a raised replicas back to
    minReplicas."""
    spec = SPEC.model_copy(update={"scaling": v1.ScalingSpec(mode=v1.ScalingMode(mode))})
    st = _sized_to_zero(spec)
    message = conds(st)["NotRoutable"].message
    assert "sized to 0" in message
    assert says in message
    assert not_says not in message
