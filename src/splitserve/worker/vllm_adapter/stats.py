"""The worker's own engine series on the vLLM engine: step time, steps, preemptions, and each
decode's KV-pull time (with the decode worker's `worker.kv_pull` span).

The simulated engine reports these itself (`SimEngine.on_step`, `SimEngine.on_kv_pull`). On
vLLM they come from two hooks inside the in-process engine, both running on the engine thread:

* `EngineObserver.stat_logger_factory()`: a vLLM `StatLoggerBase`, registered with
  `LLMEngine(stat_loggers=...)`. vLLM calls its `record()` at the end of each `LLMEngine.step()`
  with that step's `SchedulerStats` and `IterationStats` (vLLM's own Prometheus logger reads
  the same objects). A step's time runs from its `schedule()` (tapped on the scheduler
  instance) to that `record()`: scheduling, the forward pass, sampling, the scheduler's update
  and vLLM's output processing. A step that scheduled no token (the engine thread polling KV
  held for a pull, or reads in flight) is not counted. Preemptions are
  `IterationStats.num_preempted_reqs` (what `vllm:num_preemptions` counts). With vLLM's async
  scheduling (a batch queue) the next step is scheduled before the last one is recorded, so a
  step's time then also covers its overlap with the next one (an approximation; the CPU
  engine does not schedule asynchronously).
* `KvPullTimer`: for each request vLLM admits with `do_remote_prefill` (a decode continued from
  a prefill worker's KV), the time from its `add_request` to the step whose KV connector output
  lists it in `finished_recving` (the scheduler's `_update_from_kv_xfer_finished`): waiting for
  KV blocks to be allocated, vLLM's NIXL handshake if the pair is cold, the READ itself and its
  completion. The histogram `splitserve_worker_kv_pull_seconds` and the span measure that
  whole wait, as the simulated engine's pull does (a pull done inside the step that schedules
  its request, `nixl.PullInStep`, never reaches `finished_recving`: that hook reports it through
  `received_in_step`); vLLM's transfer-only time (NIXL's telemetry)
  stays in `splitserve_worker_vllm_kv_transfer_seconds`. Bytes are the pulled tokens at the
  model's KV bytes per token (what `KvHandle.num_bytes` counts; NIXL moves whole blocks). A
  pull that failed, or whose request ended first, is not observed.
* `RequestTimes`: each finished request's queue wait and prefill time as vLLM's engine core
  stamped them (`IterationStats.finished_requests`: `queued_time`, first scheduled minus
  queued; `prefill_time`, first token minus first scheduled), which a prefill worker reports
  (`PrefillOutcome.queue_s` / `prefill_s`, the `worker.prefill` span's attributes). vLLM records
  a step's stats before the engine thread hands out that step's outputs, so a prefill finds its
  times when its last output arrives.

vLLM is imported only by `stat_logger_factory()`'s logger (the engine builds it); the rest is
plain Python, unit-tested with fakes.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

log = logging.getLogger(__name__)

StepHook = Callable[[float | None, int], None]
"""(seconds of one engine step that scheduled tokens, None for a step that scheduled none;
requests preempted in it). On the engine thread."""
KvPullHook = Callable[[str, int, float], None]
"""(request id, KV bytes pulled, seconds): on the asyncio loop."""

MAX_TRACKED_PULLS = 4096
"""Pulls whose request vanished without a `finished_recving` are forgotten beyond this."""


class Sink(Protocol):
    """Where the observations go (`VllmEngine`; the worker service sets the hooks)."""

    on_step_time: StepHook | None
    on_kv_pull: KvPullHook | None


class StepTimer:
    """Times engine steps between the scheduler's `schedule()` and vLLM's stats `record()`."""

    def __init__(self, sink: Sink, now: Callable[[], float] = time.perf_counter) -> None:
        self.sink = sink
        self.now = now
        self._started: float | None = None

    def tap(self, scheduler: Any) -> None:
        """Wrap `scheduler.schedule` (on this instance) to note when a step with tokens starts."""
        schedule = scheduler.schedule

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = self.now()
            out = schedule(*args, **kwargs)
            if int(getattr(out, "total_num_scheduled_tokens", 0)) > 0:
                self._started = started
            return out

        scheduler.schedule = timed

    def record(self, iteration_stats: Any) -> None:
        """vLLM recorded one step's stats (from `record()`, same thread)."""
        started, self._started = self._started, None
        preempted = int(getattr(iteration_stats, "num_preempted_reqs", 0) or 0)
        hook = self.sink.on_step_time
        if hook is None or (started is None and not preempted):
            return
        hook(max(0.0, self.now() - started) if started is not None else None, preempted)


MAX_TIMED_REQUESTS = 1024
"""Finished requests whose times nobody asked for (decodes, aggregated) are forgotten beyond
this."""


