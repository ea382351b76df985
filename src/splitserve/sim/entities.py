"""Simulator entities: requests, workers, pools, the router and the KV links.

Owns: the mutable per-run state of each simulated thing. A `SimWorker` wraps the same
`EngineModel` (step policy + block ledger) that the live simulated engine runs, priced by a
`LatencyModel`; `SimRouter` places requests with the live router's `PdDecider` and profiles over
`EndpointView`s built from worker state. Pure: no I/O, no wall time; the cluster (`cluster.py`)
moves these entities as events arrive.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from splitserve.core.ids import EndpointId, PoolName, RequestId, SloClassName
from splitserve.core.kv import BlockManager, KvLayout
from splitserve.core.perf.protocol import BatchShape, LatencyModel
from splitserve.core.request import Request, SamplingSpec
from splitserve.core.roles import Role
from splitserve.policy.batching.builtin import make_batching_policy
from splitserve.policy.batching.engine import EngineModel, Step
from splitserve.policy.placement.base import EndpointView, Placement, RequestView
from splitserve.policy.placement.decider import PdDecider
from splitserve.policy.predict import LengthQuery, make_predictor
from splitserve.policy.predict.latency import PullRate
from splitserve.policy.predict.per_class import ClasslessPredictor, PerClassPredictor
from splitserve.sim.workload import WorkItem

HOST_LINK_BYTES_PER_S = 25e9
"""Default GPU<->host bandwidth for KV swaps: PCIe 4.0 x16 moves ~32 GB/s raw, ~25 GB/s effective
in practice (research/seed-pastfuture-alise.md §C.4; PCIe 3.0 x16, as on V100 hosts, ~12 GB/s)."""


def run_duration_s(first_s: float, slope_s: float, repeat: int) -> float:
    """Length of `repeat` fused decode steps: step i costs `first_s + i * slope_s`.

    Exact for latency models affine in context length for a fixed decode batch (the roofline and
    DistServe's A.4 form); the slope comes from pricing the first step with every context + 1.
    """
    return repeat * first_s + slope_s * repeat * (repeat - 1) / 2


def steps_done(first_s: float, slope_s: float, elapsed_s: float, repeat: int) -> int:
    """How many of a fused run's steps have ended `elapsed_s` after it started (<= repeat)."""
    if first_s <= 0:
        return repeat
    if abs(slope_s) < 1e-18:
        m = int(elapsed_s / first_s)
    else:
        a, b = slope_s / 2, first_s - slope_s / 2
        disc = max(0.0, b * b + 4 * a * elapsed_s)
        m = int((-b + math.sqrt(disc)) / (2 * a))
    m = max(0, min(m, repeat))
    while m > 0 and run_duration_s(first_s, slope_s, m) > elapsed_s:
        m -= 1
    while m < repeat and run_duration_s(first_s, slope_s, m + 1) <= elapsed_s:
        m += 1
    return m


_CACHE_MAX = 8192
"""Distinct lengths each shared-value cache keeps (beyond it, values are built per call)."""
_PROMPTS: dict[int, tuple[int, ...]] = {}
_SAMPLING: dict[int, SamplingSpec] = {}


def _zero_prompt(num_tokens: int) -> tuple[int, ...]:
    """The placeholder prompt of that length (the simulator never reads token ids), shared: the
    cyclic GC then scans one ~1,000-element tuple per distinct length, not one per request.
    A plain dict, not `functools.lru_cache`: its wrapper cost ≈ 2.5 % of a compiled replay
    (with `_sampling`'s), the dict lookup compiles to a native one."""
    prompt = _PROMPTS.get(num_tokens)
    if prompt is None:
        prompt = (0,) * num_tokens
        if len(_PROMPTS) < _CACHE_MAX:
            _PROMPTS[num_tokens] = prompt
    return prompt


def _sampling(max_tokens: int) -> SamplingSpec:
    """The sampling spec of a simulated request with that output length, shared (it is
    immutable): a frozen 17-field dataclass's `__init__` and checks cost ≈ 3.5 % of a compiled
    replay when built once per request."""
    spec = _SAMPLING.get(max_tokens)
    if spec is None:
        spec = SamplingSpec(max_tokens=max_tokens, ignore_eos=True)
        if len(_SAMPLING) < _CACHE_MAX:
            _SAMPLING[max_tokens] = spec
    return spec


@dataclass(frozen=True, slots=True)
class WorkerTemplate:
    """What every worker of a pool looks like."""

    latency: LatencyModel
    num_blocks: int
    kv_layout: KvLayout
    block_size: int = 16
    num_gpus: int = 1
    policy: str = "fcfs"
    policy_params: Mapping[str, Any] = field(default_factory=dict)
    predictor: str = ""
    """Output-length predictor the engine runs (`policy.predict.make_predictor`; "oracle" is
    exact here, as `max_tokens` is the true length), shown to the step policy as
    `SeqView.predicted_output_tokens`. Empty: none."""
    host_swap_tokens: int = 0
    """Host (CPU) memory for swapped-out KV, in tokens (0: the policy cannot swap)."""
    host_link_bytes_per_s: float = HOST_LINK_BYTES_PER_S
    """GPU<->host bandwidth that prices swaps (PCIe 4.0 x16, effective; see the constant)."""
    host_swap_overlap: bool = False
    """False: a step's swaps are copied before its batch runs (time adds up, pessimistic).
    True: copies run on their own stream beside the batch (ALISE §3.2, "overlapped with
    computation"): the step takes max(batch, copies)."""

    def __post_init__(self) -> None:
        if self.num_blocks < 1 or self.block_size < 1 or self.num_gpus < 1:
            raise ValueError("num_blocks, block_size and num_gpus must be >= 1")
        if self.host_swap_tokens < 0 or self.host_link_bytes_per_s <= 0:
            raise ValueError("host_swap_tokens must be >= 0 and host_link_bytes_per_s > 0")

    def swapped_step_s(self, batch_s: float, swap_tokens: int) -> float:
        """A step's time given its batch time and the KV tokens it swaps (both ways)."""
        copy = self.swap_s(swap_tokens)
        return max(batch_s, copy) if self.host_swap_overlap else batch_s + copy

    def swap_s(self, num_tokens: int) -> float:
        """Seconds to copy `num_tokens` of KV one way over the host link."""
        return num_tokens * self.kv_layout.bytes_per_token / self.host_link_bytes_per_s


@dataclass(frozen=True, slots=True)
class PoolSpec:
    name: PoolName
    role: Role
    replicas: int
    worker: WorkerTemplate

    def __post_init__(self) -> None:
        if self.replicas < 0:
            raise ValueError(f"replicas must be >= 0, got {self.replicas}")


@dataclass(slots=True)
class SimRequest:
    """One request's journey; timestamps are simulated seconds (None until they happen)."""

    id: RequestId
    item: WorkItem
    request: Request
    path: str = ""
    prefill_worker: int = -1
    decode_worker: int = -1
    first_token_s: float | None = None
    finish_s: float | None = None
    num_output_tokens: int = 0
    kv_transfer_s: float = 0.0
    kv_link_s: float = 0.0
    """The pull's own time on the decode worker's link (`kv_transfer_s` less the wait for the
    link): what the worker reports as the pull's time."""
    counted_on: int = -1
    """The worker whose `inflight` counts this request now (-1: none)."""
    reserved_on: int = -1
    """The decode worker holding this split request's reservation while its prompt is still on
    the prefill side (-1: none; see `SimWorker.reserved`)."""
    reserved_blocks: int = 0
    pull_on: int = -1
    """The decode worker that will pull this split request's KV and has not finished the pull
    (-1: none; see `SimWorker.pull_tokens`)."""
    predicted_output_tokens: int | None = None
    """The router's predicted output length at placement (with `RouterSlo`; None without)."""
    dropped: str = ""
    """Why the request was dropped (empty when it was not)."""

    @classmethod
    def from_item(cls, index: int, item: WorkItem) -> SimRequest:
        rid = RequestId(f"r{index}")
        request = Request(
            id=rid,
            prompt_token_ids=_zero_prompt(item.num_prompt_tokens),
            sampling=_sampling(item.num_output_tokens),
            arrival_s=item.arrival_s,
            slo_class=item.slo_class,
        )
        return cls(rid, item, request)

    @property
    def slo_class(self) -> SloClassName:
        return self.item.slo_class


class SimWorker:
    """One worker: an engine model, its latency model and its inbound KV link."""

    def __init__(self, index: int, pool: PoolSpec) -> None:
        t = pool.worker
        self.index = index
        self.id = EndpointId(f"{pool.name}-{index}")
        self.pool = pool.name
        self.role = pool.role
        self.template = t
        self.latency = t.latency
        self.engine = EngineModel(
            make_batching_policy(t.policy, **dict(t.policy_params)),
            BlockManager(t.num_blocks, t.block_size),
            tokens=None,
            kv_hold_timeout_s=float("inf"),
            predictor=make_predictor(t.predictor, seed=index) if t.predictor else None,
            host_swap_tokens=t.host_swap_tokens,
        )
        self.step: Step | None = None
        self.step_started_s = 0.0
        self.busy_s = 0.0
        self.num_steps = 0
        self.run_id = 0
        """Bumped whenever the in-flight step's end moves; older STEP_DONE events are stale."""
        self.run_first_s = 0.0
        """Duration of the first step of the fused run in flight."""
        self.run_slope_s = 0.0
        """How much longer each further step of that run takes."""
        self.version = 0
        """Bumped by the owner on every engine mutation (see `changed`)."""
        self._load_version = -1
        self._load = self.engine.load()
        self._view: EndpointView | None = None
        self._report: tuple[int, int, int, int, int, int] = (0, 0, 0, 0, 0, 0)
        self._has_report = False
        """Whether `_report` holds a report yet (a flag, not `None`: mypyc keeps a non-optional
        tuple attribute unboxed, so reading it allocates nothing)."""
        self._report_at_s = 0.0
        self._exact: tuple[int, int, int, int, int, int] = (0, 0, 0, 0, 0, 0)
        self._exact_version = -1
        self._exact_step: Step | None = None
        self._exact_started_s = 0.0
        self._exact_lo_s = 0.0
        self._exact_hi_s = -1.0
        self._exact_next = 1
        """The step count at which the cached report expires (when `_exact_hi_s` is finite)."""
        """`_exact` holds for this version, step and start while lo <= elapsed < hi."""
        self._exact_seq = 0
        """Bumped whenever `_exact_load` computes a new `_exact` (the cache's identity)."""
        self._view_seq = -1
        """The `_exact_seq` of the exact load `_view` shows (-1: none). A counter rather than
        `is` on the tuples: compiled, the tuples are unboxed and boxing them for `is` makes a
        fresh object each time, so an identity test could never hold."""
        self.inflight = 0
        """Requests the router sent here and has not seen finish (prefill: until the first
        token; decode or aggregated: until the last), as the live router counts them."""
        self.reserved = 0
        """Decode shares placed here whose prompt is still on a prefill worker: the live
        router's ledger reserves them at placement (`router.ledger.Ledger.reserve`) and its pool
        view adds them to `inflight` and takes their KV blocks off the free ones
        (`router.pool_view.PoolView._view`), so the next placement sees them."""
        self.reserved_blocks = 0
        """KV blocks of those shares (prompt + output tokens)."""
        self._view_reserved_blocks = 0
        self.link_free_s = 0.0
        """When the inbound KV link finishes its queued pulls (transfers into this worker)."""
        self.pull_tokens = 0
        """Prompt tokens of split requests placed here whose KV pull has not finished (the
        view's `pending_pull_tokens`)."""
        self.est_prefill_tokens_per_s = 0.0
        """The router's prefill-rate estimate for this worker (`RouterSlo.estimates`; 0: none,
        as before a live router has fitted one)."""
        self.est_pull_tokens_per_s = 0.0
        """The router's KV-pull-rate estimate for this worker's inbound link: measured, as the
        live router fits it (`pulled`); 0 until two pulls."""
        self.pull_rate = PullRate()
        """The live router's fit (`policy.predict.latency.PullRate`), fed this worker's pull
        totals after each pull as the live router is fed them by the load reports."""
        self.pull_rate.observe_totals(0, 0.0)  # a fresh worker's first report: nothing pulled
        self.pulled_tokens = 0
        self.pull_seconds = 0.0
        self.est_decode_base_s = 0.0
        self.est_decode_per_seq_s = 0.0
        """The router's decode step estimate, base + per_seq x batch (`RouterSlo.estimates`,
        as the prefill rate)."""

    def pulled(self, tokens: int, seconds: float) -> None:
        """A pull of `tokens` prompt tokens' KV into this worker took `seconds` on its link
        (`RouterSlo`: the router's pull rate for this worker is refitted, as the live router
        refits it from the next load report's totals)."""
        self.pulled_tokens += tokens
        self.pull_seconds += seconds
        self.pull_rate.observe_totals(self.pulled_tokens, self.pull_seconds)
        self.est_pull_tokens_per_s = self.pull_rate.tokens_per_s

    @property
    def busy(self) -> bool:
        return self.step is not None

    def step_s(self, batch: BatchShape) -> float:
        return self.latency.step_s(batch)

    def changed(self) -> None:
        """The owner mutated the engine: cached views are stale."""
        self.version += 1

    def steps_done(self, now_s: float) -> int:
        """Steps of the fused run in flight that have ended by `now_s` (0 when not in a run)."""
        step = self.step
        if step is None or step.repeat == 1:
            return 0
        done = steps_done(
            self.run_first_s, self.run_slope_s, now_s - self.step_started_s, step.repeat
        )
        return min(done, step.repeat - 1)

    def endpoint_view(self, now_s: float, report_interval_s: float = 0.0) -> EndpointView:
        """The worker as the router sees it at `now_s`: a load report plus the router's own
        count of requests it sent here and has not seen finish (`inflight`), as in the live
        `PoolView`. With `report_interval_s = 0` the report is the exact state at `now_s`;
        otherwise a report is taken when first needed after the previous one expired, stamped
        at the interval tick, and reused until the next tick (staleness up to one interval)."""
        view = self._view
        if (
            report_interval_s <= 0
            and view is not None
            and self._view_seq == self._exact_seq
            and self._exact_version == self.version
            and self._exact_step is self.step
            and self._exact_started_s == self.step_started_s
            and self._exact_lo_s <= now_s - self.step_started_s < self._exact_hi_s
            and view.inflight == self.inflight + self.reserved
            and self._view_reserved_blocks == self.reserved_blocks
            and view.pending_pull_tokens == self.pull_tokens
        ):
            return view  # `_exact_load` would hit its cache, and the view shows that load
        if report_interval_s > 0:
            if not self._has_report or now_s >= self._report_at_s + report_interval_s:
                self._report = self._exact_load(now_s)
                self._has_report = True
                self._report_at_s = now_s - now_s % report_interval_s
            waiting, running, free, total, size, pending = self._report
        else:
            load = self._exact_load(now_s)
            view = self._view
            if (
                view is not None
                and self._view_seq == self._exact_seq
                and view.inflight == self.inflight + self.reserved
                and self._view_reserved_blocks == self.reserved_blocks
                and view.pending_pull_tokens == self.pull_tokens
            ):
                return view  # nothing the view shows has changed
            self._view_seq = self._exact_seq
            waiting, running, free, total, size, pending = load
        inflight = self.inflight + self.reserved
        free = max(0, free - self.reserved_blocks)
        self._view_reserved_blocks = self.reserved_blocks
        view = self._view
        if (
            view is None
            or view.kv_free_blocks != free
            or view.inflight != inflight
            or view.num_waiting != waiting
            or view.num_running != running
            or view.pending_prefill_tokens != pending
            or view.pending_pull_tokens != self.pull_tokens
            or view.prefill_tokens_per_s != self.est_prefill_tokens_per_s
            or view.kv_pull_tokens_per_s != self.est_pull_tokens_per_s
        ):
            view = EndpointView(
                id=self.id,
                role=self.role,
                num_waiting=waiting,
                num_running=running,
                kv_free_blocks=free,
                kv_total_blocks=total,
                kv_block_size=size,
                pending_prefill_tokens=pending,
                inflight=inflight,
                prefill_tokens_per_s=self.est_prefill_tokens_per_s,
                kv_pull_tokens_per_s=self.est_pull_tokens_per_s,
                decode_step_base_s=self.est_decode_base_s,
                decode_step_per_seq_s=self.est_decode_per_seq_s,
                pending_pull_tokens=self.pull_tokens,
            )
            self._view = view
        return view

    def _exact_load(self, now_s: float) -> tuple[int, int, int, int, int, int]:
        """(waiting, running, free blocks, total blocks, block size, pending prefill tokens).

        Cached: the answer only changes with the engine (`version`), the step in flight, or when
        enough steps of a fused run have ended for its free blocks to change; the cache remembers
        that elapsed-time window (run lengths grow with the step count)."""
        step = self.step
        started = self.step_started_s
        elapsed = now_s - started
        same_run = (
            self._exact_version == self.version
            and self._exact_step is step
            and self._exact_started_s == started
        )
        if same_run and self._exact_lo_s <= elapsed < self._exact_hi_s:
            return self._exact
        if self._load_version != self.version:
            self._load = self.engine.load()
            self._load_version = self.version
        load = self._load
        free = load.free_blocks
        done = 0
        lo, hi = -math.inf, math.inf
        if step is not None and step.repeat > 1:
            first, slope = self.run_first_s, self.run_slope_s
            last = step.repeat - 1
            if first <= 0:
                done = last  # as `steps_done`: every step has ended
            elif slope < 0:
                # Not monotone (a latency model outside its contract): no window, no cache.
                done = min(steps_done(first, slope, elapsed, step.repeat), last)
                lo = math.inf
            else:
                # Run lengths grow with the step count, so `done` = the largest m <= last with
                # run_duration_s(m) <= elapsed, and it holds while elapsed < run_duration_s(m+1).
                done = -1
                if same_run and elapsed >= self._exact_hi_s:
                    # Later in the same run: walk on from the cached count (usually few steps).
                    m = self._exact_next  # run_duration_s(m) == the old hi <= elapsed
                    for _ in range(64):
                        n = m + 1  # run_duration_s(first, slope, n), inlined (same arithmetic)
                        if m >= last or n * first + slope * n * (n - 1) / 2 > elapsed:
                            done = m
                            break
                        m = n
                if done < 0:
                    done = min(steps_done(first, slope, elapsed, step.repeat), last)
                if done > 0:
                    lo = run_duration_s(first, slope, done)
                if done < last:
                    # The report holds until the free blocks can change, not just one step.
                    upto = self.engine.fused_free_blocks_change(step, done)
                    if upto <= last:
                        hi = run_duration_s(first, slope, upto)
                        self._exact_next = upto
        if done and step is not None:
            free = self.engine.fused_free_blocks(step, done)
        exact = (
            load.num_waiting,
            load.num_running + load.num_transferring,
            free,
            load.total_blocks,
            load.block_size,
            load.pending_prefill_tokens,
        )
        self._exact = exact
        self._exact_seq += 1
        self._exact_version = self.version
        self._exact_step = step
        self._exact_started_s = started
        self._exact_lo_s, self._exact_hi_s = lo, hi
        return exact


@dataclass(frozen=True, slots=True)
class PlacementRecord:
    """One placement as the simulator made it: the inputs and the decision (parity tests)."""

    request: Request
    endpoints: tuple[EndpointView, ...]
    placement: Placement


ROUTER_PREDICTORS = ("per-class", "bucketed", "history", "oracle")
"""`RouterSlo.predictor` choices: the router's three (`per-class` is its default) and the true
length (`oracle`: an upper bound only, a live router cannot know it)."""


@dataclass(frozen=True, slots=True)
class RouterSlo:
    """What the live router puts on each placement that the simulator's router otherwise
    leaves out (`router.dispatch` builds the same `RequestView`): the class's TTFT budget left
    and TPOT target, the predicted output length, and per-worker estimates (prefill rate,
    KV-pull rate, the pulls placed and not finished). With it, `PdDecider`'s SLO rules
    (`prefill_would_miss_ttft`, `pull_would_miss_tpot`) act in the simulator as in the router.

    The KV-pull rate is measured as the live router measures it: each finished pull's link
    time (`SimWorker.pulled`) feeds the router's `PullRate`, so a worker has no pull estimate
    (and `pull_would_miss_tpot` stays off for it) until its second pull.

    Approximations: the targets are the class's own (the router divides them by tail factors it
    learns, 1 until it has samples); the prefill and decode estimates are the latency model's,
    priced once per worker at `reference_tokens` (prefill of that many tokens, decode steps of
    one and two sequences at that context; the live router fits them from observed steps); the
    pull totals reach the router at each pull's end (the live router sees them at its next
    load report, ~100 ms later)."""

    classes: Mapping[str, tuple[float, float]]
    """Class name -> (TTFT target s, TPOT target s); a class not named has no SLO."""
    predictor: str = "per-class"
    """One of `ROUTER_PREDICTORS`."""
    max_tokens: int = 4096
    """The `max_tokens` the router sees (the traces carry none; the true length must not leak
    into a prediction, so the predictor's cap is this)."""
    reference_tokens: int = 1024

    def __post_init__(self) -> None:
        if self.predictor not in ROUTER_PREDICTORS:
            raise ValueError(
                f"RouterSlo.predictor {self.predictor!r}: expected one of "
                + ", ".join(ROUTER_PREDICTORS)
            )
        if self.max_tokens < 1 or self.reference_tokens < 1:
            raise ValueError("RouterSlo.max_tokens and reference_tokens must be >= 1")


class SimRouter:
    """The live placement pipeline (`PdDecider`) over views of the simulated workers."""

    def __init__(
        self,
        decider: PdDecider,
        workers: Sequence[SimWorker],
        record: bool = False,
        report_interval_s: float = 0.0,
        slo: RouterSlo | None = None,
    ) -> None:
        self.decider = decider
        self.report_interval_s = report_interval_s
        self.workers = workers
        self._index = {w.id: w.index for w in workers}
        self.records: list[PlacementRecord] | None = [] if record else None
        """Every placement's inputs and decision, when recording."""
        self.slo = slo
        self._predictor: PerClassPredictor | ClasslessPredictor | None = None
        if slo is not None and slo.predictor != "oracle":
            if slo.predictor == "per-class":
                self._predictor = PerClassPredictor(slo.classes)
            else:
                self._predictor = ClasslessPredictor(make_predictor(slo.predictor))

    def endpoint_views(self, now_s: float) -> list[EndpointView]:
        interval = self.report_interval_s
        if self.slo is not None:
            for w in self.workers:
                if w.est_prefill_tokens_per_s <= 0:
                    self._estimate(w, self.slo.reference_tokens)
        return [w.endpoint_view(now_s, interval) for w in self.workers]

    @staticmethod
    def _estimate(w: SimWorker, tokens: int) -> None:
        prefill = w.latency.step_s(BatchShape(((tokens, 0),)))
        w.est_prefill_tokens_per_s = tokens / prefill if prefill > 0 else 0.0
        one = w.latency.step_s(BatchShape((), (tokens,)))
        two = w.latency.step_s(BatchShape((), (tokens, tokens)))
        w.est_decode_per_seq_s = max(0.0, two - one)
        w.est_decode_base_s = max(0.0, one - w.est_decode_per_seq_s)
        w.changed()

    def place(self, req: SimRequest, now_s: float) -> Placement:
        """Raises `NoEligibleEndpoint` when no decode-capable worker takes work."""
        slo = self.slo
        if slo is None:
            view = RequestView(
                id=req.id,
                num_prompt_tokens=req.item.num_prompt_tokens,
                max_tokens=req.item.num_output_tokens,
                slo_class=req.item.slo_class,
            )
        else:
            budget: float | None = None
            tpot: float | None = None
            targets = slo.classes.get(req.item.slo_class)
            if targets is not None:
                budget = targets[0] - (now_s - req.item.arrival_s)
                tpot = targets[1]
            if self._predictor is None:
                predicted = max(1, req.item.num_output_tokens)  # oracle: an upper bound only
            else:
                query = LengthQuery(req.id, req.item.num_prompt_tokens, 0, slo.max_tokens)
                predicted = self._predictor.predict(req.item.slo_class, query)
            req.predicted_output_tokens = predicted
            view = RequestView(
                id=req.id,
                num_prompt_tokens=req.item.num_prompt_tokens,
                max_tokens=slo.max_tokens,
                slo_class=req.item.slo_class,
                predicted_output_tokens=predicted,
                ttft_budget_s=budget,
                tpot_target_s=tpot,
            )
        endpoints = self.endpoint_views(now_s)
        placement = self.decider.place(view, endpoints)
        if self.records is not None:
            self.records.append(PlacementRecord(req.request, tuple(endpoints), placement))
        return placement

    def finished(self, req: SimRequest) -> None:
        """A request finished: the predictor learns its length, as the router's does."""
        if self._predictor is not None and req.num_output_tokens > 0:
            self._predictor.observe(
                req.item.slo_class, req.item.num_prompt_tokens, req.num_output_tokens
            )

    def worker_index(self, eid: EndpointId) -> int:
        return self._index[eid]
