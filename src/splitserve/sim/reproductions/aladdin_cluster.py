"""Aladdin's cluster set-ups for the simulator: mixed and split-phase pools with its placement.

Owns: `AladdinLoads` (the ongoing requests per endpoint that the "aladdin-pack" scorer reads, from
the requests a cluster routed), `mixed_spec` (one pool of colocated workers) and `split_spec`
(prefill pool + decode pool), each with a named placement ("aladdin" best-fit packing, "jsq"
join-the-shortest-queue, "p2c" power-of-two), and `simulate_aladdin`, which runs a workload on
such a cluster. Built only on the simulator's public API (`Cluster`, `Simulator`); nothing in
`cluster.py` changes.

Departures, noted:
* Generated-token counts: the simulator fuses runs of decode steps and updates a request's count
  when a run ends; the loads add the steps of the worker's run in progress that have ended
  (`SimWorker.steps_done`) to every request on that worker that has its first token, so a request
  waiting behind a running batch may read a few tokens ahead (it is the rare case: decode workers
  admit what fits).
* Split-phase: the decode worker is chosen at arrival (the live router's model, research D.5);
  a request counts against its decode worker from then on, as the paper's decode scheduler
  would count it once prefilled, slightly earlier.
* Alg. 2 (`Rebalancer`, run by `AladdinCluster` every `interval_s`, the scheduling heartbeat,
  100 ms by default, research C.9-8): per worker in use, the prediction error of its ongoing
  requests and of those that finished early and would still run per their prediction (a
  finished request counts until finish + (predicted − real)·T_dec); the requests not started on
  their decode worker (split: still prefilling or waiting in the decode queue; mixed: waiting
  in the queue) are the movable ones; `rebalance`'s moves are applied with `Cluster.reassign`
  when (b)-(e) hold at the target (`AladdinPacking.check`), among workers in use only (a move
  never opens a new bin). Off: `simulate_aladdin(..., rebalance=None)`.
Pure: no I/O, no wall time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from splitserve.core.ids import EndpointId, PoolName, RequestId
from splitserve.core.roles import Role
from splitserve.policy.batching.engine import SeqPhase
from splitserve.policy.placement.aladdin import (
    AladdinPacking,
    ConditionalMeanLengths,
    OngoingRequest,
    WorkerLoad,
    plan_rebalance,
)
from splitserve.policy.placement.decider import PdDeciderParams
from splitserve.policy.placement.profile import PluginSpec, ProfileSpec, default_prefill_profile
from splitserve.sim.cluster import Cluster, ClusterSpec
from splitserve.sim.engine import Simulator
from splitserve.sim.entities import PoolSpec, SimRequest, WorkerTemplate
from splitserve.sim.events import Event, EventKind
from splitserve.sim.metrics import SimResult
from splitserve.sim.reproductions.tetriinfer_cluster import RoutedMix
from splitserve.sim.workload import WorkItem

PLACEMENTS = ("aladdin", "jsq", "p2c")


class AladdinLoads:
    """Ongoing requests per endpoint, from the requests a cluster routed there.

    Bound to a `Cluster` and its `Simulator` (`bind`); until then every endpoint reads as empty.
    Predictions are made once per request, at its first sighting, from `lengths` (the same table
    the scorer uses; None: the true length, an oracle). One snapshot per simulated instant.
    """

    def __init__(self, lengths: ConditionalMeanLengths | None = None) -> None:
        self.lengths = lengths
        self._cluster: Cluster | None = None
        self._sim: Simulator | None = None
        self._open: list[SimRequest] = []
        self._seen = 0
        self._pred: dict[RequestId, int] = {}
        self._at: tuple[float, int, int] = (-1.0, -1, -1)
        self._loads: dict[int, WorkerLoad] = {}

    def bind(self, cluster: Cluster, sim: Simulator) -> None:
        self._cluster, self._sim = cluster, sim
        self._open, self._seen, self._pred = [], 0, {}
        self._at, self._loads = (-1.0, -1, -1), {}

    def predicted(self, req: SimRequest) -> int:
        got = self._pred.get(req.id)
        if got is None:
            item = req.item
            if self.lengths is None:
                got = item.num_output_tokens
            else:
                got = min(item.num_output_tokens, self.lengths.predict(item.num_prompt_tokens))
            self._pred[req.id] = got
        return got

    def invalidate(self) -> None:
        """Requests moved between workers: the next read takes a fresh snapshot."""
        self._at = (-1.0, -1, -1)

    def _snapshot(self, cluster: Cluster, now: float) -> dict[int, WorkerLoad]:
        self._open.extend(cluster.requests[self._seen :])
        self._seen = len(cluster.requests)
        self._open = [r for r in self._open if r.finish_s is None and not r.dropped]
        per: dict[int, list[OngoingRequest]] = {}
        ahead = {w.index: w.steps_done(now) for w in cluster.workers if w.step is not None}
        for r in self._open:
            if r.decode_worker < 0:
                continue
            started = r.first_token_s is not None
            gen = r.num_output_tokens + (ahead.get(r.decode_worker, 0) if started else 0)
            per.setdefault(r.decode_worker, []).append(
                OngoingRequest(
                    r.item.num_prompt_tokens,
                    min(gen, r.item.num_output_tokens),
                    self.predicted(r),
                    decode_s=now - r.first_token_s if r.first_token_s is not None else 0.0,
                    prefilled=started,
                )
            )
        return {i: WorkerLoad(tuple(v)) for i, v in per.items()}

    def __call__(self, eid: EndpointId) -> WorkerLoad:
        cluster, sim = self._cluster, self._sim
        if cluster is None or sim is None:
            return WorkerLoad()
        reqs = cluster.requests
        # The request being placed is in `requests` with no worker yet: once placed, re-read.
        key = (sim.now_s, len(reqs), reqs[-1].decode_worker if reqs else -1)
        if key != self._at:
            self._loads = self._snapshot(cluster, sim.now_s)
            self._at = key
        return self._loads.get(cluster.router.worker_index(eid), WorkerLoad())


class Rebalancer:
    """Alg. 2 over a cluster's requests, once per heartbeat (see the module notes)."""

    def __init__(
        self,
        packing: AladdinPacking,
        loads: AladdinLoads,
        interval_s: float = 0.1,
        capped: bool = True,
    ) -> None:
        """`capped`: Alg. 2 reads the placement's predictions (capped at max_tokens, which
        our workloads set to the true length, so no request finishes before its prediction);
        False: the uncapped conditional mean (a sensitivity: the error of a predictor that
        does not know max_tokens, not the one placement used)."""
        if interval_s <= 0:
            raise ValueError("interval_s must be > 0")
        self.capped = capped
        self.packing = packing
        self.loads = loads
        self.interval_s = interval_s
        self.num_heartbeats = 0
        self.num_moves = 0
        """Moves applied (a request moved twice counts twice)."""
        self.num_refused = 0
        """Moves `rebalance` proposed that (b)-(e) at the target or `reassign` refused."""
        self._open: list[SimRequest] = []
        self._seen = 0
        self._early: list[tuple[float, int, int, int]] = []
        """Finished early: (counts until, worker, real, predicted)."""

    def heartbeat(self, cluster: Cluster, sim: Simulator) -> None:
        self.num_heartbeats += 1
        now = sim.now_s
        loads, packing = self.loads, self.packing
        self._open.extend(cluster.requests[self._seen :])
        self._seen = len(cluster.requests)
        still: list[SimRequest] = []
        for r in self._open:
            if r.dropped:
                continue
            if r.finish_s is not None:
                pred = self._predicted(r)
                if r.num_output_tokens < pred and r.decode_worker >= 0:
                    until = r.finish_s + (pred - r.num_output_tokens) * packing.atgt_slo_s
                    self._early.append((until, r.decode_worker, r.num_output_tokens, pred))
                continue
            still.append(r)
        self._open = still
        self._early = [e for e in self._early if e[0] > now]
        workers = cluster.workers
        ahead = {w.index: w.steps_done(now) for w in workers if w.step is not None}
        ongoing: dict[int, list[OngoingRequest]] = {}
        pending: dict[str, tuple[EndpointId, int]] = {}
        by_id: dict[str, SimRequest] = {}
        for r in still:
            wi = r.decode_worker
            if wi < 0:
                continue
            engine = workers[wi].engine
            phase = engine.phase(r.id)
            split = r.prefill_worker >= 0
            pred = self._predicted(r)
            if (phase is None and split) or (
                phase is SeqPhase.WAITING
                and not engine.blocks.blocks_held(r.id)
                and r.num_output_tokens == (1 if split else 0)
            ):
                pending[str(r.id)] = (workers[wi].id, pred)
                by_id[str(r.id)] = r
                ongoing.setdefault(wi, [])
                continue
            started = r.first_token_s is not None
            gen = r.num_output_tokens + (ahead.get(wi, 0) if started else 0)
            ongoing.setdefault(wi, []).append(
                OngoingRequest(
                    r.item.num_prompt_tokens,
                    min(gen, r.item.num_output_tokens),
                    pred,
                    decode_s=now - r.first_token_s if r.first_token_s is not None else 0.0,
                    prefilled=started,
                )
            )
        if not pending:
            return
        finished: dict[EndpointId, list[tuple[int, int]]] = {}
        for _, wi, real, pred in self._early:
            finished.setdefault(workers[wi].id, []).append((real, pred))
        index = {w.id: w.index for w in workers}

        def capacity(eid: EndpointId) -> float:
            blocks = workers[index[eid]].engine.blocks
            return float(blocks.num_blocks * blocks.block_size)

        def apply(rid: str, eid: EndpointId) -> bool:
            return cluster.reassign(by_id[rid].id, index[eid], sim)

        # The same policy object the live router runs (`policy.placement.aladdin`).
        outcome = plan_rebalance(
            packing,
            {workers[wi].id: reqs for wi, reqs in ongoing.items()},
            finished,
            {rid: (eid, self._new(by_id[rid])) for rid, (eid, _) in pending.items()},
            capacity,
            apply,
            loads.lengths,
        )
        self.num_moves += len(outcome.moved)
        self.num_refused += len(outcome.refused)
        if outcome.moved:
            loads.invalidate()

    def _predicted(self, r: SimRequest) -> int:
        lengths = self.loads.lengths
        if self.capped or lengths is None:
            return self.loads.predicted(r)
        return lengths.predict(r.item.num_prompt_tokens)

    def _new(self, r: SimRequest) -> OngoingRequest:
        return OngoingRequest(
            r.item.num_prompt_tokens,
            0,
            self._predicted(r),
            prefilled=r.prefill_worker >= 0,
        )


