"""Per-worker latency models the router fits online, by endpoint.

The primary source is each worker's step stream (`WatchSteps`: every engine step's batch
composition and time, measured inside the worker): one `OnlineStepModel` per worker, the
simulator's `core.perf` latency-model object (DistServe A.4 reduced forms) refitted over a
sliding window of steps. Placement reads its prefill drain rate and its decode step cost
(`estimates`).

A router can ask each worker for at most `max_samples_per_s` samples per second of each kind
of step (`WatchStepsRequest.max_samples_per_s`: the worker sends a step only when it started at
least 1 / rate after the last one of its kind it sent; prefill and decode-only steps are
thinned apart, so a mixed worker's prefill steps still reach the fit). Every router process
follows every worker, so on fast engines (a zero-delay sim worker runs thousands of steps a
second) following every step costs each router process CPU in proportion to the whole fleet's
traffic. The default (`STEP_SAMPLES_PER_S`) is still 0, every step, as before: with 100, 400
and 1,000 samples/s the fit of a sim worker with a scaled clock (`--sim-time-scale 0.02`,
~0.3 ms steps, a ~1 s burst; tests/unit/router/test_latency_steps) missed its 20 % bound on
the 9 x 500-token decode step in 1-2 of 6 runs each (0.21-0.26), against 0 of 6 unthinned, so
thinning by default would trade placement accuracy for router CPU; measured: an idle router's
CPU fell ~38 % at 100/s and ~7 % at 400/s (docs/benchmarks.md, "Feed cost per router process").
Approximation, stated: a time-based sample of the steps slightly favours steps that follow a
long one (the one straddling each interval's end). A worker older than the field sends every
step.

With `pool.link: stream` the step feed is a sub-request on the worker's stream link (`link_for`,
`MuxLink.watch`; docs/benchmarks.md "Thirteenth pass"), with the same ends: UNIMPLEMENTED stops
it, any other error (the link lost) re-opens it after `reconnect_s`.

KV pulls (the P/D decider's `pull_would_miss_tpot`): each worker's load reports carry the
totals of the KV pulls its engine measured (`LoadReport.kv_pulled_tokens` / `kv_pull_seconds`);
`PoolView` passes each report's totals to `observe_pull_totals`, and `pull_tokens_per_s` is a
`PullRate` over their growth. The worker's own timing rather than the router's (Decode sent to
the decode worker's first token, less a decode step): the router's includes the hop, the
worker's queue before the pull and the first step's own time, and needs a per-request hook on
the decode stream; the worker times the pull itself, in both engines (the sim engine: its KV
link model; vLLM: `stats.KvPullTimer`), and the load feed already carries per-worker state.
No pull yet, or a worker older than the fields: 0, no estimate (the rule stays off).

Fallback, for engines that answer `WatchSteps` with UNIMPLEMENTED (and until a step fit is
ready): the coarse fits from the router's own calls (`policy.predict.latency`: prefill rate from
`PrefillResponse.prefill_s` / time to first token, decode base + per-seq from per-request TPOT
at the batch size seen at placement).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import grpc
from grpc import aio

from splitserve._gen.v1 import worker_pb2, worker_pb2_grpc
from splitserve.aio import stop_task
from splitserve.core.ids import EndpointId
from splitserve.core.perf.protocol import BatchShape
from splitserve.policy.predict.latency import PrefillRate, PullRate, StepFit
from splitserve.policy.predict.step_model import OnlineStepModel
from splitserve.router.mux import MuxLink

log = logging.getLogger(__name__)

STEP_SAMPLES_PER_S = 0.0
"""Step samples per second the router asks of each worker by default; 0: every step (see the
module docstring for why thinning is not the default yet)."""


@dataclass(slots=True)
class _Models:
    prefill: PrefillRate = field(default_factory=PrefillRate)
    step: StepFit = field(default_factory=StepFit)
    steps: OnlineStepModel = field(default_factory=OnlineStepModel)
    pull: PullRate = field(default_factory=PullRate)
    watcher: asyncio.Task[None] | None = None
    reports_steps: bool | None = None
    """The worker's step stream: True once a sample came, False when UNIMPLEMENTED."""
    last_step_s: float | None = None
    """When (the book's `now`) the last step sample came; None: none yet."""
    rev: int = 0
    """Counts the request-timing fits' updates (`prefill`, `step`), for `estimates`' cache."""
    est_key: tuple[int, int, object] | None = None
    est: tuple[float, float, float] = (0.0, 0.0, 0.0)
    """`estimates` as last computed, for the state `est_key` names (rev, the step model's
    `num_steps`, its fit): placement reads them for every worker several times a request,
    and they change only when a step or a request timing comes."""


