"""The metric objects dashboards name, each bound to a private registry (names only, no export)."""

from __future__ import annotations

from typing import Final

from prometheus_client import CollectorRegistry

from splitserve.obs.metrics import OperatorMetrics, RouterMetrics, WorkerMetrics

ROUTER: Final = RouterMetrics(CollectorRegistry())
WORKER: Final = WorkerMetrics(CollectorRegistry())
OPERATOR: Final = OperatorMetrics(CollectorRegistry())

# vLLM's own series as the worker re-exports them (`worker.vllm_adapter.metrics_map.VLLM_METRICS`,
# which `obs` may not import: a unit test checks these names against that table).
VLLM_QUEUE_SECONDS: Final = "splitserve_worker_vllm_queue_seconds"
VLLM_TTFT_SECONDS: Final = "splitserve_worker_vllm_ttft_seconds"
VLLM_INTER_TOKEN_SECONDS: Final = "splitserve_worker_vllm_inter_token_seconds"
VLLM_PREFIX_QUERIES: Final = "splitserve_worker_vllm_prefix_cache_queries_total"
VLLM_PREFIX_HITS: Final = "splitserve_worker_vllm_prefix_cache_hits_total"
VLLM_PREEMPTIONS: Final = "splitserve_worker_vllm_preemptions_total"
VLLM_KV_TRANSFER_SECONDS: Final = "splitserve_worker_vllm_kv_transfer_seconds"
VLLM_KV_TRANSFER_FAILURES: Final = "splitserve_worker_vllm_kv_transfer_failures_total"
VLLM_NAMES: Final = (
    VLLM_QUEUE_SECONDS,
    VLLM_TTFT_SECONDS,
    VLLM_INTER_TOKEN_SECONDS,
    VLLM_PREFIX_QUERIES,
    VLLM_PREFIX_HITS,
    VLLM_PREEMPTIONS,
    VLLM_KV_TRANSFER_SECONDS,
    VLLM_KV_TRANSFER_FAILURES,
)

SIM_ONLY: Final = (
    "vLLM's own series: the local stack's workers run the simulated engine "
    "(`splitserve up --engine vllm` exports them)."
)
