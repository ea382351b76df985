"""Per-request latency and outcome metrics of the router (TTFT, TPOT, E2E by serving path).

Times come from the injected clock. `outcome_of` names how a request ended, as a bounded label.
"""

from __future__ import annotations

import asyncio

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
            self._m.ttft.labels(path, self.slo_class).observe(self.first_token_s - self.start_s)
        self.num_output_tokens += num_tokens

    def finish(self, outcome: str, path: str) -> None:
        m = self._m
        m.inflight.dec()
        m.requests.labels(outcome, path, self.slo_class).inc()
        if outcome != "ok":
            return
        now_s = self.end_s = self._clock.now_s()
        m.e2e.labels(path, self.slo_class).observe(now_s - self.start_s)
        m.prompt_tokens.inc(self._num_prompt_tokens)
        m.completion_tokens.inc(self.num_output_tokens)
        if self.first_token_s is not None and self.num_output_tokens > 1:
            tpot_s = self.tpot_s = (now_s - self.first_token_s) / (self.num_output_tokens - 1)
            m.tpot.labels(path, self.slo_class).observe(tpot_s)

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
