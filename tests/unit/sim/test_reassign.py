"""`Cluster.reassign`: moving a placed request that has not started to another worker.

Invariants:
- a request waiting in its worker's queue moves: it leaves the old engine, joins the new one, the
  router's in-flight counts follow it, and it finishes on the new worker;
- a running request, an unknown one, a move to its own worker or to an incompatible role is
  refused and changes nothing;
- a split-phase request still prefilling moves its decode choice only;
- requests are conserved throughout: arrived = finished + dropped + in flight.
"""

from __future__ import annotations

from splitserve.core.ids import PoolName, RequestId
from splitserve.core.roles import Role
from splitserve.policy.batching.engine import SeqPhase
from splitserve.sim.cluster import Cluster, ClusterSpec
from splitserve.sim.engine import Simulator
from splitserve.sim.entities import PoolSpec, WorkerTemplate
from splitserve.sim.workload import WorkItem
from tests.unit.sim.builders import TINY_LAYOUT, ConstantModel

_POLICY = {"max_num_batched_tokens": 16, "chunked_prefill": False}


def _template() -> WorkerTemplate:
    return WorkerTemplate(
        latency=ConstantModel(step_time_s=1.0),
        num_blocks=64,
        kv_layout=TINY_LAYOUT,
        policy_params=dict(_POLICY),
    )


def _conserved(c: Cluster) -> None:
    assert c.num_arrived == c.num_finished + c.num_dropped + c.num_in_flight
    assert sum(w.inflight for w in c.workers) == c.num_in_flight


def _mixed(n_items: int) -> tuple[Cluster, Simulator]:
    spec = ClusterSpec((PoolSpec(PoolName("mixed"), Role.MIXED, 3, _template()),))
    items = tuple(WorkItem(0.0, 16, 3) for _ in range(n_items))
    sim = Simulator()
    cluster = Cluster(spec, items)
    cluster.start(sim)
    sim.run(cluster, until_s=0.0)
    return cluster, sim


def test_moves_a_waiting_request_and_it_finishes_there() -> None:
    cluster, sim = _mixed(4)  # least loaded: 0, 1, 2, then a fourth waits behind a prefill
    assert cluster.num_arrived == 4
    phases = {r.id: cluster.workers[r.decode_worker].engine.phase(r.id) for r in cluster.requests}
    waiting = [r for r in cluster.requests if phases[r.id] is SeqPhase.WAITING]
    running = [r for r in cluster.requests if phases[r.id] is SeqPhase.RUNNING]
    assert len(waiting) == 1
    assert running
    req = waiting[0]
    old = req.decode_worker
    new = next(w.index for w in cluster.workers if w.index != old)
    before = [w.inflight for w in cluster.workers]
    assert cluster.reassign(req.id, new, sim)
    assert req.decode_worker == new
    assert cluster.workers[old].engine.phase(req.id) is None
    assert cluster.workers[new].engine.phase(req.id) is not None
    assert cluster.workers[old].inflight == before[old] - 1
    assert cluster.workers[new].inflight == before[new] + 1
    _conserved(cluster)
    sim.run(cluster)
    _conserved(cluster)
    assert cluster.num_finished == 4
    assert cluster.num_in_flight == 0
    assert req.finish_s is not None
    assert req.num_output_tokens == 3
    assert req.decode_worker == new
    assert all(w.engine.blocks.num_free == w.engine.blocks.num_blocks for w in cluster.workers)


def test_refuses_running_unknown_same_worker_and_changes_nothing() -> None:
    cluster, sim = _mixed(3)
    r0 = cluster.requests[0]
    w0 = r0.decode_worker
    assert cluster.workers[w0].engine.phase(r0.id) is SeqPhase.RUNNING
    snapshot = [w.inflight for w in cluster.workers]
    other = (w0 + 1) % 3
    assert not cluster.reassign(r0.id, other, sim)  # running
    assert not cluster.reassign(r0.id, w0, sim)  # already there
    assert not cluster.reassign(RequestId("nope"), other, sim)
    assert not cluster.reassign(r0.id, 7, sim)
    assert r0.decode_worker == w0
    assert [w.inflight for w in cluster.workers] == snapshot
    _conserved(cluster)
    sim.run(cluster)
    assert cluster.num_finished == 3
    assert not cluster.reassign(r0.id, other, sim)  # finished


def test_split_request_still_prefilling_moves_its_decode_choice() -> None:
    t = _template()
    spec = ClusterSpec(
        (
            PoolSpec(PoolName("prefill"), Role.PREFILL, 1, t),
            PoolSpec(PoolName("decode"), Role.DECODE, 2, t),
        )
    )
    items = (WorkItem(0.0, 16, 4), WorkItem(0.0, 16, 4))
    sim = Simulator()
    cluster = Cluster(spec, items)
    cluster.start(sim)
    sim.run(cluster, until_s=0.0)
    req = cluster.requests[1]
    assert req.prefill_worker == 0
    assert req.decode_worker > 0
    assert not cluster.reassign(req.id, 0, sim)  # a prefill worker cannot decode
    new = 3 - req.decode_worker
    old = req.decode_worker
    counted = [w.inflight for w in cluster.workers]
    reserved = [w.reserved for w in cluster.workers]
    blocks = cluster.workers[old].reserved_blocks
    assert reserved[old] >= 1
    assert cluster.reassign(req.id, new, sim)
    assert req.decode_worker == new
    assert [w.inflight for w in cluster.workers] == counted  # still counted on its prefill
    # Its decode reservation (the live ledger's `move`) follows it.
    assert cluster.workers[old].reserved == reserved[old] - 1
    assert cluster.workers[new].reserved == reserved[new] + 1
    assert cluster.workers[old].reserved_blocks == blocks - req.reserved_blocks
    _conserved(cluster)
    sim.run(cluster)
    _conserved(cluster)
    assert cluster.num_finished == 2
    assert cluster.workers[new].num_steps > 0
    assert req.finish_s is not None
    assert req.num_output_tokens == 4
    assert all(w.reserved == 0 and w.reserved_blocks == 0 for w in cluster.workers)