class RequestTimes:
    """(queue wait, prefill time) of recently finished requests, by our request id."""

    def __init__(self) -> None:
        self._times: dict[str, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def record(self, iteration_stats: Any) -> None:
        """From vLLM's `record()` (engine thread)."""
        for f in getattr(iteration_stats, "finished_requests", None) or ():
            if f.request_id is None:
                continue
            with self._lock:
                if len(self._times) >= MAX_TIMED_REQUESTS:
                    del self._times[next(iter(self._times))]
                self._times[str(f.request_id)] = (float(f.queued_time), float(f.prefill_time))

    def pop(self, request_id: str) -> tuple[float, float] | None:
        """A finished request's (queue wait, prefill time), once; None if vLLM gave none."""
        with self._lock:
            return self._times.pop(request_id, None)


class KvPullTimer:
    """Per decode request: vLLM admission to its KV received (see the module docstring)."""

    def __init__(
        self,
        sink: Sink,
        loop: asyncio.AbstractEventLoop,
        bytes_per_token: int,
        external_id: Callable[[str], str],
        now: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.sink = sink
        self.loop = loop
        self.bytes_per_token = bytes_per_token
        self.external_id = external_id
        self.now = now
        self._started: dict[str, float] = {}

    def tap(self, scheduler: Any) -> bool:
        """Wrap the scheduler's `add_request` and `_update_from_kv_xfer_finished` (on this
        instance). False when the scheduler has neither (another vLLM): nothing is timed."""
        add = getattr(scheduler, "add_request", None)
        finished = getattr(scheduler, "_update_from_kv_xfer_finished", None)
        if add is None or finished is None:
            log.warning("vLLM's scheduler has no KV-transfer hooks: KV pulls are not timed")
            return False

        def add_request(request: Any) -> Any:
            params = getattr(request, "kv_transfer_params", None) or {}
            if params.get("do_remote_prefill"):
                self._remember(str(request.request_id))
            return add(request)

        def kv_xfer_finished(output: Any) -> Any:
            received = [str(r) for r in (getattr(output, "finished_recving", None) or ())]
            result = finished(output)
            for rid in received:
                self._received(scheduler, rid)
            return result

        scheduler.add_request = add_request
        scheduler._update_from_kv_xfer_finished = kv_xfer_finished
        return True

    def received_in_step(self, request: Any, ok: bool, tokens: int) -> None:
        """A pull finished inside the step that scheduled its request (`nixl.PullInStep`),
        `tokens` computed with its KV in (vLLM has already counted that step's token in the
        request's `num_computed_tokens`)."""
        rid = str(request.request_id)
        started = self._started.pop(rid, None)
        hook = self.sink.on_kv_pull
        if started is None or not ok or hook is None:
            return
        self._observe(rid, tokens, started, hook)

    def _observe(self, rid: str, tokens: int, started: float, hook: KvPullHook) -> None:
        seconds = max(0.0, self.now() - started)
        num_bytes = tokens * self.bytes_per_token
        self.loop.call_soon_threadsafe(hook, self.external_id(rid), num_bytes, seconds)

    def _remember(self, rid: str) -> None:
        if len(self._started) >= MAX_TRACKED_PULLS:  # requests that ended before any read
            oldest = min(self._started, key=self._started.__getitem__)
            del self._started[oldest]
        self._started[rid] = self.now()

    def _received(self, scheduler: Any, rid: str) -> None:
        started = self._started.pop(rid, None)
        if started is None:
            return
        ok = rid in getattr(scheduler, "finished_recving_kv_req_ids", ()) and rid not in getattr(
            scheduler, "failed_recving_kv_req_ids", ()
        )
        request = scheduler.requests.get(rid) if ok else None
        hook = self.sink.on_kv_pull
        if request is None or hook is None:
            return
        self._observe(rid, int(request.num_computed_tokens), started, hook)


class EngineObserver:
    """Both hooks for one `VllmEngine`: `stat_logger_factory()` when building vLLM's engine,
    `tap()` once it is built (on the engine thread, before the first step)."""

    def __init__(self, sink: Sink) -> None:
        self.sink = sink
        self.steps = StepTimer(sink)
        self.times = RequestTimes()
        self.pulls: KvPullTimer | None = None

    def stat_logger_factory(self) -> Callable[[Any, int], Any]:
        """A per-engine `StatLoggerFactory` for `LLMEngine(stat_loggers=[...])`."""
        from vllm.v1.metrics.loggers import StatLoggerBase

        steps, times = self.steps, self.times

        class WorkerStatLogger(StatLoggerBase):  # type: ignore[misc]
            def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
                self.engine_index = engine_index

            def record(
                self,
                scheduler_stats: Any,
                iteration_stats: Any,
                mm_cache_stats: Any = None,
                engine_idx: int = 0,
            ) -> None:
                steps.record(iteration_stats)
                times.record(iteration_stats)

            def log_engine_initialized(self) -> None:
                pass

        return WorkerStatLogger

    def tap(
        self,
        llm_engine: Any,
        scheduler: Any,
        loop: asyncio.AbstractEventLoop,
        bytes_per_token: int,
    ) -> None:
        self.steps.tap(scheduler)
        self.pulls = KvPullTimer(self.sink, loop, bytes_per_token, external_id_of(llm_engine))
        self.pulls.tap(scheduler)


def external_id_of(llm_engine: Any) -> Callable[[str], str]:
    """Our request id from vLLM's internal one (vLLM appends a random suffix at admission;
    its output processor keeps the caller's id)."""
    states = getattr(getattr(llm_engine, "output_processor", None), "request_states", None)

    def external(rid: str) -> str:
        state = states.get(rid) if states is not None else None
        return str(getattr(state, "external_req_id", None) or rid)

    return external