class LatencyBook:
    def __init__(
        self,
        *,
        reconnect_s: float = 1.0,
        max_buffer: int = 1024,
        max_samples_per_s: float = STEP_SAMPLES_PER_S,
        now: Callable[[], float] = time.monotonic,
        link_for: Callable[[EndpointId], MuxLink | None] | None = None,
    ) -> None:
        """`max_samples_per_s`: the step samples asked of each worker per second (0: every
        step); `now`: seconds on a monotonic clock (when a step sample came, `step_age_s`);
        `link_for`: the stream link a worker's step feed goes over (`PoolView.feed_link`, with
        `pool.link: stream`; None for a worker, or no `link_for`: its gRPC stream)."""
        if not (math.isfinite(max_samples_per_s) and max_samples_per_s >= 0):
            raise ValueError(
                f"max_samples_per_s must be 0 or a positive finite number, got {max_samples_per_s}"
            )
        self._by_ep: dict[EndpointId, _Models] = {}
        self.reconnect_s = reconnect_s
        self.max_buffer = max_buffer
        self.max_samples_per_s = max_samples_per_s
        self._now = now
        self._link_for = link_for

    def _get(self, eid: EndpointId) -> _Models:
        m = self._by_ep.get(eid)
        if m is None:
            m = self._by_ep[eid] = _Models()
        return m

    # -- the step stream ---------------------------------------------------------------------

    def watch(self, eid: EndpointId, stub: worker_pb2_grpc.WorkerAsyncStub) -> None:
        """Start fitting `eid`'s step model from its `WatchSteps` stream (idempotent)."""
        m = self._get(eid)
        if m.watcher is None or m.watcher.done():
            m.watcher = asyncio.create_task(self._watch(eid, m, stub), name=f"watch-steps {eid}")

    async def _watch(
        self, eid: EndpointId, m: _Models, stub: worker_pb2_grpc.WorkerAsyncStub
    ) -> None:
        request = worker_pb2.WatchStepsRequest(
            max_buffer=self.max_buffer, max_samples_per_s=self.max_samples_per_s
        )
        batches = getattr(stub, "WatchStepBatches", None) is not None
        """Ask for `WatchStepBatches` first (many steps per message); `WatchSteps` when the
        worker does not serve it (an older worker, an HTTP backend, a test fake)."""
        on_link = True
        """Ask the stream link, when there is one (False once the worker answered
        INVALID_ARGUMENT there: it predates the feed ops)."""
        while True:
            link = self._link_for(eid) if self._link_for is not None and on_link else None
            try:
                if link is not None:
                    sub = link.watch("watch_step_batches", request)
                    try:
                        while (batch := await sub.read()) is not aio.EOF:
                            self._observe_steps(eid, m, batch.samples)
                    finally:
                        sub.cancel()
                elif batches:
                    async for batch in stub.WatchStepBatches(request, wait_for_ready=True):
                        self._observe_steps(eid, m, batch.samples)
                else:
                    async for pb in stub.WatchSteps(request, wait_for_ready=True):
                        self._observe_steps(eid, m, (pb,))
            except grpc.RpcError as err:
                code = err.code() if isinstance(err, aio.AioRpcError) else None
                if link is not None and code == grpc.StatusCode.INVALID_ARGUMENT:
                    on_link = False  # a worker that predates the feed ops: its gRPC stream
                    continue
                if code == grpc.StatusCode.UNIMPLEMENTED and batches:
                    batches = False  # try the one-sample stream at once
                    continue
                if code == grpc.StatusCode.UNIMPLEMENTED:
                    m.reports_steps = False
                    log.info(
                        "%s reports no engine steps: its latency model is fitted from request "
                        "timings only",
                        eid,
                    )
                    return
            await asyncio.sleep(self.reconnect_s)

    def _observe_steps(
        self, eid: EndpointId, m: _Models, samples: Iterable[worker_pb2.StepSample]
    ) -> None:
        if m.reports_steps is not True:
            log.info("fitting the latency model of %s from its step reports", eid)
        m.reports_steps = True
        m.last_step_s = self._now()
        observe = m.steps.observe_parts
        for pb in samples:
            chunks = pb.prefill_chunks
            observe(
                [(c.new_tokens, c.context_tokens) for c in chunks] if chunks else (),
                pb.decode_context_tokens,
                pb.duration_s,
            )

    def observe_step(self, eid: EndpointId, batch: BatchShape, seconds: float) -> None:
        """One engine step of `eid` (what the step stream delivers)."""
        m = self._get(eid)
        m.last_step_s = self._now()
        m.steps.observe(batch, seconds)

    def step_age_s(self, eid: EndpointId) -> float | None:
        """Seconds since `eid`'s engine last reported a step (its step stream: the engine is
        running, not frozen or wedged); None: no step reported yet, or the worker reports none
        (then nothing is known of its progress)."""
        m = self._by_ep.get(eid)
        if m is None or m.last_step_s is None:
            return None
        return max(0.0, self._now() - m.last_step_s)

    # -- request timings (fallback) ----------------------------------------------------------

    def observe_prefill(self, eid: EndpointId, tokens: int, seconds: float) -> None:
        """`tokens` computed (queue ahead of the prompt plus the prompt) in `seconds`."""
        m = self._get(eid)
        m.prefill.observe(tokens, seconds)
        m.rev += 1

    def observe_decode(self, eid: EndpointId, batch: int, tpot_s: float) -> None:
        m = self._get(eid)
        m.step.observe(batch, tpot_s)
        m.rev += 1

    def observe_pull_totals(self, eid: EndpointId, tokens: int, seconds: float) -> None:
        """`eid`'s KV pull totals from a load report (`LoadReport.kv_pulled_tokens`,
        `kv_pull_seconds`)."""
        self._get(eid).pull.observe_totals(tokens, seconds)

    # -- what placement reads ----------------------------------------------------------------

    def pull_tokens_per_s(self, eid: EndpointId) -> float:
        """How fast KV pulls into `eid` move, prompt tokens per second; 0: no estimate."""
        m = self._by_ep.get(eid)
        return 0.0 if m is None else m.pull.tokens_per_s

    def step_model(self, eid: EndpointId) -> OnlineStepModel | None:
        m = self._by_ep.get(eid)
        return None if m is None else m.steps

    def estimates(self, eid: EndpointId) -> tuple[float, float, float]:
        """(prefill tokens/s, step base s, step per-seq s); zeros: no estimate. The step fit
        where it has one, else the request-timing fits."""
        m = self._by_ep.get(eid)
        if m is None:
            return (0.0, 0.0, 0.0)
        steps = m.steps
        key = m.est_key
        if (
            key is not None
            and key[0] == m.rev
            and key[1] == steps.num_steps
            and key[2] is steps.fitted
        ):
            return m.est
        rate = steps.prefill_tokens_per_s() or m.prefill.tokens_per_s
        base, per = steps.decode_step()
        if base <= 0 and per <= 0:
            base, per = m.step.params
        m.est_key, m.est = (m.rev, steps.num_steps, steps.fitted), (rate, base, per)
        return m.est

    async def forget(self, eid: EndpointId) -> None:
        """Stop watching `eid` and drop its models."""
        m = self._by_ep.pop(eid, None)
        if m is not None and m.watcher is not None:
            await stop_task(m.watcher)

    async def close(self) -> None:
        tasks = [m.watcher for m in self._by_ep.values() if m.watcher is not None]
        self._by_ep.clear()
        await stop_task(*tasks)
