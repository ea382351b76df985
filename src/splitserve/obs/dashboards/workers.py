"""Workers (engine): steps, tokens per step, preemptions, requests, and vLLM's own series."""

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
from splitserve.obs.dashboards.sources import (
    SIM_ONLY,
    VLLM_INTER_TOKEN_SECONDS,
    VLLM_PREEMPTIONS,
    VLLM_PREFIX_HITS,
    VLLM_PREFIX_QUERIES,
    VLLM_QUEUE_SECONDS,
    VLLM_TTFT_SECONDS,
)
from splitserve.obs.dashboards.sources import WORKER as W


def _rate(series: str) -> str:
    """Per worker: the rate of `series` (a selector)."""
    return f"sum by (instance) (rate({series}[{RATE}]))"


def _vllm_mean(name: str) -> str:
    """vLLM's histograms come across as `_sum` / `_count` (no buckets): their mean."""
    return f"{_rate(selector(name + '_sum'))} / ({_rate(selector(name + '_count'))} > 0)"


_STEPS = _rate(series(W.steps))

DASHBOARD: Final = Dashboard(
    uid="splitserve-workers",
    title="splitserve / Workers",
    description="Engine steps, tokens per step, preemptions and requests per worker.",
    rows=(
        Row(
            "Engine",
            (
                Panel(
                    "Engine steps",
                    "Engine steps per second per worker.",
                    (Query(_STEPS, "{{instance}}"),),
                    unit="ops",
                    width=8,
                ),
                Panel(
                    "Step time p50 / p99",
                    "Duration of one engine step (one batch forward pass) per worker. vLLM "
                    "engine: schedule to vLLM's stats record of the step; simulated engine: the "
                    "modelled time.",
                    (
                        Query(quantile(0.5, W.step_seconds, "instance"), "p50 {{instance}}"),
                        Query(quantile(0.99, W.step_seconds, "instance"), "p99 {{instance}}"),
                    ),
                    unit="s",
                    width=8,
                ),
                Panel(
                    "Tokens per step",
                    "Prompt tokens computed plus tokens sampled, per engine step.",
                    (
                        Query(
                            f"({_rate(series(W.prefill_tokens))} + {_rate(series(W.tokens))}) "
                            f"/ ({_STEPS} > 0)",
                            "{{instance}}",
                        ),
                    ),
                    width=8,
                ),
                Panel(
                    "Preemptions",
                    "Sequences preempted (KV dropped, recomputed) per second.",
                    (Query(_rate(series(W.preemptions)), "{{instance}}"),),
                    unit="ops",
                    width=8,
                ),
                Panel(
                    "Requests by kind and outcome",
                    "Requests finished by the workers per second (prefill / decode / generate).",
                    (
                        Query(
                            f"sum by ({BY_SERVICE}, kind, outcome) "
                            f"(rate({series(W.requests)}[{RATE}]))",
                            SERVICE_LEGEND + " {{kind}} {{outcome}}",
                        ),
                    ),
                    unit="reqps",
                    width=8,
                ),
                Panel(
                    "Queue and batch per worker",
                    "Requests waiting and running on each worker.",
                    (
                        Query(f"sum by (instance) ({series(W.queue)})", "waiting {{instance}}"),
                        Query(f"sum by (instance) ({series(W.running)})", "running {{instance}}"),
                    ),
                    width=8,
                ),
                Panel(
                    "Role and draining",
                    "Each worker's current role (1) and whether it drains.",
                    (
                        Query(
                            f"max by (instance, role) ({series(W.role)} == 1)",
                            "{{instance}} {{role}}",
                        ),
                        Query(f"max by (instance) ({series(W.draining)})", "draining {{instance}}"),
                    ),
                    width=24,
                ),
            ),
        ),
        Row(
            "vLLM (mapped from vllm:*)",
            (
                Panel(
                    "vLLM queue time and TTFT (mean)",
                    "Time requests waited in vLLM's scheduler, and vLLM's own time to first token.",
                    (
                        Query(_vllm_mean(VLLM_QUEUE_SECONDS), "queue {{instance}}"),
                        Query(_vllm_mean(VLLM_TTFT_SECONDS), "ttft {{instance}}"),
                    ),
                    unit="s",
                    width=8,
                    empty_in_local_stack=SIM_ONLY,
                ),
                Panel(
                    "vLLM inter-token latency (mean)",
                    "vLLM's inter-token latency.",
                    (Query(_vllm_mean(VLLM_INTER_TOKEN_SECONDS), "{{instance}}"),),
                    unit="s",
                    width=8,
                    empty_in_local_stack=SIM_ONLY,
                ),
                Panel(
                    "vLLM prefix cache hit rate and preemptions",
                    "Share of looked-up prompt tokens found in the prefix cache; preemptions/s.",
                    (
                        Query(
                            f"{_rate(selector(VLLM_PREFIX_HITS))} / "
                            f"({_rate(selector(VLLM_PREFIX_QUERIES))} > 0)",
                            "hit rate {{instance}}",
                        ),
                        Query(_rate(selector(VLLM_PREEMPTIONS)), "preemptions {{instance}}"),
                    ),
                    width=8,
                    empty_in_local_stack=SIM_ONLY,
                ),
            ),
        ),
    ),
)
