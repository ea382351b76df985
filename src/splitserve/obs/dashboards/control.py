"""Control loop: desired vs current vs ready workers per pool, decisions, signal freshness."""

from __future__ import annotations

from typing import Final

from splitserve.obs.dashboards.model import (
    BY_SERVICE,
    RATE,
    Dashboard,
    Panel,
    Query,
    Row,
    quantile,
    series,
)
from splitserve.obs.dashboards.sources import OPERATOR as O
from splitserve.obs.dashboards.sources import ROUTER as R

_READY = series(R.endpoints, matchers='state="ready"')

DASHBOARD: Final = Dashboard(
    uid="splitserve-control",
    title="splitserve / Control loop",
    description="What the autoscaler wants, has and decided, and how fresh its signals are.",
    rows=(
        Row(
            "Pools",
            (
                Panel(
                    "Desired vs current vs ready workers",
                    "Desired: what the loop wants (written when the service is Managed, "
                    "otherwise its recommendation); current: what the pool had when it decided; "
                    "ready: the workers the router can use, by role (the max over the service's "
                    "router replicas: each reports the whole pool).",
                    (
                        Query(
                            f"max by (service, role) ({series(O.desired)})",
                            "desired {{service}} {{role}}",
                        ),
                        Query(
                            f"max by (service, role) ({series(O.current)})",
                            "current {{service}} {{role}}",
                        ),
                        Query(
                            f"max by ({BY_SERVICE}, role) ({_READY})",
                            "ready {{namespace}}/{{service}} {{role}}",
                        ),
                    ),
                    width=24,
                ),
            ),
        ),
        Row(
            "Decisions",
            (
                Panel(
                    "Decisions by kind and reason",
                    "Control-loop decisions (scale-up, scale-down, flip, hold, bounds, no-signal).",
                    (
                        Query(
                            f"sum by (service, kind, reason) "
                            f"(increase({series(O.decisions)}[{RATE}]))",
                            "{{service}} {{kind}} {{reason}}",
                        ),
                    ),
                ),
                Panel(
                    "Observed SLO attainment and SLOAtRisk",
                    "Attainment per class as the loop observed it over its window; 1 while the "
                    "service's SLOAtRisk condition is True.",
                    (
                        Query(
                            f"max by (service, slo_class) ({series(O.attainment)})",
                            "{{service}} {{slo_class}}",
                        ),
                        Query(f"max by (service) ({series(O.slo_at_risk)})", "at risk {{service}}"),
                    ),
                    unit="percentunit",
                ),
            ),
        ),
        Row(
            "Signals and loop",
            (
                Panel(
                    "Signal staleness",
                    "Age of the newest usable sample per signal source at the last tick "
                    "(+Inf when the source gave none).",
                    (
                        Query(
                            f"max by (service, source) ({series(O.staleness)})",
                            "{{service}} {{source}}",
                        ),
                    ),
                    unit="s",
                ),
                Panel(
                    "Loop tick duration p90",
                    "Duration of one observe-decide-act tick per service.",
                    (Query(quantile(0.9, O.loop_duration, "service"), "{{service}}"),),
                    unit="s",
                ),
            ),
        ),
        Row(
            "Operator: reconciles and the Kubernetes API (every service)",
            (
                Panel(
                    "Reconciles by resource and result",
                    "Reconciles per second by the kind whose handler ran them and their result "
                    "(success, error, backoff: skipped while a permanent failure backs off).",
                    (
                        Query(
                            f"sum by (resource, result) (rate({series(O.reconciles)}[{RATE}]))",
                            "{{resource}} {{result}}",
                        ),
                    ),
                    unit="ops",
                    width=8,
                ),
                Panel(
                    "Reconcile errors by reason",
                    "Failed reconciles per second by reason (the API server's answer, "
                    "InvalidSpec, Unexpected).",
                    (
                        Query(
                            f"sum by (resource, reason) "
                            f"(rate({series(O.reconcile_errors)}[{RATE}]))",
                            "{{resource}} {{reason}}",
                        ),
                    ),
                    unit="ops",
                    width=8,
                ),
                Panel(
                    "Reconcile duration p50 / p99",
                    "Time one reconcile takes, by resource.",
                    (
                        Query(quantile(0.5, O.reconcile_duration, "resource"), "p50 {{resource}}"),
                        Query(quantile(0.99, O.reconcile_duration, "resource"), "p99 {{resource}}"),
                    ),
                    unit="s",
                    width=8,
                ),
                Panel(
                    "API requests by verb and code",
                    "The operator's requests to the Kubernetes API server per second (kopf's "
                    "watch streams not counted).",
                    (
                        Query(
                            f"sum by (verb, code) (rate({series(O.api_requests)}[{RATE}]))",
                            "{{verb}} {{code}}",
                        ),
                    ),
                    unit="reqps",
                ),
                Panel(
                    "API request latency p99 by verb",
                    "99th percentile latency of the operator's API requests.",
                    (Query(quantile(0.99, O.api_duration, "verb"), "{{verb}}"),),
                    unit="s",
                ),
            ),
        ),
    ),
)
