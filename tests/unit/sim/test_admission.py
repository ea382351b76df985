"""The live router's admission gate in the simulator (sim.admission): late placement, shed as a
miss, and no change where the gate always admits."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from splitserve.core.ids import PoolName, SloClassName
from splitserve.core.roles import Role
from splitserve.policy.admission import SloPolicyClass
from splitserve.sim.admission import SHED, AdmissionSpec, SimAdmission
from splitserve.sim.autoscale import (
    ROLES,
    Setup,
    SloTarget,
    _Fleet,
    observe,
    run_static,
    step_workload,
)
from splitserve.sim.cluster import Cluster, ClusterSpec, _record
from splitserve.sim.engine import Simulator
from splitserve.sim.entities import PoolSpec, SimRequest
from splitserve.sim.workload import WorkItem
from tests.unit.sim.builders import colocated, disaggregated

CHAT = SloTarget("chat", 2.0, 0.1)
SETUP = Setup(classes=(CHAT,))


def _burst(n: int, prompt: int = 3000, output: int = 16, cls: str = "chat") -> list[WorkItem]:
    """`n` requests arriving within (0, 0.5] s."""
    return [WorkItem((i + 1) * 0.5 / n, prompt, output, SloClassName(cls)) for i in range(n)]


def _fleet_cluster(items: list[WorkItem], setup: Setup) -> tuple[Cluster, _Fleet, Simulator]:
    template = setup.template()
    spec = ClusterSpec(tuple(PoolSpec(PoolName(r.value), r, 0, template) for r in ROLES))
    cluster = Cluster(spec, items)
    fleet = _Fleet(cluster, template, {Role.PREFILL: 1, Role.DECODE: 1})
    return cluster, fleet, Simulator()


def _run_with_late_worker(gate: bool) -> tuple[Cluster, int]:
    """P1:D1 under a burst; a second prefill worker joins at 2 s (after every arrival)."""
    items = _burst(40)
    cluster, fleet, sim = _fleet_cluster(items, SETUP)
    adm = SETUP.gate(cluster) if gate else None
    cluster.start(sim)
    sim.run(cluster, until_s=2.0)
    fleet.start(Role.PREFILL, 1, 2.0, startup_s=0.0)
    fleet.advance(2.0)
    new = fleet.active[-1].index
    if adm is not None:
        assert adm.waiting > 0  # the backlog waits at the gate, not on worker 0
        adm.pump(sim)  # the pool changed (the live router: on_change)
    sim.run(cluster)
    assert cluster.num_finished == len(items)
    return cluster, new


def test_a_backlog_queued_at_the_gate_lands_on_a_worker_added_after_the_arrivals() -> None:
    cluster, new = _run_with_late_worker(gate=True)
    late = [r for r in cluster.requests if r.prefill_worker == new]
    assert late, "no queued request was placed on the worker added after the burst"
    assert all(r.item.arrival_s < 2.0 for r in late)
    # Placement at arrival (no gate) pins the whole burst on the one prefill worker there was.
    pinned, new = _run_with_late_worker(gate=False)
    assert not [r for r in pinned.requests if r.prefill_worker == new]
    # Sharing the backlog with the new worker brings the burst's first tokens in sooner.
    ttft = [max(r.first_token_s or 0.0 for r in c.requests) for c in (cluster, pinned)]
    assert ttft[0] < ttft[1]


def test_gate_shed_counts_as_a_miss_and_is_reported() -> None:
    sheddable = replace_class(sheddable=True)
    setup = Setup(classes=(sheddable,))
    items = _burst(60)
    r = run_static(items, setup, {Role.PREFILL: 1, Role.DECODE: 1})
    assert r.shed > 0
    assert r.shed_fraction == r.shed / len(items)
    (c,) = r.classes
    assert c.attainment <= (len(items) - r.shed) / len(items)
    assert c.ttft_misses >= r.shed  # a shed request never gets its first token
    # A class that may not be shed waits instead: nothing is shed, every request finishes.
    kept = run_static(items, SETUP, {Role.PREFILL: 1, Role.DECODE: 1})
    assert kept.shed == 0
    assert kept.queued > 0


def replace_class(**kw: object) -> SloTarget:
    from dataclasses import replace

    return replace(CHAT, **kw)  # type: ignore[arg-type]


def test_the_loop_observes_the_queue_and_sheds_but_not_shed_requests_as_slo_results() -> None:
    setup = Setup(classes=(replace_class(sheddable=True),))
    items = _burst(60)
    cluster, fleet, sim = _fleet_cluster(items, setup)
    adm = setup.gate(cluster)
    assert adm is not None
    cluster.start(sim)
    sim.run(cluster, until_s=1.0)
    shed = [r for r in cluster.requests if r.dropped.startswith(SHED)]
    assert shed
    obs = observe(cluster, fleet, 1.0, setup, [], adm)
    assert obs.router_queue == adm.waiting
    assert obs.shed == len(shed)
    assert obs.classes[0].shed == len(shed)
    assert obs.arrival_rate_per_s == len(items) / 1.0  # every arrival, shed or queued


def test_an_always_admitting_gate_changes_nothing() -> None:
    pairs = [(1500, 200), (3000, 150), (800, 100)]
    items = list(step_workload(pairs, 2.0, 4.0, 20.0, 30.0, 20.0, np.random.default_rng(3)))
    open_gate = Setup(classes=(CHAT,), admission=AdmissionSpec(max_backlog_fraction=1e12))
    no_gate = Setup(classes=(CHAT,), admission=None)
    pools = {Role.PREFILL: 1, Role.DECODE: 1}
    a, b = run_static(items, open_gate, pools), run_static(items, no_gate, pools)
    assert a.classes == b.classes
    assert a.gpu_hours == b.gpu_hours
    assert (a.shed, a.queued) == (0, 0)
    # Request by request, through the cluster directly.
    records = []
    for setup in (open_gate, no_gate):
        template = setup.template()
        spec = ClusterSpec(
            (
                PoolSpec(PoolName("prefill"), Role.PREFILL, 1, template),
                PoolSpec(PoolName("decode"), Role.DECODE, 2, template),
            )
        )
        cluster = Cluster(spec, items)
        setup.gate(cluster)
        sim = Simulator()
        cluster.start(sim)
        sim.run(cluster)
        records.append([_record(r) for r in cluster.requests])
    assert records[0] == records[1]
    # ... while the router's default gate does queue this load (the test can tell them apart).
    assert run_static(items, Setup(classes=(CHAT,)), pools).queued > 0


def test_admission_spec_refuses_bad_values() -> None:
    with pytest.raises(ValueError, match="max_backlog_fraction"):
        AdmissionSpec(max_backlog_fraction=0)
    with pytest.raises(ValueError, match="max_outstanding_per_worker"):
        AdmissionSpec(max_outstanding_per_worker=0)
    with pytest.raises(ValueError, match="queue_capacity"):
        AdmissionSpec(queue_capacity=-1)
    with pytest.raises(ValueError, match="SLO class"):
        SimAdmission(Cluster(ClusterSpec(()), []), [])


def test_outstanding_cap_holds_requests_at_the_gate() -> None:
    spec = AdmissionSpec(max_backlog_fraction=1e12, max_outstanding_per_worker=2)
    setup = Setup(classes=(CHAT,), admission=spec)
    items = _burst(12, prompt=200, output=64)
    cluster, _, sim = _fleet_cluster(items, setup)
    adm = setup.gate(cluster)
    assert adm is not None
    cluster.start(sim)
    sim.run(cluster, until_s=0.6)
    decode = [w for w in cluster.router.workers if w.role is Role.DECODE]
    assert sum(w.inflight + w.reserved for w in decode) <= 2
    assert adm.waiting == len(items) - 2
    sim.run(cluster)
    assert cluster.num_finished == len(items)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.floats(0, 0.05), st.integers(1, 300), st.integers(1, 40)),
        min_size=1,
        max_size=40,
    ),
    st.booleans(),
    st.booleans(),
    st.integers(0, 8),
)
def test_gated_cluster_conserves_requests_and_admits_in_arrival_order(
    raw: list[tuple[float, int, int]], disagg: bool, sheddable: bool, capacity: int
) -> None:
    """At every event arrived = finished + dropped + in flight (queued at the gate counts as in
    flight); the run drains; only the gate drops (sheds); one class is admitted first come
    first served; a non-sheddable class is shed only when the queue is full."""
    t, items = 0.0, []
    for gap, p, o in raw:
        t += gap
        items.append(WorkItem(t, p, o, SloClassName("c")))
    spec = disaggregated(1, 2, 256) if disagg else colocated(2, 256)
    cluster = Cluster(spec, items)
    cls = SloPolicyClass("c", ttft_s=0.05, tpot_s=1.0, sheddable=sheddable)
    adm = SimAdmission(
        cluster, [cls], AdmissionSpec(max_backlog_fraction=0.1, queue_capacity=capacity)
    )
    cluster.admission = adm
    order: list[int] = []
    place = adm._place  # every placement through the gate; not `cluster.place`, whose method
    # the compiled (mypyc) build cannot replace on an instance

    def placing(req: SimRequest, now: float, point: float | None, sim: Simulator) -> None:
        order.append(int(req.id[1:]))
        place(req, now, point, sim)

    adm._place = placing  # type: ignore[method-assign]
    sim = Simulator()
    cluster.start(sim)
    while True:
        while sim.run(cluster, max_events=1):
            assert cluster.num_arrived == (
                cluster.num_finished + cluster.num_dropped + cluster.num_in_flight
            )
        if not adm.pump(sim):
            break
    assert adm.waiting == 0
    assert cluster.num_in_flight == 0
    assert cluster.num_finished + cluster.num_dropped == len(items)
    dropped = [r for r in cluster.requests if r.dropped]
    assert all(r.dropped.startswith(SHED) for r in dropped)
    assert len(dropped) == adm.num_shed
    assert order == sorted(order)
    if not sheddable and capacity >= len(items):
        assert adm.num_shed == 0
