"""BROS's workload driver: open-loop real-time arrivals plus closed-loop best-effort batches.

Owns: `simulate_hybrid`, which runs real-time (RT) `WorkItem`s arriving on their own schedule
together with best-effort (BE) requests submitted in batches, each batch when the previous one
has finished (seeds/bros.txt §7.1: "BE requests are periodically submitted in a batch manner when
previous batched requests are completed", the Batch-API pattern). Built only on the simulator's
public API plus a `Cluster` subclass that injects the BE batches between events; nothing in
`cluster.py` changes. Optionally it records every token's time (`token_times`), for BROS's
per-token reading of TPOT attainment: the simulator's records keep only a mean TPOT per request.

Pure: no I/O, no wall time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from splitserve.core.errors import CapacityError, NoEligibleEndpoint
from splitserve.core.ids import RequestId
from splitserve.policy.batching.engine import RequestMode
from splitserve.sim.cluster import Cluster, ClusterSpec
from splitserve.sim.engine import Simulator
from splitserve.sim.entities import SimRequest, SimWorker
from splitserve.sim.events import Event
from splitserve.sim.metrics import SimResult
from splitserve.sim.workload import WorkItem

BatchSource = Callable[[int, float], Sequence[WorkItem]]
"""(batch number, now) -> the BE items of that batch (their arrival times are ignored)."""
TokenTimes = dict[str, list[float]]
"""Request id -> the time each of its output tokens came out, in order."""


class HybridCluster(Cluster):
    """A colocated cluster whose BE work arrives in closed-loop batches until `be_until_s`."""

    def __init__(
        self,
        spec: ClusterSpec,
        rt_items: Sequence[WorkItem],
        be_batches: BatchSource,
        be_until_s: float,
        token_times: TokenTimes | None = None,
    ) -> None:
        # Recording token times steps one decode at a time (no fused runs); the engine
        # guarantees every count, block and timing is what fused runs give (engine.py).
        super().__init__(spec, rt_items, 1 if token_times is not None else 1 << 30)
        self.be_batches = be_batches
        self.be_until_s = be_until_s
        self.token_times = token_times
        self.num_be_batches = 0
        self._be_open: list[SimRequest] = []

    def start(self, sim: Simulator) -> None:
        super().start(sim)
        self._submit_be(sim)

    def handle(self, event: Event, sim: Simulator) -> None:
        super().handle(event, sim)
        if self._be_open and all(r.finish_s is not None or r.dropped for r in self._be_open):
            self._be_open = []
            if sim.now_s < self.be_until_s:
                self._submit_be(sim)

    def _step_done(self, worker: SimWorker, run_id: object, sim: Simulator) -> None:
        times = self.token_times
        step = worker.step
        if times is None or step is None or run_id != worker.run_id:
            super()._step_done(worker, run_id, sim)
            return
        live = self._live
        watched = [
            (req, req.num_output_tokens)
            for rid, _ in step.decision.chunks
            if (req := live.get(rid)) is not None
        ]
        super()._step_done(worker, run_id, sim)
        now = sim.now_s
        for req, before in watched:
            for _ in range(req.num_output_tokens - before):
                times.setdefault(str(req.id), []).append(now)

    def _submit_be(self, sim: Simulator) -> None:
        now = sim.now_s
        items = self.be_batches(self.num_be_batches, now)
        self.num_be_batches += 1
        for item in items:
            at_now = WorkItem(now, item.num_prompt_tokens, item.num_output_tokens, item.slo_class)
            req = SimRequest.from_item(len(self.requests), at_now)
            rid = RequestId(f"be{len(self.requests)}")  # RT items own the ids r<item index>
            req.id, req.request = rid, replace(req.request, id=rid)
            self.requests.append(req)
            self._live[req.id] = req
            self._be_open.append(req)
            try:
                placement = self.router.place(req, now)
            except NoEligibleEndpoint:
                self._drop(req, "no eligible endpoint")
                continue
            req.decode_worker = self.router.worker_index(placement.decode[0])
            req.path = placement.path.value
            target = self.workers[req.decode_worker]
            try:
                target.engine.add(req.request, RequestMode.GENERATE)
                target.changed()
            except CapacityError:
                self._drop(req, "exceeds worker KV capacity")
                continue
            self._count_on(req, target)
            self._touch(target, sim)


def simulate_hybrid(
    spec: ClusterSpec,
    rt_items: Sequence[WorkItem],
    be_batches: BatchSource,
    be_until_s: float,
    token_times: TokenTimes | None = None,
) -> SimResult:
    """Run RT `rt_items` with closed-loop BE batches (none submitted after `be_until_s`) until
    every request is done. RT requests are `r<item index>`, BE ones `be<submission index>`.
    With `token_times` (an empty dict) every output token's time is recorded into it."""
    sim = Simulator()
    cluster = HybridCluster(spec, rt_items, be_batches, be_until_s, token_times)
    cluster.start(sim)
    sim.run(cluster)
    return cluster.result(sim)
