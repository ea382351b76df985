"""Per-request latency and outcome metrics of the router (TTFT, TPOT, E2E by serving path).

Times come from the injected clock. `outcome_of` names how a request ended, as a bounded label.
"""

from __future__ import annotations

import asyncio
import weakref
from typing import Any

from splitserve.core.clock import Clock
from splitserve.core.errors import NoEligibleEndpoint
from splitserve.obs import logs as obs_logs
from splitserve.obs.metrics import RouterMetrics
from splitserve.router.errors import InvalidRequest, Overloaded, RequestTimeout


def outcome_of(err: BaseException | None, *, ended_on_purpose: bool) -> str:
    """The `outcome` label: ok | cancelled | unavailable | rejected | shed | timeout | error.

    `ended_on_purpose`: the stream was closed after its last chunk or by the router (stop
    string), so closing it is not a cancellation.
    """
    if err is None:
        return "ok"
    if isinstance(err, GeneratorExit | asyncio.CancelledError):
        return "ok" if ended_on_purpose else "cancelled"
    if isinstance(err, NoEligibleEndpoint):
        return "unavailable"
    if isinstance(err, Overloaded):
        return "shed"
    if isinstance(err, InvalidRequest):
        return "rejected"
    if isinstance(err, RequestTimeout):
        return "timeout"
    return "error"


_BOUND: weakref.WeakKeyDictionary[RouterMetrics, dict[tuple[str, ...], Any]] = (
    weakref.WeakKeyDictionary()
)
"""Per metrics object: the label children this module used, by (metric, *labels). A child
is what `labels()` returns for those labels (the same object every time), so a request's
updates skip `labels()`'s validation and lock (~3 µs a call, four per request). Bounded: the
labels are (path, slo_class[, outcome]), each a small closed set."""


def _bound(metrics: RouterMetrics) -> dict[tuple[str, ...], Any]:
    cache = _BOUND.get(metrics)
    if cache is None:
        cache = _BOUND[metrics] = {}
    return cache


class RequestStats:
    """Records one request's metrics; `start()` once, `on_tokens()` per chunk, `finish()` once."""

    def __init__(
        self,
        metrics: RouterMetrics,
        clock: Clock,
        num_prompt_tokens: int,
        slo_class: str = "default",
    ) -> None:
        self._m = metrics
        self._children = _bound(metrics)
        self.slo_class = slo_class
        """The bounded `slo_class` label (a declared class, or `other`)."""
        self._clock = clock
        self._num_prompt_tokens = num_prompt_tokens
        self.start_s = clock.now_s()
        self.first_token_s: float | None = None
        self.num_output_tokens = 0
        self.tpot_s: float | None = None
        self.end_s: float | None = None

    def start(self) -> None:
        self._m.inflight.inc()

    def on_tokens(self, num_tokens: int, path: str) -> None:
        if num_tokens and self.first_token_s is None:
            self.first_token_s = self._clock.now_s()
            self._child("ttft", path).observe(self.first_token_s - self.start_s)
        self.num_output_tokens += num_tokens

    def finish(self, outcome: str, path: str, *, reached_worker: bool = True) -> None:
        """Count the request. Tokens count for every outcome: its prompt when it reached a
        worker, the output tokens it sent (a cancelled or failed stream's too); latencies
        (e2e, TPOT) only for `ok`."""
        m = self._m
        m.inflight.dec()
        self._child("requests", path, outcome).inc()
        if reached_worker:
            m.prompt_tokens.inc(self._num_prompt_tokens)
        if self.num_output_tokens > 0:
            m.completion_tokens.inc(self.num_output_tokens)
        if outcome != "ok":
            return
        now_s = self.end_s = self._clock.now_s()
        self._child("e2e", path).observe(now_s - self.start_s)
        if self.first_token_s is not None and self.num_output_tokens > 1:
            tpot_s = self.tpot_s = (now_s - self.first_token_s) / (self.num_output_tokens - 1)
            self._child("tpot", path).observe(tpot_s)

    def _child(self, name: str, path: str, outcome: str = "") -> Any:
        """`metrics.<name>.labels(...)`: (outcome, path, slo_class) for `requests`, else
        (path, slo_class); from the cache after the first time."""
        key = (name, path, self.slo_class, outcome)
        child = self._children.get(key)
        if child is None:
            metric = getattr(self._m, name)
            labels = (outcome, path, self.slo_class) if outcome else (path, self.slo_class)
            child = self._children[key] = metric.labels(*labels)
        return child

    def log_finished(self, request_id: str, outcome: str, path: str, trace_id: str = "") -> None:
        """The per-request log line (`splitserve.obs.logs.request_finished`)."""
        first, end = self.first_token_s, self.end_s
        obs_logs.request_finished(
            request_id,
            outcome=outcome,
            path=path,
            slo_class=self.slo_class,
            prompt_tokens=self._num_prompt_tokens,
            output_tokens=self.num_output_tokens,
            ttft_s=None if first is None else first - self.start_s,
            e2e_s=None if end is None else end - self.start_s,
            trace_id=trace_id,
        )
