"""Prefill / decode: queues and batches per role, KV cache use and transfer, path changes."""

from __future__ import annotations

from typing import Final

from splitserve.obs.dashboards.model import (
    BY_SERVICE,
    RATE,
    SERVICE_LEGEND,
    Dashboard,
    Panel,
    Query,
    Row,
    quantile,
    selector,
    series,
)
from splitserve.obs.dashboards.sources import OPERATOR as O
from splitserve.obs.dashboards.sources import ROUTER as R
from splitserve.obs.dashboards.sources import (
    SIM_ONLY,
    VLLM_KV_TRANSFER_FAILURES,
    VLLM_KV_TRANSFER_SECONDS,
)
from splitserve.obs.dashboards.sources import WORKER as W

_BY_ROLE = f"* on (instance) group_left (role) ({series(W.role)} == 1)"
"""Joins a per-worker series with the worker's current role."""
_FLIPS = series(O.decisions, matchers='kind="flip"')


_SVC = SERVICE_LEGEND


def _per_role(metric: str) -> str:
    return f"sum by ({BY_SERVICE}, role) ({metric} {_BY_ROLE})"


def _by_instance(name: str) -> str:
    """Per worker: a vLLM series' rate (its name, not a metric object, see `sources`)."""
    return f"sum by (instance) (rate({selector(name)}[{RATE}]))"


DASHBOARD: Final = Dashboard(
    uid="splitserve-pd",
    title="splitserve / Prefill-decode",
    description="Per-role queues and batches, KV cache use and transfer, fallbacks and flips.",
    rows=(
        Row(
            "Queues and batches",
            (
                Panel(
                    "Waiting requests by role",
                    "Requests waiting to be scheduled on the workers, summed per current role.",
                    (Query(_per_role(series(W.queue)), _SVC + " {{role}}"),),
                    width=8,
                ),
                Panel(
                    "Running requests (batch) by role",
                    "Requests being computed, summed per current role.",
                    (Query(_per_role(series(W.running)), _SVC + " {{role}}"),),
                    width=8,
                ),
                Panel(
                    "Workers seen by the router",
                    "Worker endpoints the router knows, by service, role and state (the max over "
                    "the service's router replicas: each reports the whole pool).",
                    (
                        Query(
                            f"max by (namespace, service, role, state) ({series(R.endpoints)})",
                            "{{namespace}}/{{service}} {{role}} {{state}}",
                        ),
                    ),
                    width=8,
                ),
            ),
        ),
        Row(
            "KV cache",
            (
                Panel(
                    "KV cache use per worker",
                    "Share of KV-cache blocks in use.",
                    (
                        Query(
                            f"1 - {series(W.kv_blocks_free)} / "
                            f"clamp_min({series(W.kv_blocks_total)}, 1)",
                            "{{instance}}",
                        ),
                    ),
                    unit="percentunit",
                    width=8,
                ),
                Panel(
                    "KV held for a pull",
                    "Prefilled requests whose KV waits for a decode worker to pull it.",
                    (Query(f"sum by (instance) ({series(W.kv_held)})", "{{instance}}"),),
                    width=8,
                ),
                Panel(
                    "KV transfer bytes",
                    "KV-cache bytes decode workers pulled from prefill workers, per second.",
                    (
                        Query(
                            f"sum by (instance) (rate({series(W.kv_transfer_bytes)}[{RATE}]))",
                            "{{instance}}",
                        ),
                    ),
                    unit="Bps",
                    width=8,
                ),
                Panel(
                    "KV pull time p50 / p99",
                    "Time a decode worker took to pull one request's KV from its prefill worker "
                    "(transfer plus the source's confirmation), per decode worker. vLLM engine: "
                    "from the decode's admission to its KV received; the READ alone is the NIXL "
                    "panel.",
                    (
                        Query(quantile(0.5, W.kv_pull_seconds, "instance"), "p50 {{instance}}"),
                        Query(quantile(0.99, W.kv_pull_seconds, "instance"), "p99 {{instance}}"),
                    ),
                    unit="s",
                ),
                Panel(
                    "KV transfer time (NIXL)",
                    "Mean time per KV transfer, and failed transfers, as vLLM's NIXL connector "
                    "reports them.",
                    (
                        Query(
                            f"{_by_instance(VLLM_KV_TRANSFER_SECONDS + '_sum')} / "
                            f"({_by_instance(VLLM_KV_TRANSFER_SECONDS + '_count')} > 0)",
                            "mean {{instance}}",
                        ),
                        Query(
                            _by_instance(VLLM_KV_TRANSFER_FAILURES),
                            "failed {{instance}}",
                        ),
                    ),
                    unit="s",
                    empty_in_local_stack=SIM_ONLY,
                ),
            ),
        ),
        Row(
            "Path changes",
            (
                Panel(
                    "Placements by path and reason",
                    "The router's placement decisions per second.",
                    (
                        Query(
                            f"sum by ({BY_SERVICE}, path, reason) "
                            f"(rate({series(R.placements)}[{RATE}]))",
                            _SVC + " {{path}} {{reason}}",
                        ),
                    ),
                    unit="reqps",
                ),
                Panel(
                    "Fallbacks and migrations by reason",
                    "Retries and path changes after a worker failure; `token_stall` is a "
                    "mid-stream migration to another decode worker.",
                    (
                        Query(
                            f"sum by ({BY_SERVICE}, reason) "
                            f"(increase({series(R.fallbacks)}[{RATE}]))",
                            _SVC + " {{reason}}",
                        ),
                    ),
                ),
                Panel(
                    "Stale load reports",
                    "Times a worker's load report went stale: the router placed on its own view.",
                    (
                        Query(
                            f"sum by ({BY_SERVICE}, role) "
                            f"(increase({series(R.stale_fallbacks)}[{RATE}]))",
                            _SVC + " {{role}}",
                        ),
                    ),
                    empty_in_local_stack=(
                        "Workers on loopback report load every 100 ms; a stale report needs a "
                        "starved worker (covered by the router's unit tests)."
                    ),
                ),
                Panel(
                    "Role flips",
                    "Run-time role changes of workers (SetRole), and flips the control loop "
                    "decided.",
                    (
                        Query(
                            f"sum by ({BY_SERVICE}) (increase({series(W.role_changes)}[{RATE}]))",
                            f"workers {_SVC}",
                        ),
                        # 0 rather than nothing while the loop runs but decides no flip.
                        Query(
                            f"sum by (service) (increase({_FLIPS}[{RATE}])) or sum by (service) "
                            f"(increase({series(O.decisions)}[{RATE}])) * 0",
                            "decided {{service}}",
                        ),
                    ),
                ),
            ),
        ),
    ),
)