class AladdinCluster(Cluster):
    """A `Cluster` that runs `rebalancer` (Alg. 2) every heartbeat while work remains: a WAKE
    event with no target, scheduled from the first arrival on."""

    def __init__(
        self, spec: ClusterSpec, items: Sequence[WorkItem], rebalancer: Rebalancer | None = None
    ) -> None:
        super().__init__(spec, items)
        self.rebalancer = rebalancer

    def start(self, sim: Simulator) -> None:
        super().start(sim)
        rb = self.rebalancer
        if rb is not None and self.items:
            sim.schedule(self.items[0].arrival_s + rb.interval_s, EventKind.WAKE)

    def handle(self, event: Event, sim: Simulator) -> None:
        rb = self.rebalancer
        if event.kind is EventKind.WAKE and event.target < 0 and rb is not None:
            rb.heartbeat(self, sim)
            if self.num_arrived < len(self.items) or self.num_in_flight > 0:
                sim.schedule(sim.now_s + rb.interval_s, EventKind.WAKE)
            return
        super().handle(event, sim)


def _profile(
    role: Role,
    placement: str,
    aladdin: Mapping[str, Any],
    loads: AladdinLoads | None,
    mix: RoutedMix | None,
    seed: int,
) -> ProfileSpec:
    if placement == "aladdin":
        params = dict(aladdin)
        if loads is not None:
            params["load_of"] = loads
        scorer = PluginSpec("aladdin-pack", 1.0, params)
    elif placement == "jsq":
        scorer = PluginSpec("least-loaded", 1.0)
    elif placement == "p2c":
        p2c: dict[str, Any] = {"seed": seed}
        if mix is not None:
            p2c.update(
                mix_of=mix,
                heavy_threshold_tokens=mix.heavy_threshold_tokens,
                length_granularity_tokens=mix.granularity_tokens,
            )
        scorer = PluginSpec("tetriinfer-p2c", 1.0, p2c)
    else:
        raise ValueError(f"placement must be one of {PLACEMENTS}, got {placement!r}")
    return ProfileSpec(
        name=f"{placement}-{role.value}",
        filters=(
            PluginSpec("accepts-work"),
            PluginSpec("role", params={"roles": frozenset({role})}),
        ),
        scorers=(scorer,),
    )


