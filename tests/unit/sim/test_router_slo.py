"""The simulator's router with the live router's SLO inputs (`sim.entities.RouterSlo`).

Invariants:
- every decode worker's pending pull count (`pending_pull_tokens` in its view) returns to 0
  when a run drains, and while prompts wait for prefill it is the sum of their prompts;
- the predicted output length the decider sees never comes from the true length unless the
  `oracle` predictor is asked for (a fresh per-class predictor answers the `max_tokens` cap);
- `pull_would_miss_tpot` acts in the simulator with the same decider as the router, on a pull
  rate measured as the live router measures it (none until a worker's second pull).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from splitserve.core.ids import PoolName
from splitserve.core.roles import Role
from splitserve.sim.cluster import Cluster, ClusterSpec
from splitserve.sim.engine import Simulator
from splitserve.sim.entities import PoolSpec, RouterSlo, WorkerTemplate
from splitserve.sim.workload import WorkItem
from tests.unit.sim.builders import TINY_LAYOUT, ConstantModel


def _spec(slo: RouterSlo | None, step_s: float = 0.01, transfer_s: float = 5.0) -> ClusterSpec:
    t = WorkerTemplate(
        latency=ConstantModel(step_s, transfer_s), num_blocks=256, kv_layout=TINY_LAYOUT
    )
    return ClusterSpec(
        (
            PoolSpec(PoolName("prefill"), Role.PREFILL, 1, t),
            PoolSpec(PoolName("decode"), Role.DECODE, 2, t),
        ),
        router_slo=slo,
    )


def _slo(predictor: str, tpot_s: float = 0.1) -> RouterSlo:
    return RouterSlo({"default": (100.0, tpot_s)}, predictor)


def _run(spec: ClusterSpec, items: tuple[WorkItem, ...]) -> Cluster:
    sim = Simulator()
    cluster = Cluster(spec, items, record_placements=True)
    cluster.start(sim)
    sim.run(cluster)
    return cluster


BURST = tuple(WorkItem(0.001 * i, 64, 3) for i in range(8))


def test_short_outputs_behind_a_slow_pull_run_aggregated_with_true_lengths() -> None:
    # The pull rate is measured, as in the live router: a decode worker has none until its
    # second pull, and each pull here measures 64 tokens / 5 s (the constant link), so a
    # 64-token prompt's pull is 5 s over 2 gaps > 100 ms. Two requests one after another
    # (split: no estimate yet), then a burst: on the worker that has pulled twice the rule
    # fires, on the other (no pull yet) the burst splits.
    warm = tuple(WorkItem(30.0 * i, 64, 3) for i in range(2))
    later = tuple(WorkItem(200.0 + 0.001 * i, 64, 3) for i in range(8))
    cluster = _run(_spec(_slo("oracle")), warm + later)
    records = cluster.router.records
    assert records is not None
    assert [r.placement.reason for r in records[:2]] == ["split", "split"]
    for r in records:
        rates = {e.id: e.kv_pull_tokens_per_s for e in r.endpoints}
        if r.placement.reason == "pull_would_miss_tpot":
            assert rates[r.placement.decode[0]] == pytest.approx(64 / 5.0)
        else:
            assert r.placement.reason == "split"
            assert rates[r.placement.decode[0]] == 0  # no estimate for its decode worker
    fired = [r for r in records if r.placement.reason == "pull_would_miss_tpot"]
    assert len(fired) >= 3
    assert cluster.num_finished == len(warm) + len(later)


def test_a_fresh_predictor_does_not_know_the_lengths() -> None:
    # Nothing has finished when the burst is placed: the per-class predictor answers the cap.
    cluster = _run(_spec(_slo("per-class")), BURST)
    assert {r.predicted_output_tokens for r in cluster.requests} == {4096}
    records = cluster.router.records
    assert records is not None
    assert {r.placement.reason for r in records} == {"split"}


def test_the_predictor_learns_from_finished_requests() -> None:
    later = tuple(WorkItem(100.0 + i, 64, 3) for i in range(8))
    cluster = _run(_spec(_slo("per-class")), BURST + later)
    predicted = [r.predicted_output_tokens for r in cluster.requests[len(BURST) :]]
    assert all(p is not None and p < 4096 for p in predicted)  # the 3-token answers' bin


def test_without_router_slo_nothing_changes() -> None:
    cluster = _run(_spec(None), BURST)
    records = cluster.router.records
    assert records is not None
    assert {r.placement.reason for r in records} == {"split"}
    assert all(r.predicted_output_tokens is None for r in cluster.requests)
    assert all(e.kv_pull_tokens_per_s == 0 for r in records for e in r.endpoints)


def test_pending_pulls_are_the_prompts_placed_and_not_pulled() -> None:
    spec = _spec(_slo("per-class"), step_s=1.0)
    sim = Simulator()
    cluster = Cluster(spec, BURST, record_placements=True)
    cluster.start(sim)
    sim.run(cluster, until_s=0.5)  # every prompt still waits for the one prefill worker
    decode = [w for w in cluster.workers if w.role is Role.DECODE]
    assert sum(w.pull_tokens for w in decode) == 64 * len(BURST)
    records = cluster.router.records
    assert records is not None
    last = {e.id: e for e in records[-1].endpoints}
    assert sum(last[w.id].pending_pull_tokens for w in decode) == 64 * (len(BURST) - 1)
    sim.run(cluster)
    assert all(w.pull_tokens == 0 for w in cluster.workers)


_items = st.lists(
    st.tuples(st.floats(0, 0.05), st.integers(1, 300), st.integers(1, 12)), min_size=1, max_size=30
)


@settings(max_examples=30)
@given(_items, st.sampled_from(["per-class", "oracle", "history"]), st.floats(0.0, 2.0))
def test_pull_counts_drain_with_every_request(
    raw: list[tuple[float, int, int]], predictor: str, transfer_s: float
) -> None:
    t = 0.0
    items = []
    for gap, p, o in raw:
        t += gap
        items.append(WorkItem(t, p, o))
    cluster = _run(_spec(_slo(predictor), transfer_s=transfer_s), tuple(items))
    assert cluster.num_finished + cluster.num_dropped == len(items)
    assert all(w.pull_tokens == 0 for w in cluster.workers)
    assert all(r.pull_on == -1 for r in cluster.requests)


def test_bad_settings_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"RouterSlo\.predictor"):
        RouterSlo({}, "psychic")
    with pytest.raises(ValueError, match="max_tokens"):
        RouterSlo({}, max_tokens=0)
