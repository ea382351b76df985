"""The simulated cluster, end to end on tiny workloads.

Invariants:
- requests are conserved at every event: arrived = finished + dropped + in flight;
- a run drains: every request finishes or is dropped, and every worker's KV blocks are free;
- for every finished request: arrival <= first token <= finish (TTFT <= E2E), and it produced
  exactly the tokens it asked for;
- colocated clusters run everything aggregated; disaggregated ones run prompts on a prefill
  worker and decode elsewhere, with the KV transfer on the critical path;
- the same workload and cluster give the same result (determinism);
- the router's in-flight counts return to 0, and with stale load reports they still spread a
  burst across workers (as the live router's do);
- a single FCFS server with one prompt per step and constant step time D under Poisson(R)
  arrivals has mean TTFT = D + R·D² / (2(1 - R·D)) (M/D/1, DistServe Eq. 1).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from splitserve.core.ids import PoolName
from splitserve.core.roles import Role
from splitserve.sim.cluster import Cluster, ClusterSpec, KvOverlap, simulate
from splitserve.sim.engine import Simulator
from splitserve.sim.entities import PoolSpec, SimRequest, WorkerTemplate
from splitserve.sim.workload import Fixed, Poisson, Uniform, WorkItem, synthetic
from tests.unit.sim.builders import TINY_LAYOUT, ConstantModel, colocated, disaggregated

_items = st.lists(
    st.tuples(st.floats(0, 0.05), st.integers(1, 300), st.integers(1, 40)), min_size=1, max_size=40
)


def _workload(raw: list[tuple[float, int, int]]) -> tuple[WorkItem, ...]:
    t = 0.0
    out = []
    for gap, p, o in raw:
        t += gap
        out.append(WorkItem(t, p, o))
    return tuple(out)


@settings(max_examples=40)
@given(_items, st.booleans(), st.integers(8, 64))
def test_conservation_at_every_event(
    raw: list[tuple[float, int, int]], disagg: bool, num_blocks: int
) -> None:
    spec = disaggregated(1, 2, num_blocks) if disagg else colocated(2, num_blocks)
    items = _workload(raw)
    sim = Simulator()
    cluster = Cluster(spec, items)
    cluster.start(sim)
    while sim.run(cluster, max_events=1):
        assert cluster.num_arrived == (
            cluster.num_finished + cluster.num_dropped + cluster.num_in_flight
        )
    result = cluster.result(sim)
    assert result.num_arrived == len(items)
    assert result.num_in_flight == 0
    assert result.num_finished + result.num_dropped == len(items)
    for w in cluster.workers:
        assert w.engine.blocks.num_free == w.engine.blocks.num_blocks
        assert w.inflight == 0
    for r in result.requests:
        if r.finished:
            assert r.first_token_s is not None
            assert r.finish_s is not None
            assert r.arrival_s <= r.first_token_s <= r.finish_s
            assert r.num_output_tokens == r.max_tokens
            ttft, e2e = r.ttft_s, r.e2e_s
            assert ttft is not None
            assert e2e is not None
            assert ttft <= e2e


def test_paths_follow_the_cluster_setup() -> None:
    items = synthetic(Poisson(50), Uniform(16, 128), Uniform(2, 16), 60, np.random.default_rng(0))
    colo = simulate(colocated(2), items)
    assert {r.path for r in colo.requests} == {"aggregated"}
    assert all(r.kv_transfer_s == 0 for r in colo.requests)
    dis = simulate(disaggregated(2, 2), items)
    assert {r.path for r in dis.requests} == {"disaggregated"}
    assert all(r.kv_transfer_s > 0 for r in dis.requests)
    assert dis.num_finished == colo.num_finished == 60
    assert dis.num_gpus == 4
    assert 0 < dis.busy_gpu_seconds <= dis.gpu_seconds


def test_layer_overlap_shortens_transfers() -> None:
    items = synthetic(Poisson(5), Fixed(256), Fixed(4), 20, np.random.default_rng(0))
    spec = disaggregated(1, 1)
    plain = simulate(spec, items)
    overlap = simulate(ClusterSpec(spec.pools, kv_overlap=KvOverlap.LAYER), items)
    assert sum(r.kv_transfer_s for r in overlap.requests) < sum(
        r.kv_transfer_s for r in plain.requests
    )


def test_deterministic() -> None:
    items = synthetic(Poisson(40), Uniform(8, 200), Uniform(1, 30), 80, np.random.default_rng(3))
    assert simulate(disaggregated(1, 2), items) == simulate(disaggregated(1, 2), items)


def test_oversized_requests_are_dropped() -> None:
    items = (WorkItem(0.0, 10_000, 4), WorkItem(0.1, 10, 4))
    result = simulate(colocated(1, num_blocks=16), items)
    assert [bool(r.dropped) for r in result.requests] == [True, False]
    assert result.num_finished == 1


def test_no_decode_worker_drops() -> None:
    spec = ClusterSpec(disaggregated(1, 1).pools[:1])
    result = simulate(spec, (WorkItem(0.0, 10, 2),))
    assert result.requests[0].dropped == "no eligible endpoint"


@pytest.mark.parametrize(("rate", "expected"), [(0.3, 1.2143), (0.5, 1.5), (0.8, 3.0)])
def test_md1_queue_matches_distserve_eq1(rate: float, expected: float) -> None:
    template = WorkerTemplate(
        latency=ConstantModel(step_time_s=1.0),
        num_blocks=64,
        kv_layout=TINY_LAYOUT,
        policy_params={"max_num_batched_tokens": 16, "chunked_prefill": False},
    )
    spec = ClusterSpec((PoolSpec(PoolName("m"), Role.MIXED, 1, template),))
    n = 30_000 if rate == 0.8 else 12_000
    items = synthetic(Poisson(rate), Fixed(16), Fixed(1), n, np.random.default_rng(7))
    result = simulate(spec, items)
    ttft = [t for r in result.requests if (t := r.ttft_s) is not None]
    assert np.mean(ttft) == pytest.approx(expected, rel=0.05)


@settings(max_examples=25)
@given(_items, st.booleans(), st.integers(8, 64))
def test_fused_decode_runs_match_stepping_one_by_one(
    raw: list[tuple[float, int, int]], disagg: bool, num_blocks: int
) -> None:
    """Fusing pure-decode steps (the speed path) changes no timestamp, count or decision."""
    spec = disaggregated(1, 2, num_blocks) if disagg else colocated(2, num_blocks)
    items = _workload(raw)
    fused = simulate(spec, items)
    single = simulate(spec, items, max_repeat=1)
    assert fused.num_events <= single.num_events
    for a, b in zip(fused.requests, single.requests, strict=True):
        assert (a.path, a.dropped, a.num_output_tokens) == (b.path, b.dropped, b.num_output_tokens)
        assert a.first_token_s == pytest.approx(b.first_token_s, abs=1e-9)
        assert a.finish_s == pytest.approx(b.finish_s, abs=1e-9)
    for wa, wb in zip(fused.workers, single.workers, strict=True):
        assert wa.num_steps == wb.num_steps
        assert wa.num_preemptions == wb.num_preemptions
        assert wa.busy_s == pytest.approx(wb.busy_s, abs=1e-9)


def test_items_must_be_in_arrival_order() -> None:
    with pytest.raises(ValueError, match="arrival order"):
        simulate(colocated(1), (WorkItem(1.0, 4, 2), WorkItem(0.5, 4, 2)))


def test_stale_reports_with_inflight_spread_a_burst() -> None:
    spec = colocated(4)
    burst = tuple(WorkItem(0.0, 32, 4) for _ in range(8))
    for interval in (0.0, 10.0):
        sim = Simulator()
        cluster = Cluster(
            ClusterSpec(spec.pools, load_report_interval_s=interval), burst, record_placements=True
        )
        cluster.start(sim)
        sim.run(cluster)
        records = cluster.router.records
        assert records is not None
        firsts = [r.placement.decode[0] for r in records]
        assert sorted(firsts.count(w.id) for w in cluster.workers) == [2, 2, 2, 2]
        if interval:
            # Every decision saw the same (stale) report; only the in-flight counts moved.
            assert {tuple(e.num_waiting for e in r.endpoints) for r in records} == {(0, 0, 0, 0)}


def test_requests_share_their_immutable_per_length_values() -> None:
    a = SimRequest.from_item(0, WorkItem(0.0, 100, 7))
    b = SimRequest.from_item(1, WorkItem(1.0, 100, 7))
    c = SimRequest.from_item(2, WorkItem(2.0, 101, 8))
    assert a.request.sampling is b.request.sampling  # immutable, shared per output length
    assert a.request.prompt_token_ids is b.request.prompt_token_ids
    assert c.request.sampling.max_tokens == 8
    assert c.request.sampling.ignore_eos
    assert c.request.num_prompt_tokens == 101


def test_decode_shares_are_reserved_while_their_prompts_wait_for_prefill() -> None:
    """A burst queues on one prefill worker; each request's decode worker is chosen at arrival.
    The live router's ledger reserves the decode share at placement, so the next placement
    sees it; without that every arrival saw the same idle decode workers and all the decodes
    went to one of them (the fleet step's collapse: one decode worker with hundreds queued
    while others sat idle, docs/autoscaling.md)."""
    slow = WorkerTemplate(latency=ConstantModel(1.0), num_blocks=256, kv_layout=TINY_LAYOUT)
    spec = ClusterSpec(
        (
            PoolSpec(PoolName("prefill"), Role.PREFILL, 1, slow),
            PoolSpec(PoolName("decode"), Role.DECODE, 4, slow),
        )
    )
    burst = tuple(WorkItem(0.001 * i, 64, 4) for i in range(16))
    sim = Simulator()
    cluster = Cluster(spec, burst, record_placements=True)
    cluster.start(sim)
    sim.run(cluster, until_s=0.5)
    decode = [w for w in cluster.workers if w.role is Role.DECODE]
    records = cluster.router.records
    assert records is not None
    picks = [r.placement.decode[0] for r in records]
    assert sorted(picks.count(w.id) for w in decode) == [4, 4, 4, 4]
    # Every prompt is still on the prefill side: nothing handed over yet, all reserved.
    assert all(w.engine.load().num_waiting + w.engine.load().num_running == 0 for w in decode)
    assert sorted(w.reserved for w in decode) == [4, 4, 4, 4]
    last = {e.id: e for e in records[-1].endpoints}
    # The last placement saw the 15 earlier shares as in flight and their blocks as taken.
    assert sum(last[w.id].inflight for w in decode) == 15
    assert sum(last[w.id].kv_free_blocks for w in decode) < 4 * 256
    sim.run(cluster)
    assert cluster.num_finished == 16
    assert all(w.reserved == 0 and w.reserved_blocks == 0 for w in cluster.workers)
    done = sorted(sum(1 for r in cluster.requests if r.decode_worker == w.index) for w in decode)
    assert done == [4, 4, 4, 4]