def mixed_spec(
    worker: WorkerTemplate,
    num_workers: int,
    placement: str,
    aladdin: Mapping[str, Any] | None = None,
    loads: AladdinLoads | None = None,
    mix: RoutedMix | None = None,
    seed: int = 0,
) -> ClusterSpec:
    """`num_workers` colocated (vLLM-style) workers; every request runs aggregated."""
    profile = _profile(Role.MIXED, placement, aladdin or {}, loads, mix, seed)
    return ClusterSpec(
        (PoolSpec(PoolName("mixed"), Role.MIXED, num_workers, worker),),
        decode_profile=profile,
    )


def split_spec(
    prefill: WorkerTemplate,
    num_prefill: int,
    decode: WorkerTemplate,
    num_decode: int,
    placement: str,
    aladdin: Mapping[str, Any] | None = None,
    loads: AladdinLoads | None = None,
    mix: RoutedMix | None = None,
    seed: int = 0,
) -> ClusterSpec:
    """Prefill pool (shortest queue) + decode pool placed by `placement`."""
    return ClusterSpec(
        (
            PoolSpec(PoolName("prefill"), Role.PREFILL, num_prefill, prefill),
            PoolSpec(PoolName("decode"), Role.DECODE, num_decode, decode),
        ),
        decode_profile=_profile(Role.DECODE, placement, aladdin or {}, loads, mix, seed),
        prefill_profile=default_prefill_profile(),
        decider=PdDeciderParams(min_prompt_tokens_for_pd=1),
    )


def simulate_aladdin(
    spec: ClusterSpec,
    items: Sequence[WorkItem],
    loads: AladdinLoads | None = None,
    mix: RoutedMix | None = None,
    rebalance: Rebalancer | None = None,
) -> SimResult:
    """Run `items` to completion on a fresh cluster, binding `loads` / `mix` to it first;
    `rebalance`: run Alg. 2 each heartbeat (its loads must be `loads`; None: placement only)."""
    sim = Simulator()
    cluster = AladdinCluster(spec, items, rebalance)
    if loads is not None:
        loads.bind(cluster, sim)
    if mix is not None:
        mix.bind(cluster)
    cluster.start(sim)
    sim.run(cluster)
    return cluster.result(sim)
