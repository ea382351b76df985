"""The simulated cluster: pools of workers behind one router, driven by the event loop.

Owns: `ClusterSpec` (pools, placement profiles, KV transfer mode), the `Cluster` world that
handles events, and `simulate()`, which runs a workload to completion and returns a `SimResult`.

Request flow mirrors the live system (design §3): the router places a request at arrival with the
`PdDecider` (prefill and decode worker chosen together, or aggregated) — or, with an admission
gate installed (`Cluster.admission`, `sim.admission`), when the gate admits it; the prefill
worker runs the prompt and holds the KV; the decode worker admits the request when its step
policy finds blocks (pull-based, DistServe §4.3), pulls the KV over its inbound link, then
decodes. KV is released on the prefill worker when the pull completes. Cluster set-ups:
colocated (mixed pools only: every request aggregated) and disaggregated (prefill + decode
pools).

Invariant (property-tested): arrived = finished + dropped + in flight, at every event.
Pure: no I/O, no wall time.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from itertools import pairwise
from typing import Protocol

from mypy_extensions import mypyc_attr

from splitserve.core.errors import CapacityError, NoEligibleEndpoint
from splitserve.core.ids import RequestId
from splitserve.core.kv import blocks_for
from splitserve.core.perf.protocol import BatchShape
from splitserve.core.roles import Role
from splitserve.policy.batching.engine import RequestMode, SeqPhase
from splitserve.policy.placement.base import Path
from splitserve.policy.placement.decider import PdDecider, PdDeciderParams
from splitserve.policy.placement.profile import (
    ProfileSpec,
    build_profile,
    default_decode_profile,
    default_prefill_profile,
)
from splitserve.sim.engine import Simulator, relax_gc
from splitserve.sim.entities import (
    PoolSpec,
    RouterSlo,
    SimRequest,
    SimRouter,
    SimWorker,
    run_duration_s,
)
from splitserve.sim.events import Event, EventKind
from splitserve.sim.metrics import RequestRecord, SimResult, WorkerRecord
from splitserve.sim.workload import WorkItem

_STEP_DONE = EventKind.STEP_DONE


class KvOverlap(StrEnum):
    NONE = "none"
    """The pull moves the whole KV after the prefill ends."""
    LAYER = "layer"
    """Layers stream while the prefill runs; only the part the prefill's compute time did not hide
    (and at least one layer's share) remains after it ends."""


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    pools: tuple[PoolSpec, ...]
    decode_profile: ProfileSpec = field(default_factory=default_decode_profile)
    prefill_profile: ProfileSpec = field(default_factory=default_prefill_profile)
    decider: PdDeciderParams = field(default_factory=PdDeciderParams)
    kv_overlap: KvOverlap = KvOverlap.NONE
    load_report_interval_s: float = 0.0
    """0: the router sees each worker's exact state; > 0: load reports this often (the live
    workers push one every ~0.1 s), plus the router's in-flight counts either way."""
    router_slo: RouterSlo | None = None
    """The SLO inputs the live router gives its decider (deadlines, predicted lengths, rate
    estimates; `sim.entities.RouterSlo`); None: placements without them (the decider's SLO
    rules never fire; the paper reproductions)."""

    @property
    def num_workers(self) -> int:
        return sum(p.replicas for p in self.pools)


class AdmissionHook(Protocol):
    """The router's admission gate in front of placement (`sim.admission.SimAdmission`)."""

    @property
    def waiting(self) -> int: ...

    def arrive(self, req: SimRequest, sim: Simulator) -> None:
        """Place `req` now (`Cluster.place`), queue it, or shed it (`Cluster.shed`)."""

    def pump(self, sim: Simulator) -> bool:
        """Re-check the queue (the pool may have changed)."""

    def first_token(self, req: SimRequest, now_s: float) -> None: ...

    def forget(self, req: SimRequest) -> None: ...


@mypyc_attr(allow_interpreted_subclasses=True)  # cluster set-ups subclass it (Splitwise, BROS)
class Cluster:
    """The world the event loop drives."""

    def __init__(
        self,
        spec: ClusterSpec,
        items: Sequence[WorkItem],
        max_repeat: int = 1 << 30,
        record_placements: bool = False,
        speed: Callable[[float], float] | None = None,
        pool_speed: Mapping[str, Callable[[float], float]] | None = None,
    ) -> None:
        if any(b.arrival_s < a.arrival_s for a, b in pairwise(items)):
            raise ValueError("work items must be in arrival order")
        self.spec = spec
        self.max_repeat = max_repeat
        """Longest fused decode run; 1 steps every decode individually (slow, for checks)."""
        self.items = items
        self.speed = speed
        """Step-time factor at a simulated time (`sim.speed`: the machine's speed during a
        recorded run, for `sim validate`); None prices steps as the latency model says."""
        self.pool_speed = pool_speed
        """The same per pool (its workers' own speed during a recorded run, `sim.validate_steps`),
        applied on top of `speed`; a pool not named runs at the model's price."""
        self.workers: list[SimWorker] = []
        for pool in spec.pools:
            for _ in range(pool.replicas):
                self.workers.append(SimWorker(len(self.workers), pool))
        decider = PdDecider(
            build_profile(spec.decode_profile), build_profile(spec.prefill_profile), spec.decider
        )
        self.router = SimRouter(
            decider, self.workers, record_placements, spec.load_report_interval_s, spec.router_slo
        )
        self.requests: list[SimRequest] = []
        self._live: dict[RequestId, SimRequest] = {}
        self.num_finished = 0
        self.num_dropped = 0
        self.admission: AdmissionHook | None = None
        """The live router's admission gate, where the modelled router has one (`sim autoscale`);
        None (the paper reproductions): every request is placed at arrival."""

    # -- bookkeeping --------------------------------------------------------------------------

    @property
    def num_arrived(self) -> int:
        return len(self.requests)

    @property
    def num_in_flight(self) -> int:
        return len(self._live)

    def start(self, sim: Simulator) -> None:
        if self.items:
            sim.schedule(self.items[0].arrival_s, EventKind.ARRIVAL, payload=0)

    def result(self, sim: Simulator) -> SimResult:
        return SimResult(
            requests=tuple(_record(r) for r in self.requests),
            workers=tuple(
                WorkerRecord(
                    id=w.id,
                    pool=w.pool,
                    role=w.role.value,
                    num_gpus=w.template.num_gpus,
                    busy_s=w.busy_s,
                    num_steps=w.num_steps,
                    num_preemptions=(
                        w.engine.num_preemptions
                        + w.engine.num_swaps_out
                        + w.engine.num_checkpoints  # partial swap-outs (0 unless used)
                    ),
                )
                for w in self.workers
            ),
            end_s=sim.now_s,
            num_events=sim.num_events,
        )

    # -- events -------------------------------------------------------------------------------

    def handle(self, event: Event, sim: Simulator) -> None:
        kind = event.kind
        if kind is _STEP_DONE:
            self._step_done(self.workers[event.target], event.payload, sim)
        elif kind is EventKind.TRANSFER_DONE:
            assert isinstance(event.payload, SimRequest)
            self._transfer_done(event.payload, sim)
        elif kind is EventKind.ARRIVAL:
            assert isinstance(event.payload, int)
            self._arrival(event.payload, sim)
        elif kind is EventKind.WAKE:
            self._kick(self.workers[event.target], sim)

    def _arrival(self, index: int, sim: Simulator) -> None:
        if index + 1 < len(self.items):
            sim.schedule(self.items[index + 1].arrival_s, EventKind.ARRIVAL, payload=index + 1)
        req = SimRequest.from_item(index, self.items[index])
        self.requests.append(req)
        self._live[req.id] = req
        if self.admission is not None:
            self.admission.arrive(req, sim)
        else:
            self.place(req, sim)

    def place(self, req: SimRequest, sim: Simulator) -> None:
        """Place an arrived request on workers now (at arrival, or when the gate admits it)."""
        try:
            placement = self.router.place(req, sim.now_s)
        except NoEligibleEndpoint:
            self._drop(req, "no eligible endpoint")
            return
        idx = self.router.worker_index
        req.decode_worker = idx(placement.decode[0])
        req.path = placement.path.value
        if placement.path is Path.DISAGGREGATED:
            req.prefill_worker = idx(placement.prefill[0])
            target, mode = self.workers[req.prefill_worker], RequestMode.PREFILL
            self._pull(req, self.workers[req.decode_worker])
        else:
            target, mode = self.workers[req.decode_worker], RequestMode.GENERATE
        try:
            target.engine.add(req.request, mode)
            target.changed()
        except CapacityError:
            self._drop(req, "exceeds worker KV capacity")
            return
        self._count_on(req, target)
        if mode is RequestMode.PREFILL:
            self._reserve(req, self.workers[req.decode_worker])
        self._touch(target, sim)

    def shed(self, req: SimRequest, reason: str) -> None:
        """The gate refused an arrived, unplaced request (shed or rejected: HTTP 429)."""
        self._drop(req, reason)

    def _step_done(self, worker: SimWorker, run_id: object, sim: Simulator) -> None:
        if run_id != worker.run_id:
            return  # a fused run that was cut short: its new end has its own event
        assert worker.step is not None
        step = worker.step
        worker.num_steps += step.repeat
        now = sim.now_s
        result = worker.engine.complete(step, now)
        worker.changed()
        worker.step = None
        worker.busy_s += now - worker.step_started_s
        live = self._live
        admission = self.admission
        for tok in result.tokens:
            req = live[tok.request_id]
            if req.first_token_s is None:
                req.first_token_s = now
                if admission is not None:
                    admission.first_token(req, now)
            req.num_output_tokens = tok.index + 1
        for rid in result.finished:
            self._finish(live[rid], now)
        for rid in result.prefilled:
            self._hand_to_decode(live[rid], sim)
        self._kick(worker, sim)
        if admission is not None and admission.waiting:
            admission.pump(sim)  # the pool changed (the live router: each load report)

    def _hand_to_decode(self, req: SimRequest, sim: Simulator) -> None:
        self._reserve(req, None)
        decode = self.workers[req.decode_worker]
        try:
            decode.engine.add(req.request, RequestMode.DECODE, first_token_id=0)
            decode.changed()
        except CapacityError:
            self.workers[req.prefill_worker].engine.release(req.id)
            self.workers[req.prefill_worker].changed()
            self._drop(req, "exceeds decode KV capacity")
            return
        self._count_on(req, decode)
        self._touch(decode, sim)

    def transfer_s(self, req: SimRequest, prefill: SimWorker, decode: SimWorker) -> float:
        """How long `req`'s KV occupies `decode`'s inbound link (the extension point cluster
        set-ups override, e.g. Splitwise's per-size transfer mode). With `KvOverlap.LAYER` only
        the part the prefill's own compute did not hide remains, at least one layer's share."""
        num_bytes = req.item.num_prompt_tokens * decode.template.kv_layout.bytes_per_token
        dur = decode.latency.kv_transfer_s(num_bytes)
        if self.spec.kv_overlap is KvOverlap.LAYER and dur > 0:
            hidden = prefill.latency.step_s(BatchShape(((req.item.num_prompt_tokens, 0),)))
            dur = max(dur / decode.template.kv_layout.num_layers, dur - hidden)
        return dur

    def _start_transfer(self, req: SimRequest, decode: SimWorker, sim: Simulator) -> None:
        dur = self.transfer_s(req, self.workers[req.prefill_worker], decode)
        now = sim.now_s
        end = max(now, decode.link_free_s) + dur
        decode.link_free_s = end
        req.kv_transfer_s = end - now
        req.kv_link_s = dur
        sim.schedule(end, EventKind.TRANSFER_DONE, decode.index, req)

    def _transfer_done(self, req: SimRequest, sim: Simulator) -> None:
        self._pull(req, None)
        decode = self.workers[req.decode_worker]
        prefill = self.workers[req.prefill_worker]
        if self.spec.router_slo is not None:
            decode.pulled(req.item.num_prompt_tokens, req.kv_link_s)
        if decode.engine.finish_transfer(req.id):
            prefill.engine.release(req.id)
        decode.changed()
        prefill.changed()
        self._touch(decode, sim)
        self._touch(prefill, sim)
        admission = self.admission
        if admission is not None and admission.waiting:
            admission.pump(sim)

    def _kick(self, worker: SimWorker, sim: Simulator) -> None:
        """Start the worker's next step if it is idle and has something it can run."""
        if worker.step is not None or not worker.engine.has_runnable_work:
            return
        now = sim.now_s
        step = worker.engine.schedule(now, self.max_repeat)
        if step is None:
            return
        worker.changed()
        worker.step = step
        worker.step_started_s = now
        for rid in step.transfers:
            self._start_transfer(self._live[rid], worker, sim)
        t0 = worker.latency.step_s(step.batch)
        if step.swap_out_tokens or step.swap_in_tokens:
            t0 = worker.template.swapped_step_s(t0, step.swap_out_tokens + step.swap_in_tokens)
        slope = 0.0
        if step.repeat > 1:
            longer = BatchShape((), tuple([c + 1 for c in step.batch.decode_contexts]))
            slope = worker.latency.step_s(longer) - t0
        if self.speed is not None:
            f = self.speed(now)
            t0, slope = t0 * f, slope * f
        if self.pool_speed is not None:
            g = self.pool_speed.get(worker.pool)
            if g is not None:
                f = g(now)
                t0, slope = t0 * f, slope * f
        worker.run_first_s, worker.run_slope_s = t0, slope
        self._schedule_done(worker, sim)

    def _schedule_done(self, worker: SimWorker, sim: Simulator) -> None:
        step = worker.step
        assert step is not None
        worker.run_id += 1
        end = worker.step_started_s + run_duration_s(
            worker.run_first_s, worker.run_slope_s, step.repeat
        )
        sim.schedule(max(end, sim.now_s), EventKind.STEP_DONE, worker.index, worker.run_id)

    def _sync(self, worker: SimWorker, now_s: float) -> None:
        """Bring a worker in a fused decode run to the state stepping one by one would show now:
        the steps that ended are applied and the one in progress holds its blocks."""
        step = worker.step
        if step is None or step.repeat == 1:
            return
        t0, slope = worker.run_first_s, worker.run_slope_s
        done = worker.steps_done(now_s)
        if done == 0:
            return
        started = worker.step_started_s + run_duration_s(t0, slope, done)
        worker.step = worker.engine.split(step, done, started)
        worker.changed()
        worker.busy_s += started - worker.step_started_s
        worker.num_steps += done
        worker.step_started_s = started
        worker.run_first_s = t0 + done * slope

    def _touch(self, worker: SimWorker, sim: Simulator) -> None:
        """The worker's engine got new work: cut a fused decode run after the step in progress
        (the new work joins the next step, as it would step by step), or start a step if idle."""
        if worker.step is None:
            self._kick(worker, sim)
            return
        if worker.step.repeat == 1:
            return
        self._sync(worker, sim.now_s)
        worker.step = worker.engine.truncate(worker.step, 1)
        self._schedule_done(worker, sim)

    def reassign(self, rid: RequestId, worker: int, sim: Simulator) -> bool:
        """Move a request placed on a decode (or mixed) worker that has not started there to
        worker index `worker` (Aladdin's Alg. 2 re-balancing). Not on the event path.

        Movable: a split-phase request whose prompt is still on its prefill worker (only the
        decode choice changes), or one waiting in its decode worker's queue with nothing
        computed there (no blocks, no output beyond a split request's first token; a preempted
        or swapped request is not movable). The target must take the same mode: a decode or
        mixed worker for a split request, a mixed one for an aggregated request. Returns False,
        changing nothing, when the request cannot move (finished, dropped, started, target
        incompatible, already there, or too big for the target's KV)."""
        req = self._live.get(rid)
        if req is None or not 0 <= worker < len(self.workers) or worker == req.decode_worker:
            return False
        if req.decode_worker < 0:
            return False
        target = self.workers[worker]
        split = req.prefill_worker >= 0
        if split:
            if target.role is Role.PREFILL:
                return False
        elif target.role is not Role.MIXED:
            return False
        old = self.workers[req.decode_worker]
        engine = old.engine
        phase = engine.phase(rid)
        if phase is None:
            if not split or req.counted_on != req.prefill_worker:
                return False  # not yet on its decode engine only while prefilling
            req.decode_worker = worker
            if req.reserved_on >= 0:
                self._reserve(req, target)
            if req.pull_on >= 0:
                self._pull(req, target)
            return True
        if phase is not SeqPhase.WAITING or engine.blocks.blocks_held(rid):
            return False
        if len(engine.output_ids(rid)) != (1 if split else 0):
            return False
        mode = RequestMode.DECODE if split else RequestMode.GENERATE
        try:
            target.engine.add(req.request, mode, first_token_id=0 if split else None)
        except CapacityError:
            return False
        engine.abort(rid)
        req.decode_worker = worker
        if req.pull_on >= 0:
            self._pull(req, target)
        old.changed()
        target.changed()
        if req.counted_on == old.index:
            self._count_on(req, target)
        self._touch(target, sim)
        return True

    def _count_on(self, req: SimRequest, worker: SimWorker | None) -> None:
        """Move the router's in-flight count for `req` to `worker` (None: nowhere)."""
        if req.counted_on >= 0:
            self.workers[req.counted_on].inflight -= 1
        req.counted_on = -1 if worker is None else worker.index
        if worker is not None:
            worker.inflight += 1

    def _reserve(self, req: SimRequest, worker: SimWorker | None) -> None:
        """Move `req`'s decode reservation to `worker` (None: release it). A split request's
        decode share is reserved on its decode worker from placement until the prefill hands it
        over, as the live router's ledger does (`SimWorker.reserved`): without it every
        arrival during a prefill backlog sees the same emptiest decode worker and all their
        decodes land there at once. The blocks are the prompt + the request's own output
        length (the live ledger uses the length predictor's estimate)."""
        if req.reserved_on >= 0:
            old = self.workers[req.reserved_on]
            old.reserved -= 1
            old.reserved_blocks -= req.reserved_blocks
        if worker is None:
            req.reserved_on, req.reserved_blocks = -1, 0
            return
        size = worker.template.block_size
        req.reserved_on = worker.index
        req.reserved_blocks = blocks_for(
            req.item.num_prompt_tokens + max(1, req.item.num_output_tokens), size
        )
        worker.reserved += 1
        worker.reserved_blocks += req.reserved_blocks

    def _pull(self, req: SimRequest, worker: SimWorker | None) -> None:
        """Move `req`'s pending KV pull to `worker`'s inbound count (None: the pull is done or
        will not happen): what the decider's `pending_pull_tokens` shows."""
        if req.pull_on >= 0:
            old = self.workers[req.pull_on]
            old.pull_tokens -= req.item.num_prompt_tokens
            old.changed()
        if worker is None:
            req.pull_on = -1
            return
        req.pull_on = worker.index
        worker.pull_tokens += req.item.num_prompt_tokens
        worker.changed()

    def _finish(self, req: SimRequest, now: float) -> None:
        self._pull(req, None)
        self.router.finished(req)
        self._reserve(req, None)
        self._count_on(req, None)
        req.finish_s = now
        del self._live[req.id]
        self.num_finished += 1

    def _drop(self, req: SimRequest, reason: str) -> None:
        if self.admission is not None:
            self.admission.forget(req)
        self._pull(req, None)
        self._reserve(req, None)
        self._count_on(req, None)
        req.dropped = reason
        del self._live[req.id]
        self.num_dropped += 1


def _record(r: SimRequest) -> RequestRecord:
    return RequestRecord(
        id=r.id,
        slo_class=r.slo_class,
        arrival_s=r.item.arrival_s,
        num_prompt_tokens=r.item.num_prompt_tokens,
        max_tokens=r.item.num_output_tokens,
        num_output_tokens=r.num_output_tokens,
        path=r.path,
        first_token_s=r.first_token_s,
        finish_s=r.finish_s,
        kv_transfer_s=r.kv_transfer_s,
        dropped=r.dropped,
    )


def simulate(
    spec: ClusterSpec,
    items: Sequence[WorkItem],
    until_s: float | None = None,
    max_repeat: int = 1 << 30,
    speed: Callable[[float], float] | None = None,
    pool_speed: Mapping[str, Callable[[float], float]] | None = None,
) -> SimResult:
    """Run `items` through a fresh cluster until every request is done (or `until_s`);
    `speed` scales each step by the factor at its start (see `Cluster.speed`), `pool_speed`
    a pool's steps (`Cluster.pool_speed`)."""
    sim = Simulator()
    cluster = Cluster(spec, items, max_repeat, speed=speed, pool_speed=pool_speed)
    cluster.start(sim)
    sim.run(cluster, until_s=until_s)
    thresholds = relax_gc()
    try:
        return cluster.result(sim)
    finally:
        gc.set_threshold(*thresholds)
