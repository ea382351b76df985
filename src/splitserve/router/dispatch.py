"""The P/D flow: place a request (pure `PdDecider`), then run it on workers over gRPC.

Disaggregated: `Prefill` on the best prefill worker P (on failure the next P, then aggregated),
then `Decode` on decode worker D with P's KV handle. Aggregated: `Generate` on D. When D fails
the next D takes over: with the KV handle if D never got to pull it (UNAVAILABLE), otherwise by
re-running prompt + tokens already emitted with `Generate`, so the stream carries on with no
token duplicated or lost. A worker that produces no token for `token_stall_timeout_s` (frozen,
wedged) is treated as failed the same way. A decode whose KV pull fails (ABORTED: the prefill
worker died or no longer holds the KV) is re-run with `Generate` on the same worker before the
next one is tried. Ending a stream early (client gone, stop string) sends a best-effort
`Cancel(request_id)` to every worker involved. Worker INVALID_ARGUMENT / OUT_OF_RANGE /
RESOURCE_EXHAUSTED mean the request can never fit: `InvalidRequest`, never retried.

SLO-aware placement: each request gets its class, deadlines and predicted output length
(`SloRuntime`), passes admission (`Admission`: dispatch now, wait in the EDF queue, or 429), and
is placed by the decider of `router.placementProfile` under `router.disaggregation`. The
placement *reserves* its share on the chosen decode and prefill workers at decision time
(`PoolView.ledger`), so simultaneous requests see each other; the reservation turns into the
worker's own load once the call to it starts, and leaves the ledger when the request leaves the
worker. Each decision is counted by path and reason; the request's latencies feed the latency
model of the workers it used (`PoolView.latency`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Final, TypeVar

import grpc
from grpc import aio

from splitserve._gen.v1 import common_pb2, worker_pb2, worker_pb2_grpc
from splitserve.api import v1alpha1 as v1
from splitserve.api.router import DispatchSettings, PlacementSettings, SloSettings
from splitserve.core.clock import Clock
from splitserve.core.errors import ConfigError, NoEligibleEndpoint
from splitserve.core.ids import EndpointId
from splitserve.core.request import FinishReason, Request, TokenLogprobs
from splitserve.core.roles import Role
from splitserve.obs import tracing
from splitserve.obs.metrics import RouterMetrics
from splitserve.policy.placement import (
    Disaggregation,
    EndpointView,
    Path,
    PdDecider,
    PdDeciderParams,
    Placement,
    RequestView,
)
from splitserve.policy.placement.aladdin import AladdinPacking
from splitserve.policy.placement.slo import predicted_pull_s, predicted_tpot_s
from splitserve.router import messages
from splitserve.router.admission import Admission
from splitserve.router.cancel import Canceller
from splitserve.router.cold_start import ColdStartHold, can_serve
from splitserve.router.errors import InvalidRequest, RequestTimeout, WorkersFailed
from splitserve.router.fast_lane import FastLane
from splitserve.router.kv_source import is_member, kv_source_problem
from splitserve.router.ledger import Ledger
from splitserve.router.metric_children import Children
from splitserve.router.mux import MuxLink, MuxLinks, MuxStream
from splitserve.router.pool_view import PoolView, UnknownEndpoint
from splitserve.router.profiles import build_decider
from splitserve.router.rebalance import LiveRebalancer
from splitserve.router.request_stats import RequestStats, outcome_of
from splitserve.router.slo import RequestSlo, SloRuntime

log = logging.getLogger(__name__)

# Final answers about the request itself, never retried elsewhere: bad input (INVALID_ARGUMENT),
# and a request larger than a worker's whole KV cache (OUT_OF_RANGE from our workers;
# RESOURCE_EXHAUSTED from engines that use it for the same).
_REJECTED: Final = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.OUT_OF_RANGE,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    }
)


@dataclass(frozen=True, slots=True)
class Chunk:
    """Tokens for the client; `finish_reason` is set on the last chunk only."""

    token_ids: tuple[int, ...]
    finish_reason: FinishReason | None = None
    logprobs: tuple[TokenLogprobs, ...] = ()
    """With `SamplingSpec.logprobs`: one per token of `token_ids`."""
    prompt_logprobs: tuple[TokenLogprobs | None, ...] = ()
    """With `SamplingSpec.prompt_logprobs`, on the first chunk: one per prompt token (None for
    the first)."""


_T = TypeVar("_T")


class StallTimer:
    """`asyncio.timeout(stall_s)` around each read of a token stream, without a timer per read.

    One timer, re-armed lazily: when it fires while no read is waiting (the consumer holds the
    last chunk) or a read started less than `stall_s` ago, it is set again for that read's due
    time; only a read waiting `stall_s` is cancelled (and raises `TimeoutError`). A read then
    costs a clock reading instead of a timer handle pushed on and cancelled off the loop's heap.

    `step_age_s`: seconds since the worker's engine last reported a step (None: unknown). A read
    that waited `stall_s` on a worker that stepped less than `stall_s` ago is not a stall: the
    worker is alive and the request is queued behind others on it; the wait goes on until the
    worker itself has been silent for `stall_s` (frozen, wedged) or the request timeout passes.
    Without step reports (None) the read's own wait decides, as before.
    """

    __slots__ = (
        "_cancelling",
        "_fired",
        "_handle",
        "_loop",
        "_since",
        "_stall_s",
        "_step_age_s",
        "_task",
    )

    def __init__(
        self, stall_s: float, step_age_s: Callable[[], float | None] | None = None
    ) -> None:
        self._stall_s = stall_s
        self._step_age_s = step_age_s
        self._loop = asyncio.get_running_loop()
        self._since: float | None = None
        """When the read in progress started; None: no read waiting."""
        self._task: asyncio.Task[object] | None = None
        self._handle: asyncio.TimerHandle | None = None
        self._fired = False
        self._cancelling = 0

    def _start(self) -> asyncio.Task[object]:
        task = asyncio.current_task()
        assert task is not None
        self._task, self._cancelling = task, task.cancelling()
        self._since = since = self._loop.time()
        if self._handle is None:
            self._handle = self._loop.call_at(since + self._stall_s, self._check)
        return task

    def _timed_out(self, task: asyncio.Task[object]) -> bool:
        """The cancellation being handled is the timer's (not someone else's)."""
        if self._fired:
            self._fired = False
            return task.uncancel() <= self._cancelling
        return False

    async def read(self, call: aio.UnaryStreamCall | MuxStream) -> common_pb2.TokenChunk | None:
        """`call.read()`, None at the end of the stream, or `TimeoutError` after `stall_s`."""
        chunk = await self.wait(call.read())
        if chunk is aio.EOF:
            return None
        assert isinstance(chunk, common_pb2.TokenChunk)
        return chunk

    async def wait(self, answer: Awaitable[_T]) -> _T:
        """`await answer` (a unary call: the prefill's first token), or `TimeoutError` after
        `stall_s` as `read`."""
        task = self._start()
        try:
            return await answer
        except asyncio.CancelledError:
            if self._timed_out(task):
                raise TimeoutError from None
            raise
        finally:
            self._since = None

    def restart(self) -> None:
        """A chunk was taken by the fast lane (`fast_lane`) while a read waits: the wait for
        the next token starts now, as a new read would."""
        if self._since is not None:
            self._since = self._loop.time()

    def _check(self) -> None:
        self._handle = None
        since, task = self._since, self._task
        if since is None or task is None:
            return  # no read waiting: the next read arms the timer again
        now = self._loop.time()
        due = since + self._stall_s
        if now >= due:
            age = None if self._step_age_s is None else self._step_age_s()
            if age is not None and age < self._stall_s:
                # The worker stepped within stall_s: queued, not stalled. Look again when it
                # will have been silent for stall_s.
                self._handle = self._loop.call_at(now + self._stall_s - age, self._check)
                return
            self._fired = True
            task.cancel()
        else:
            self._handle = self._loop.call_at(due, self._check)

    def close(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


class _WorkerFailed(Exception):  # noqa: N818 - internal signal
    """One worker call failed in a way another worker may not (internal to the retry loops)."""

    def __init__(
        self,
        eid: EndpointId,
        detail: str,
        *,
        unreachable: bool = False,
        kv_lost: bool = False,
        again_here: bool = False,
    ) -> None:
        super().__init__(f"{eid}: {detail}")
        self.unreachable = unreachable
        self.kv_lost = kv_lost
        """The worker is fine but could not read the prefilled KV (ABORTED)."""
        self.again_here = again_here
        """Nothing was done there (an early Decode refused): the same worker, an ordinary call."""


def default_decider(
    settings: PlacementSettings | None = None, ledger: Ledger | None = None
) -> PdDecider:
    """The decider of `settings.profile` under `settings.disaggregation`, over `ledger`."""
    settings = settings or PlacementSettings()
    params = PdDeciderParams(
        min_prompt_tokens_for_pd=settings.min_prompt_tokens_for_pd,
        mode=Disaggregation(settings.disaggregation.value),
    )
    return build_decider(settings.profile.value, ledger or Ledger(), params)


def unavailable_condition(views: list[EndpointView]) -> str:
    """The bounded label of why no decode-capable worker takes work (the 503's condition)."""
    decode = [v for v in views if v.role.can_decode or not v.ready]
    if not views:
        return "no_workers"
    if not decode:
        return "no_decode_role"
    for cond, hit in (
        ("not_ready", lambda v: not v.ready),
        ("fenced", lambda v: v.fenced),
        ("draining", lambda v: v.draining),
    ):
        if all(hit(v) for v in decode):
            return cond
    return "mixed_conditions"


class Dispatcher:
    """Runs requests on the pool. One per router process."""

    def __init__(
        self,
        pool: PoolView,
        *,
        clock: Clock,
        metrics: RouterMetrics,
        settings: DispatchSettings | None = None,
        decider: PdDecider | None = None,
        slo: SloSettings | None = None,
        placement: PlacementSettings | None = None,
        multiplex: bool = True,
    ) -> None:
        self.pool = pool
        shared = getattr(pool, "links", None)
        self._own_links = multiplex and shared is None
        self.links: MuxLinks | None = (
            (shared or MuxLinks(pool.settings.link)) if multiplex else None
        )
        """One `Multiplex` stream per worker (`router.mux`); None: one call per request. With
        `pool.link: stream`, the pool's own (its feeds share them: one socket per worker)."""
        self.clock = clock
        self.metrics = metrics
        self.placements = Children(metrics.placements)  # per request (`metric_children`)
        self.settings = settings or DispatchSettings()
        self.decider = decider or default_decider(ledger=pool.ledger)
        self.canceller = Canceller(self.settings.cancel_timeout_s)
        self.slo = SloRuntime(slo or SloSettings(), clock, metrics)
        self.admission = Admission(
            pool,
            self.slo.settings,
            clock=clock,
            metrics=metrics,
            tightest_ttft_s=self.slo.tightest_ttft_s,
            ttft_tail=self.slo.ttft_tail,
            tightest_percentile=self.slo.tightest_percentile,
        )
        self.hold = ColdStartHold(
            pool,
            clock=clock,
            metrics=metrics,
            wait_s=self.settings.cold_start_wait_s,
            max_held=self.settings.cold_start_max_held,
        )
        """Requests held while no decode-capable worker is ready (`router.cold_start`)."""
        self.rebalancer: LiveRebalancer | None = None
        """Aladdin's Alg. 2, with the `aladdin` placement profile."""
        if placement is not None and placement.profile is v1.PlacementProfile.ALADDIN:
            packing = AladdinPacking(load_of=pool.ledger.load_of)
            self.rebalancer = LiveRebalancer(packing, pool, clock)

    def open(self, request: Request) -> Dispatch:
        """A dispatch for `request`; nothing runs until its `chunks()` are iterated."""
        return Dispatch(self, request)

    async def drain_background(self) -> None:
        """Wait for the cancels still going out (at shutdown, and in tests)."""
        await self.canceller.drain()
        await self.admission.close()

    def close_holds(self) -> int:
        """Router shutdown: answer the requests held for a cold start (`ColdStartHold.close`)."""
        return self.hold.close()

    async def close(self) -> None:
        """Close the workers' multiplexed streams (at shutdown, after the requests ended)."""
        if self.links is not None and self._own_links:
            await self.links.close()  # (the pool closes its own)


class Dispatch:
    """One request's run through the pool. Iterate `chunks()` under `contextlib.aclosing`."""

    def __init__(self, dispatcher: Dispatcher, request: Request) -> None:
        self._d = dispatcher
        self.request = request
        self.placement: Placement | None = None
        self.path: Path | None = None
        """The path actually taken (a failed prefill turns disaggregated into aggregated)."""
        self.endpoints: dict[EndpointId, worker_pb2_grpc.WorkerAsyncStub] = {}
        """Every worker the request was sent to."""
        self._stopped = False
        try:
            self.slo: RequestSlo = dispatcher.slo.for_request(request)
        except (ConfigError, ValueError) as err:  # the edges check first; gRPC callers too
            raise InvalidRequest(str(err), getattr(err, "param", "x-slo-class")) from err
        self._stats = RequestStats(
            dispatcher.metrics, dispatcher.clock, request.num_prompt_tokens, self.slo.label
        )
        self._deadline_s = self._stats.start_s + dispatcher.settings.request_timeout_s
        self._trace = tracing.RequestTrace.start(request.id, self.slo.label)  # NOOP when off
        self._ledger_eps: set[EndpointId] = set()
        """Workers holding a ledger entry (reservation or running share) of this request."""
        self._decode_eid: EndpointId | None = None
        self._decode_batch = 0
        """The decode worker's batch (with this request) when placed: the latency model's x."""
        self._call_start_s: dict[EndpointId, tuple[float, int]] = {}
        """Per worker: when its call started and the prefill tokens ahead of ours then."""
        self._admitted: tuple[float, float | None] | None = None
        """When admission let the request go, and its TTFT point prediction then."""
        self._predicted_tpot_s: float | None = None
        """The decode worker's predicted TPOT with this request, at placement."""
        self._sampling: common_pb2.SamplingParams | None = None
        self.lane: FastLane | None = None
        """Set by the consumer before `chunks()` runs: mid-stream chunks of a `Multiplex`
        decode may be handled in the link's reader (`fast_lane`)."""
        self._early: tuple[EndpointId, MuxStream] | None = None
        """`DispatchSettings.early_decode`: the Decode sent at placement, not yet used."""

    @property
    def num_output_tokens(self) -> int:
        return self._stats.num_output_tokens

    def stop(self, unused_tokens: int = 0) -> None:
        """Mark that the router ends this request on purpose (stop string) before closing it.
        `unused_tokens`: tokens of the last chunk after the one that completed the stop string;
        they are not the answer's and do not count in its usage (vLLM stops at that token)."""
        self._stopped = True
        self._stats.num_output_tokens -= unused_tokens

    # -- the flow --------------------------------------------------------------------------

    async def chunks(self) -> AsyncGenerator[Chunk, None]:
        """Run the request; yield its tokens. Closing early cancels the work on every worker.

        Raises:
            NoEligibleEndpoint: no decode-capable worker accepts work.
            InvalidRequest: a worker says the request can never fit.
            WorkersFailed: every candidate worker failed.
            RequestTimeout: the request timeout passed.
        """
        self._stats.start()
        finished, error = False, None
        try:
            d = self._d
            self._trace.begin("admission")
            # One snapshot of the pool for admission and placement (they run in the same step
            # unless the request waits in the queue; then placement takes a new one).
            views = d.pool.views()
            held = False
            if d.hold.enabled and not can_serve(views):
                await self._hold()
                held, views = True, d.pool.views()
            predicted, at_once = await d.admission.enter_with(
                self.request.id, self.request.num_prompt_tokens, self.slo, views, counted=held
            )
            self._admitted = (d.clock.now_s(), predicted)
            try:
                self.placement = self._place(views if at_once else d.pool.views())
            finally:
                d.admission.placed(self.request.num_prompt_tokens)
            self.path = self.placement.path
            self._trace.end("admission", tracing.placement_attributes(self.placement))
            self._open_early(self.placement)
            # The prefill's first token, then the decode's stream, read here directly (no
            # generator layer between: each layer costs every chunk a resumption).
            first, head = await self._prefill_first(self.placement)
            # Set before yielding: a consumer may close us as soon as it has the last one.
            finished = head is not None and self._account(head)
            if head is not None and finished:
                yield head
            if not finished:
                decode = self._decode_order(self.placement)
                run = self._decode_any(decode, first, start_first=head is not None)
                async with contextlib.aclosing(run):
                    if head is not None:
                        # The Decode call is made before token 1 goes to the consumer: it is on
                        # its way while the consumer sends token 1 (closing us cancels it).
                        early = await self._start_decode(run)
                        yield head
                        if early is not None:
                            raise early
                    async for chunk in run:
                        assert chunk is not None
                        finished = self._account(chunk)
                        yield chunk
                        if finished:
                            break
            if not finished:
                raise WorkersFailed("the worker stream ended without a finish reason")
        except BaseException as err:
            error = err
            if isinstance(err, NoEligibleEndpoint):
                cond = unavailable_condition(self._d.pool.views())
                self._d.metrics.unavailable.labels(cond).inc()
                if unreachable := self._d.pool.unreachable_summary():
                    error = NoEligibleEndpoint(f"{err}; {unreachable}")
                log.warning(
                    "request %s: no worker can take it (%s): %s%s",
                    self.request.id,
                    cond,
                    err,
                    f"; {text}" if (text := self._d.pool.unreachable_text()) else "",
                )
                if error is not err:
                    raise error from err
            raise
        finally:
            self._drop_early()
            if not finished and self.endpoints:
                self._d.canceller.cancel_later(self.request.id, dict(self.endpoints))
            for eid in self._ledger_eps:
                self._d.pool.ledger.drop(eid, self.request.id)
            self._d.pool.ledger.moved_to(self.request.id)  # a move never read: forget it
            outcome = outcome_of(error, ended_on_purpose=finished or self._stopped)
            self._stats.finish(outcome, self._path_label(), reached_worker=bool(self.endpoints))
            self._stats.log_finished(
                self.request.id, outcome, self._path_label(), self._trace.trace_id
            )
            self._trace.finish(
                {"splitserve.outcome": outcome, "splitserve.path": self._path_label()}
            )
            if outcome == "ok":
                self._observe_finish()
            # The exception's traceback holds this frame, whose `error` holds the exception: a
            # cycle that would leave the whole request to the garbage collector.
            error = None

    async def _hold(self) -> None:
        """Wait (bounded) for a decode-capable worker (`router.cold_start`). The request counts
        as an arrival waiting at the router (`admission_total{outcome="queued"}`) now; once it
        goes on, its deadlines run from then: the hold does not count against admission's TTFT
        test or placement's budgets (a request is not shed only because it waited for a cold
        start), while its attainment is still measured from its arrival."""
        d, rs = self._d, self.slo
        d.admission.count_arrival(rs.label, "queued")
        await d.hold.wait(
            self.request.id, self.request.num_prompt_tokens, rs.label, self._remaining_s()
        )
        self.slo = d.slo.restamped(rs, self.request, d.clock.now_s())

    def _place(self, views: list[EndpointView] | None = None) -> Placement:
        """Place on `views` (the pool's snapshot admission decided on; None: take one now)."""
        req, d = self.request, self._d
        if views is None:
            views = d.pool.views()
        now_s = d.clock.now_s()
        dl = self.slo.deadlines
        # Targets hold at the class's percentile: the headroom scorers compare the point
        # predictions with the targets divided by the tail factors (the same as comparing the
        # predictions at that percentile with the targets).
        q = self.slo.cls.percentile
        ttft_budget = None
        if dl.ttft_deadline_s != float("inf"):
            ttft_budget = (dl.ttft_deadline_s - now_s) / d.slo.ttft_tail.factor(q)
        tpot_target = None if dl.tpot_s is None else dl.tpot_s / d.slo.tpot_tail.factor(q)
        view = RequestView(
            req.id,
            req.num_prompt_tokens,
            req.sampling.max_tokens,
            slo_class=req.slo_class,
            predicted_output_tokens=self.slo.predicted_output_tokens,
            ttft_budget_s=ttft_budget,
            tpot_target_s=tpot_target,
        )
        placement = d.decider.place(view, views)
        d.placements(placement.path.value, placement.reason).inc()
        by_id = {v.id: v for v in views}
        # Reserve at decision time: the next placement (even in this same instant) sees it.
        dv = by_id.get(placement.decode[0])
        split = placement.path is Path.DISAGGREGATED
        if dv is not None:
            self._decode_batch = dv.batch + 1
            self._predicted_tpot_s = predicted_tpot_s(dv)
            pull = predicted_pull_s(dv, req.num_prompt_tokens) if split else None
            if self._predicted_tpot_s is not None and pull is not None:
                # A split request's TPOT (first token to last, over its gaps) holds its KV
                # pull: predicted over its predicted gaps, so the TPOT tail learns the model's
                # error, not the pull (which would tighten every class's TPOT target).
                gaps = max(1, self.slo.predicted_output_tokens - 1)
                self._predicted_tpot_s += pull / gaps
        self._reserve(placement.decode[0], dv, prefill=False, movable=split, pulls=split)
        if placement.prefill:
            self._reserve(placement.prefill[0], by_id.get(placement.prefill[0]), prefill=True)
        log.debug(
            "placed %s: %s P=%s D=%s (%s)",
            req.id,
            placement.path,
            placement.prefill[:1],
            placement.decode[:1],
            placement.reason,
        )
        return placement

    def _reserve(
        self,
        eid: EndpointId,
        v: EndpointView | None,
        *,
        prefill: bool,
        movable: bool = False,
        pulls: bool = False,
    ) -> None:
        self._d.pool.ledger.reserve(
            eid,
            self.request.id,
            prefill=prefill,
            num_prompt_tokens=self.request.num_prompt_tokens,
            predicted_output_tokens=self.slo.predicted_output_tokens,
            block_size=v.kv_block_size if v is not None else 16,
            movable=movable,
            pulls=pulls,
        )
        self._ledger_eps.add(eid)

    def _slo_context(self) -> common_pb2.SloContext:
        """The request's SLO for the worker's step policy, as budgets from now."""
        dl, now_s = self.slo.deadlines, self._d.clock.now_s()
        ttft = 0.0 if math.isinf(dl.ttft_deadline_s) else max(1e-6, dl.ttft_deadline_s - now_s)
        done = dl.completion_deadline_s
        return common_pb2.SloContext(
            priority=self.slo.cls.priority,
            ttft_budget_s=ttft,
            tpot_target_s=dl.tpot_s or 0.0,
            completion_budget_s=0.0 if done is None else max(1e-6, done - now_s),
        )

    def _observe_first_token(self) -> None:
        """Calibrate the TTFT tail on this request. Aggregated: also feed the decode worker's
        prefill rate from the time to its first token (the prompt tokens ahead of ours, plus
        ours); disaggregated requests feed it from the prefill worker's own report
        (`PrefillResponse.prefill_s`) instead."""
        first_s = self._stats.first_token_s
        if first_s is not None and self._admitted is not None:
            admitted_s, predicted = self._admitted
            self._d.admission.observe_ttft(predicted, first_s - admitted_s)
        if self.path is not Path.AGGREGATED:
            return
        eid = self._decode_eid
        started = self._call_start_s.get(eid) if eid is not None else None
        if first_s is None or eid is None or started is None:
            return
        start_s, ahead = started
        self._d.pool.latency.observe_prefill(
            eid, ahead + self.request.num_prompt_tokens, first_s - start_s
        )

    def _observe_finish(self) -> None:
        st = self._stats
        if self._decode_eid is not None and st.tpot_s is not None and self._decode_batch:
            self._d.pool.latency.observe_decode(self._decode_eid, self._decode_batch, st.tpot_s)
        rb = self._d.rebalancer
        if rb is not None and self._decode_eid is not None:
            rb.finished(self._decode_eid, st.num_output_tokens, self.slo.predicted_output_tokens)
        if st.tpot_s is not None and self._predicted_tpot_s is not None:
            self._d.slo.tpot_tail.observe(self._predicted_tpot_s, st.tpot_s)
        end_s = st.end_s if st.end_s is not None else self._d.clock.now_s()
        arrival = self.request.arrival_s
        ttft = None if st.first_token_s is None else st.first_token_s - arrival
        self._d.slo.finished(
            self.slo,
            self.request,
            st.num_output_tokens,
            ttft,
            st.tpot_s,
            end_s - arrival,
            truncated=False,
        )

    def _account(self, chunk: Chunk) -> bool:
        """A chunk's bookkeeping (metrics, TTFT calibration, ledger progress); is it the last?"""
        stats = self._stats
        first = stats.first_token_s is None
        stats.on_tokens(len(chunk.token_ids), self._path_label())
        if first and stats.first_token_s is not None:
            self._observe_first_token()
        if self._decode_eid is not None:
            self._d.pool.ledger.progress(self._decode_eid, self.request.id, stats.num_output_tokens)
        return chunk.finish_reason is not None

    async def _prefill_first(
        self, placement: Placement
    ) -> tuple[worker_pb2.PrefillResponse | None, Chunk | None]:
        """Disaggregated: the prefill's answer and its first token as a chunk (None, None when
        aggregated, or when every prefill worker failed: then the path turns aggregated)."""
        if placement.path is not Path.DISAGGREGATED:
            return None, None
        first = await self._prefill_any(placement.prefill)
        if first is None:
            self._fallback("prefill_to_aggregated")
            self.path = Path.AGGREGATED
            for eid in self._ledger_eps:
                self._d.pool.ledger.no_pull(eid, self.request.id)  # no KV to pull now
            return None, None
        reason = messages.FINISH_FROM_PB.get(first.finish_reason)
        logprobs: tuple[TokenLogprobs, ...] = ()
        if first.HasField("first_token_logprobs"):
            logprobs = (messages.logprobs_from_pb(first.first_token_logprobs),)
        prompt = messages.prompt_logprobs_from_pb(first.prompt_logprobs)
        return first, Chunk((first.first_token_id,), reason, logprobs, prompt)

    def _open_early(self, placement: Placement) -> None:
        """`DispatchSettings.early_decode`: send the Decode to the first decode candidate now,
        before the prefill answers (`kv_follows`; `_decode_any` sends its first token and KV on
        the same sub-request). Only over a Multiplex link; otherwise nothing happens here."""
        if not self._d.settings.early_decode or placement.path is not Path.DISAGGREGATED:
            return
        if not placement.decode:
            return
        eid = placement.decode[0]
        try:
            stub = self._d.pool.stub(eid)
        except KeyError:
            return
        link = self._link(eid, stub)
        if link is None:
            return
        md = self._trace.begin("decode", {"splitserve.kv": True, "splitserve.early": True})
        msg = messages.early_decode(
            self.request, self._slo_context(), sampling_pb=self._sampling_pb()
        )
        sub = link.early_decode(msg, self._remaining_s(), md)
        if sub is not None:
            self._early = (eid, sub)

    def _take_early(
        self, eid: EndpointId, first_token_id: int, kv: common_pb2.KvHandle | None
    ) -> MuxStream | None:
        """The early Decode if it went to `eid` and is still open, with its first token and KV
        sent; otherwise it is cancelled (another worker, no KV to pull, or it ended) and None."""
        early, self._early = self._early, None
        if early is None:
            return None
        e_eid, sub = early
        if (
            e_eid == eid
            and kv is not None
            and sub.follow(worker_pb2.DecodeKv(first_token_id=first_token_id, kv=kv))
        ):
            return sub
        self._note_refused(e_eid, sub)
        sub.cancel()
        return None

    def _drop_early(self) -> None:
        """An early Decode never used (the prefill failed or ended the request; an error): the
        worker drops it (it holds nothing of the request's before its KV comes)."""
        early, self._early = self._early, None
        if early is not None:
            self._note_refused(*early)
            early[1].cancel()

    def _note_refused(self, eid: EndpointId, sub: MuxStream) -> None:
        """An early Decode the worker refused (an older worker: no `kv_follows`): logged once
        and counted; its link sends it no more until it reconnects (`MuxLink.early_refused`),
        rather than a refused call and an ordinary one for every request."""
        if not sub.refused() or sub.link.early_refused:
            return
        sub.link.early_refused = True
        self._fallback("early_decode_refused")
        log.warning(
            "decode worker %s refused an early Decode (kv_follows; an older worker?): sending it "
            "ordinary Decodes until its link reconnects",
            eid,
        )

    def _decode_order(self, placement: Placement) -> tuple[EndpointId, ...]:
        """The decode candidates, the one Aladdin's re-balancing moved the share to first."""
        decode = tuple(placement.decode)
        moved = self._d.pool.ledger.moved_to(self.request.id)
        if moved is not None:  # Aladdin's re-balancing moved the decode share meanwhile
            self._ledger_eps.discard(decode[0])
            self._ledger_eps.add(moved)
            decode = (moved, *(e for e in decode if e != moved))
        return decode

    async def _prefill_any(
        self, candidates: Sequence[EndpointId]
    ) -> worker_pb2.PrefillResponse | None:
        req = self.request
        msg = messages.prefill(req, self._slo_context(), sampling_pb=self._sampling_pb())
        stall_s = self._d.settings.token_stall_timeout_s
        for i, eid in enumerate(candidates):
            if i:
                self._fallback("prefill_retry")
            stub = self._involve(eid, prefill=True)
            if stub is None:
                continue
            self._d.pool.acquire(eid)
            # The first token is a token: a prefill worker that stalls is given up on too (not
            # one that is stepping, with this prompt queued behind others: `StallTimer`).
            stall = StallTimer(stall_s, self._step_age(eid))
            try:
                timeout_s = self._remaining_s()
                md = self._trace.begin("prefill", {"splitserve.worker": eid})
                link = self._link(eid, stub)
                resp: worker_pb2.PrefillResponse = await stall.wait(
                    link.prefill(msg, timeout_s, md)
                    if link is not None
                    else stub.Prefill(msg, timeout=timeout_s, metadata=md)
                )
            except aio.AioRpcError as err:
                self._raise_if_final(eid, err)
                log.warning("prefill of %s on %s failed: %s", req.id, eid, err.code())
                self._d.canceller.cancel_later(req.id, {eid: stub})  # whatever it holds
                continue
            except TimeoutError:
                self._d.metrics.fallbacks.labels("token_stall").inc()
                log.warning(
                    "prefill of %s on %s: no answer and no engine step for %g s (stalled)",
                    req.id,
                    eid,
                    stall_s,
                )
                self._d.canceller.cancel_later(req.id, {eid: stub})
                continue
            finally:
                stall.close()
                self._trace.end("prefill")
                self._d.pool.release(eid)
                # The prompt is computed (or failed): no more prefill work of ours there.
                self._d.pool.ledger.drop(eid, req.id)
                self._ledger_eps.discard(eid)
            if resp.finish_reason in (
                common_pb2.FINISH_REASON_ERROR,
                common_pb2.FINISH_REASON_CANCELLED,
            ):
                log.warning("prefill of %s on %s ended with %s", req.id, eid, resp.finish_reason)
                continue
            problem = kv_source_problem(resp.kv, eid, self._d.pool) if resp.HasField("kv") else None
            if problem is not None:  # never hand a decode worker a foreign KV source
                log.warning("prefill of %s on %s: %s; its KV is not used", req.id, eid, problem)
                self._fallback("kv_source_refused")
                self._d.canceller.cancel_later(req.id, {eid: stub})
                continue
            if resp.prefill_s > 0:  # the worker's own report of the prefill's engine time
                self._d.pool.latency.observe_prefill(
                    eid, resp.num_prompt_tokens or req.num_prompt_tokens, resp.prefill_s
                )
            return resp
        return None

    @staticmethod
    async def _start_decode(run: AsyncGenerator[Chunk | None, None]) -> Exception | None:
        """Run `_decode_any(start_first=True)` up to its first worker call (its None); what it
        raised before (every candidate gone) is returned, to raise after token 1 is out."""
        try:
            started = await anext(run)
        except StopAsyncIteration:
            return WorkersFailed("the decode ended before it started")
        except Exception as err:
            return err
        assert started is None
        return None

    async def _decode_any(
        self,
        candidates: Sequence[EndpointId],
        first: worker_pb2.PrefillResponse | None,
        *,
        start_first: bool = False,
    ) -> AsyncGenerator[Chunk | None, None]:
        """The decode's chunks from the first candidate that finishes it. `start_first`: yield
        None once, right after the first worker call is made (before any chunk is read)."""
        emitted: list[int] = [first.first_token_id] if first is not None else []
        kv = first.kv if first is not None and first.HasField("kv") else None
        queue = list(candidates)
        stall_s = self._d.settings.token_stall_timeout_s
        for i, eid in enumerate(queue):
            if i:
                self._fallback("decode_retry" if kv is not None else "generate_retry")
            stub = self._involve(eid)
            if stub is None:
                continue
            if kv is not None and not is_member(self._d.pool, kv.source_address):
                self._fallback("kv_source_left")  # its KV went with it: generate instead
                kv = None
            early = (
                self._take_early(eid, emitted[0] if emitted else 0, kv)
                if self._early is not None
                else None
            )
            call = early or self._decode_call(stub, emitted, kv, self._link(eid, stub))
            num_before = len(emitted)
            self._d.pool.acquire(eid)
            stall = StallTimer(stall_s, self._step_age(eid))
            lane = self.lane
            if lane is not None and type(call) is MuxStream:
                lane.attach(call, self._lane_bookkeeping(emitted, stall))
            try:
                # The worker's stream read here (no generator layer of its own).
                try:
                    if start_first:
                        start_first = False
                        yield None
                    while True:
                        try:
                            pb = await stall.read(call)
                        except TimeoutError:
                            self._d.metrics.fallbacks.labels("token_stall").inc()
                            raise _WorkerFailed(
                                eid, f"no token for {stall_s:g} s (stalled)"
                            ) from None
                        if pb is None:
                            raise _WorkerFailed(eid, "stream ended without a finish reason")
                        if pb.finish_reason == common_pb2.FINISH_REASON_ERROR:
                            raise _WorkerFailed(eid, f"worker error: {pb.error or 'unknown'}")
                        if pb.finish_reason == common_pb2.FINISH_REASON_CANCELLED:
                            # We did not ask (we would have stopped reading): the worker is
                            # going away.
                            raise _WorkerFailed(eid, "the worker cancelled the request")
                        reason = messages.FINISH_FROM_PB.get(pb.finish_reason)
                        if pb.token_ids or reason is not None:
                            tokens = tuple(pb.token_ids)
                            logprobs = (
                                tuple(messages.logprobs_from_pb(lp) for lp in pb.logprobs)
                                if pb.logprobs
                                else ()
                            )
                            emitted.extend(tokens)
                            prompt = (
                                messages.prompt_logprobs_from_pb(pb.prompt_logprobs)
                                if pb.prompt_logprobs
                                else ()
                            )
                            yield Chunk(tokens, reason, logprobs, prompt)
                        if reason is not None:
                            return
                except aio.AioRpcError as err:
                    if early is not None and len(emitted) == num_before and early.refused():
                        # The worker refused the early Decode when its KV came (an older
                        # worker): an ordinary Decode there, with the same KV.
                        self._note_refused(eid, early)
                        raise _WorkerFailed(
                            eid, f"early Decode refused: {err.details()}", again_here=True
                        ) from err
                    self._raise_if_final(eid, err)
                    raise _WorkerFailed(
                        eid,
                        str(err.code()),
                        unreachable=err.code() == grpc.StatusCode.UNAVAILABLE,
                        kv_lost=err.code() == grpc.StatusCode.ABORTED,
                    ) from err
                finally:
                    if lane is not None and type(call) is MuxStream:
                        lane.detach(call)
                    stall.close()
                    call.cancel()
            except _WorkerFailed as err:
                log.warning("request %s failed on %s: %s", self.request.id, eid, err)
                if err.again_here:
                    queue.insert(i + 1, eid)
                    continue
                if kv is not None and err.kv_lost and len(emitted) == num_before:
                    # The worker is fine and already ended the decode: generate there instead.
                    # No Cancel to it: a late one would cancel the retry (same request id).
                    queue.insert(i + 1, eid)
                else:
                    self._d.canceller.cancel_later(self.request.id, {eid: stub})
                if kv is not None and (len(emitted) > num_before or not err.unreachable):
                    self._drop_kv(first)
                    kv = None
            finally:
                self._trace.end("decode")
                self._d.pool.release(eid)
        raise WorkersFailed(
            f"no {self._roles_word(queue)} worker could finish request {self.request.id}"
        )

    def _roles_word(self, eids: Sequence[EndpointId]) -> str:
        """The roles of the workers `eids` as the error names them ("mixed", "decode", "decode
        or mixed"); a worker gone from the pool counts as a decode worker."""
        roles = set()
        for eid in eids:
            try:
                roles.add(self._d.pool.view(eid).role)
            except UnknownEndpoint:
                roles.add(Role.DECODE)
        names = [r.value for r in (Role.DECODE, Role.MIXED) if r in roles]
        return " or ".join(names) or "decode"

    def _step_age(self, eid: EndpointId) -> Callable[[], float | None]:
        """Seconds since `eid`'s engine last reported a step (None: unknown), for `StallTimer`."""
        latency = self._d.pool.latency
        return lambda: latency.step_age_s(eid)

    def _lane_bookkeeping(
        self, emitted: list[int], stall: StallTimer
    ) -> Callable[[tuple[int, ...]], None]:
        """What `_decode_any` and `chunks` do for a mid-stream chunk, for the fast lane: the
        tokens kept for a take-over, the stall timer's wait restarted, `_account`."""
        account = self._account

        def on_tokens(tokens: tuple[int, ...]) -> None:
            emitted.extend(tokens)
            stall.restart()
            account(Chunk(tokens))

        return on_tokens

    def _decode_call(
        self,
        stub: worker_pb2_grpc.WorkerAsyncStub,
        emitted: list[int],
        kv: common_pb2.KvHandle | None,
        link: MuxLink | None = None,
    ) -> aio.UnaryStreamCall | MuxStream:
        timeout_s = self._remaining_s()
        md = self._trace.begin("decode", {"splitserve.kv": kv is not None})
        if link is not None:
            if kv is not None:
                sampling = self._sampling_pb()
                msg = messages.decode(
                    self.request, emitted[0], kv, self._slo_context(), sampling_pb=sampling
                )
                return link.stream("decode", msg, timeout_s, md)
            gen = messages.generate(self.request, emitted, self._slo_context())
            return link.stream("generate", gen, timeout_s, md)
        if kv is not None:
            sampling = self._sampling_pb()
            return stub.Decode(
                messages.decode(
                    self.request, emitted[0], kv, self._slo_context(), sampling_pb=sampling
                ),
                timeout=timeout_s,
                metadata=md,
            )
        # Aggregated, or taking over from a failed decode: prompt plus what the client has.
        return stub.Generate(
            messages.generate(self.request, emitted, self._slo_context()),
            timeout=timeout_s,
            metadata=md,
        )

    # -- helpers ---------------------------------------------------------------------------

    def _sampling_pb(self) -> common_pb2.SamplingParams:
        """The request's sampling message, built once (its prefill and decode send the same)."""
        pb = self._sampling
        if pb is None:
            pb = self._sampling = messages.sampling(self.request, self.request.sampling.max_tokens)
        return pb

    def _link(self, eid: EndpointId, stub: worker_pb2_grpc.WorkerAsyncStub) -> MuxLink | None:
        links = self._d.links
        return links.get(eid, stub, self._d.pool.link_port(eid)) if links is not None else None

    def _involve(
        self, eid: EndpointId, *, prefill: bool = False
    ) -> worker_pb2_grpc.WorkerAsyncStub | None:
        pool = self._d.pool
        try:
            stub = pool.stub(eid)
        except KeyError:
            return None  # removed from the pool since placement
        self.endpoints[eid] = stub
        # The ledger entry (reserved at placement, or new for a fallback worker) now runs there.
        if eid not in self._ledger_eps:
            self._reserve(eid, None, prefill=prefill)
        try:
            ahead = pool.view(eid).pending_prefill_tokens
        except KeyError:
            ahead = 0
        pool.ledger.start(eid, self.request.id)
        self._call_start_s[eid] = (self._d.clock.now_s(), ahead)
        if not prefill:
            self._decode_eid = eid
        return stub

    def _drop_kv(self, first: worker_pb2.PrefillResponse | None) -> None:
        """Stop using the prefilled KV: tell its holder to free it."""
        if first is None or not first.HasField("kv"):
            return
        holder = EndpointId(first.kv.source_address)
        stub = self.endpoints.get(holder)
        if stub is None:
            # The handle names an address we do not know; tell every prefill worker we used.
            prefill = self.placement.prefill if self.placement is not None else ()
            self._d.canceller.cancel_later(
                self.request.id, {e: s for e, s in self.endpoints.items() if e in prefill}
            )
        else:
            self._d.canceller.cancel_later(self.request.id, {holder: stub})

    def _raise_if_final(self, eid: EndpointId, err: aio.AioRpcError) -> None:
        code = err.code()
        if code in _REJECTED:
            raise InvalidRequest(err.details() or f"worker {eid} rejected the request") from err
        # Our own deadline (give or take clock skew), not a worker's: do not retry.
        if code == grpc.StatusCode.DEADLINE_EXCEEDED and self._remaining_s() <= 0.05:
            raise RequestTimeout(
                f"request {self.request.id} ran past {self._d.settings.request_timeout_s} s"
            ) from err

    def _remaining_s(self) -> float:
        remaining = self._deadline_s - self._d.clock.now_s()
        if remaining <= 0:
            raise RequestTimeout(
                f"request {self.request.id} ran past {self._d.settings.request_timeout_s} s"
            )
        return remaining

    def _fallback(self, reason: str) -> None:
        self._d.metrics.fallbacks.labels(reason).inc()
        self._trace.event("fallback", {"splitserve.reason": reason})
        log.info("request %s: fallback %s", self.request.id, reason)

    def _path_label(self) -> str:
        return self.path.value if self.path is not None else "none"
