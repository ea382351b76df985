"""Service overview: traffic by path and outcome, SLO attainment and latency per class, queueing,
shedding and errors (the router's view)."""

from __future__ import annotations

from typing import Final

from prometheus_client.metrics import MetricWrapperBase

from splitserve.obs.dashboards.model import (
    BY_SERVICE,
    RATE,
    SERVICE_LEGEND,
    Dashboard,
    Panel,
    Query,
    Row,
    quantile,
    series,
)
from splitserve.obs.dashboards.sources import ROUTER as R


def _latency(title: str, metric: MetricWrapperBase, slo: str | None, description: str) -> Panel:
    queries = [
        Query(
            quantile(q, metric, f"{BY_SERVICE}, slo_class"),
            f"p{round(q * 100)} {_SVC} {{{{slo_class}}}}",
        )
        for q in (0.5, 0.9, 0.99)
    ]
    if slo is not None:
        target = f'slo="{slo}"'
        queries.append(
            Query(
                f"max by ({BY_SERVICE}, slo_class) ({series(R.slo_target, matchers=target)})",
                f"target {_SVC} {{{{slo_class}}}}",
            )
        )
    return Panel(title, description, tuple(queries), unit="s", width=8)


_SVC = SERVICE_LEGEND
_OK = series(R.slo_requests, matchers='result="met"')
_NOT_OK = series(R.requests, matchers='outcome!="ok"')

DASHBOARD: Final = Dashboard(
    uid="splitserve-overview",
    title="splitserve / Service overview",
    description="Requests, SLO attainment and latency per class, admission and errors.",
    rows=(
        Row(
            "Traffic",
            (
                Panel(
                    "Requests by path and outcome",
                    "Finished requests per second by serving path (disaggregated / aggregated) "
                    "and outcome.",
                    (
                        Query(
                            f"sum by ({BY_SERVICE}, path, outcome) "
                            f"(rate({series(R.requests)}[{RATE}]))",
                            _SVC + " {{path}} {{outcome}}",
                        ),
                    ),
                    unit="reqps",
                    stack=True,
                ),
                Panel(
                    "Admission decisions",
                    "Each arrival's admission decision (admitted / queued / shed / rejected) per "
                    "class; summed, the arrival rate.",
                    (
                        Query(
                            f"sum by ({BY_SERVICE}, slo_class, outcome) "
                            f"(rate({series(R.admission)}[{RATE}]))",
                            _SVC + " {{slo_class}} {{outcome}}",
                        ),
                    ),
                    unit="reqps",
                    stack=True,
                ),
                Panel(
                    "In flight and queued",
                    "Requests in flight, and waiting in the router's EDF admission queue per "
                    "class.",
                    (
                        Query(f"sum by ({BY_SERVICE}) ({series(R.inflight)})", f"in flight {_SVC}"),
                        Query(
                            f"sum by ({BY_SERVICE}, slo_class) ({series(R.queue_depth)})",
                            f"queued {_SVC} {{{{slo_class}}}}",
                        ),
                    ),
                    width=8,
                ),
                Panel(
                    "Shed and errors",
                    "Requests that did not finish ok, by outcome (shed, rejected, error, ...).",
                    (
                        Query(
                            f"sum by ({BY_SERVICE}, outcome) (rate({_NOT_OK}[{RATE}]))",
                            _SVC + " {{outcome}}",
                        ),
                    ),
                    unit="reqps",
                    width=8,
                ),
                Panel(
                    "Unavailable (503) by cause",
                    "Requests answered 503 because no worker could take them, by condition.",
                    (
                        Query(
                            f"sum by ({BY_SERVICE}, condition) "
                            f"(rate({series(R.unavailable)}[{RATE}]))",
                            _SVC + " {{condition}}",
                        ),
                    ),
                    unit="reqps",
                    width=8,
                    empty_in_local_stack=(
                        "Needs every decode-capable worker to be gone, fenced or draining; the "
                        "scenario keeps the stack serving (the chaos tests cover 503s)."
                    ),
                ),
            ),
        ),
        Row(
            "SLO attainment",
            (
                Panel(
                    "SLO attainment per class",
                    "Share of finished requests that met both their TTFT and TPOT deadlines, "
                    "against the class's attainment target.",
                    (
                        Query(
                            f"sum by ({BY_SERVICE}, slo_class) (rate({_OK}[{RATE}])) / "
                            f"(sum by ({BY_SERVICE}, slo_class) "
                            f"(rate({series(R.slo_requests)}[{RATE}])) > 0)",
                            f"attained {_SVC} {{{{slo_class}}}}",
                        ),
                        Query(
                            f"max by ({BY_SERVICE}, slo_class) ({series(R.slo_attainment_target)})",
                            f"target {_SVC} {{{{slo_class}}}}",
                        ),
                    ),
                    unit="percentunit",
                ),
                Panel(
                    "Deadlines missed",
                    "Missed deadlines per second by class and which deadline (ttft / tpot).",
                    (
                        Query(
                            f"sum by ({BY_SERVICE}, slo_class, slo) "
                            f"(rate({series(R.slo_misses)}[{RATE}]))",
                            _SVC + " {{slo_class}} {{slo}}",
                        ),
                    ),
                    unit="reqps",
                ),
                _latency(
                    "TTFT per class", R.ttft, "ttft", "Time to first token seen by the router."
                ),
                _latency(
                    "TPOT per class",
                    R.tpot,
                    "tpot",
                    "Mean time per output token after the first, per request.",
                ),
                _latency("End-to-end latency per class", R.e2e, None, "Request latency."),
            ),
        ),
        Row(
            "Queueing and lengths",
            (
                Panel(
                    "Admission queue wait p90",
                    "Time requests admitted from the queue waited in it.",
                    (
                        Query(
                            quantile(0.9, R.queue_wait, f"{BY_SERVICE}, slo_class"),
                            _SVC + " {{slo_class}}",
                        ),
                    ),
                    unit="s",
                    width=8,
                ),
                Panel(
                    "Tokens",
                    "Prompt tokens in and output tokens out per second (every outcome).",
                    (
                        Query(
                            f"sum by ({BY_SERVICE}) (rate({series(R.prompt_tokens)}[{RATE}]))",
                            f"prompt {_SVC}",
                        ),
                        Query(
                            f"sum by ({BY_SERVICE}) (rate({series(R.completion_tokens)}[{RATE}]))",
                            f"generated {_SVC}",
                        ),
                    ),
                    unit="ops",
                    width=8,
                ),
                Panel(
                    "Output length prediction error p90",
                    "abs(predicted - actual) output tokens per finished request.",
                    (
                        Query(
                            quantile(0.9, R.prediction_error, f"{BY_SERVICE}, slo_class"),
                            _SVC + " {{slo_class}}",
                        ),
                    ),
                    width=8,
                ),
            ),
        ),
    ),
)
