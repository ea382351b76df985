"""The router's SLO runtime: classes, deadlines, length prediction, per-class metrics.

One `SloRuntime` per router process. It turns the service's `sloClasses` into
`policy.admission` classes, resolves each request's class (`x-slo-class`, default class) and
per-request overrides (carried on `Request.tags`, see `OVERRIDE_TAGS`), gives every request
absolute deadlines from the router's one injected clock, predicts its output length
(`policy.predict`, learning from each finished request) and records the per-class metrics of
the router's metric contract.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Final

from splitserve.api import v1alpha1 as v1
from splitserve.api.router import SloSettings
from splitserve.core.clock import Clock
from splitserve.core.request import Request
from splitserve.obs.metrics import RouterMetrics
from splitserve.policy.admission import (
    Deadlines,
    SloClassTable,
    SloOverrides,
    SloPolicyClass,
    deadlines_for,
)
from splitserve.policy.predict import HistoryPredictor, HistoryWindow, LengthQuery
from splitserve.policy.predict.bucketed import BucketedPredictor
from splitserve.policy.predict.per_class import ClasslessPredictor, PerClassPredictor
from splitserve.policy.predict.tail import TailRatios
from splitserve.router.metric_children import Children

log = logging.getLogger(__name__)

TTFT_TAG: Final = "x-slo-ttft-ms"
TPOT_TAG: Final = "x-slo-tpot-ms"
OVERRIDE_TAGS: Final = (TTFT_TAG, TPOT_TAG)
"""`Request.tags` keys carrying a client's per-request overrides (milliseconds, as sent)."""


def policy_class(spec: v1.SloClassSpec) -> SloPolicyClass:
    ms = 1e-3
    return SloPolicyClass(
        name=spec.name,
        ttft_s=None if spec.ttft_ms is None else spec.ttft_ms * ms,
        tpot_s=None if spec.tpot_ms is None else spec.tpot_ms * ms,
        percentile=spec.percentile,
        attainment=spec.attainment,
        priority=spec.priority,
        sheddable=spec.sheddable,
        job_completion_s=spec.job_completion_seconds,
        allow_overrides=spec.allow_overrides,
    )


def overrides_of(request: Request) -> SloOverrides:
    tags = dict(request.tags)
    ttft, tpot = tags.get(TTFT_TAG), tags.get(TPOT_TAG)
    return SloOverrides(
        ttft_s=None if ttft is None else float(ttft) / 1000,
        tpot_s=None if tpot is None else float(tpot) / 1000,
    )


@dataclass(frozen=True, slots=True)
class RequestSlo:
    """One request's class, deadlines and predicted output length."""

    cls: SloPolicyClass
    label: str
    deadlines: Deadlines
    predicted_output_tokens: int


class SloRuntime:
    def __init__(self, settings: SloSettings, clock: Clock, metrics: RouterMetrics) -> None:
        self.settings = settings
        self.clock = clock
        self.metrics = metrics
        # Per-request series, each child looked up once (`metric_children`).
        self._prompt_length = Children(metrics.prompt_length)
        self._output_length = Children(metrics.output_length)
        self._prediction_error = Children(metrics.prediction_error)
        self._slo_requests = Children(metrics.slo_requests)
        self._slo_misses = Children(metrics.slo_misses)
        self.table = SloClassTable(
            (policy_class(c) for c in settings.classes), settings.default_class
        )
        names = self.table.names()
        kind = settings.length_predictor
        if kind is v1.LengthPredictor.PER_CLASS:
            self.predictor: PerClassPredictor | ClasslessPredictor = PerClassPredictor(names)
        elif kind is v1.LengthPredictor.BUCKETED:
            self.predictor = ClasslessPredictor(BucketedPredictor())
        else:
            self.predictor = ClasslessPredictor(HistoryPredictor(HistoryWindow()))
        for c in self.table.classes.values():
            if c.ttft_s is not None:
                metrics.slo_target.labels(c.name, "ttft").set(c.ttft_s)
            if c.tpot_s is not None:
                metrics.slo_target.labels(c.name, "tpot").set(c.tpot_s)
            metrics.slo_attainment_target.labels(c.name).set(c.attainment)
            metrics.queue_depth.labels(c.name)  # every class's series exists from the start
            metrics.queued_prompt_tokens.labels(c.name)
        self.ttft_tail = TailRatios()
        """Actual / predicted time to first token (from admission): the TTFT prediction at a
        class's percentile is the point prediction x `factor(percentile)`."""
        self.tpot_tail = TailRatios()
        """Actual / predicted TPOT on the decode worker chosen, likewise."""
        timed = [c for c in self.table.classes.values() if c.ttft_s is not None]
        tightest = min(timed, key=lambda c: (c.ttft_s, -c.percentile)) if timed else None
        self.tightest_ttft_s: float | None = None if tightest is None else tightest.ttft_s
        self.tightest_percentile: float = 0.9 if tightest is None else tightest.percentile
        """The percentile of the class with the tightest TTFT target (admission's room)."""

    def check(self, slo_class: str, overrides: SloOverrides) -> SloPolicyClass:
        """The request's class, its overrides checked (the HTTP edge calls this first).

        Raises:
            UnknownSloClass, BadOverride: `core.errors.ConfigError`s naming the header.
        """
        cls = self.table.resolve(slo_class)
        self.table.check_overrides(cls, overrides)
        return cls

    def for_request(self, request: Request) -> RequestSlo:
        cls = self.table.resolve(request.slo_class)
        overrides = self.table.check_overrides(cls, overrides_of(request))
        deadlines = deadlines_for(cls, request.arrival_s, overrides)
        query = LengthQuery(request.id, request.num_prompt_tokens, 0, request.sampling.max_tokens)
        predicted = self.predictor.predict(cls.name, query)
        self._prompt_length(cls.name).observe(request.num_prompt_tokens)
        return RequestSlo(cls, self.table.label(cls.name), deadlines, predicted)

    def restamped(self, rs: RequestSlo, request: Request, now_s: float) -> RequestSlo:
        """`rs` with its deadlines run from `now_s` instead of the arrival (a request held for a
        cold start, once it goes on). The attainment test stays honest: `Deadlines.met` adds
        the latencies measured from the arrival to the new origin."""
        overrides = self.table.check_overrides(rs.cls, overrides_of(request))
        return replace(rs, deadlines=deadlines_for(rs.cls, now_s, overrides))

    def finished(
        self,
        rs: RequestSlo,
        request: Request,
        num_output_tokens: int,
        ttft_s: float | None,
        tpot_s: float | None,
        e2e_s: float,
        truncated: bool,
    ) -> None:
        """Record a request that finished normally (`truncated`: cut by max_tokens or a stop
        string the router applied; such lengths do not teach the predictor)."""
        label = rs.label
        self._output_length(label).observe(num_output_tokens)
        self._prediction_error(label).observe(abs(rs.predicted_output_tokens - num_output_tokens))
        if not truncated and num_output_tokens > 0:
            self.predictor.observe(rs.cls.name, request.num_prompt_tokens, num_output_tokens)
        ttft_ok, tpot_ok = rs.deadlines.met(ttft_s if ttft_s is not None else e2e_s, tpot_s, e2e_s)
        self._slo_requests(label, "met" if ttft_ok and tpot_ok else "missed").inc()
        if not ttft_ok:
            self._slo_misses(label, "ttft").inc()
        if not tpot_ok:
            self._slo_misses(label, "tpot").inc()
