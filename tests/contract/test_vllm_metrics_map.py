"""The vLLM metrics mapping table, without vLLM: snapshots are faked with vLLM's field names."""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, generate_latest

from splitserve.worker.vllm_adapter.metrics_map import (
    VLLM_METRICS,
    VllmMetricsCollector,
    read_vllm_metrics,
)


@dataclass
class Counter:
    name: str
    value: int
    labels: dict[str, str] = field(default_factory=dict)


@dataclass
class Histogram:
    name: str
    count: int
    sum: float
    labels: dict[str, str] = field(default_factory=dict)
    buckets: dict[str, int] = field(default_factory=dict)


SNAPSHOT = [
    Counter("vllm:prompt_tokens", 55, {"engine": "0"}),
    Counter("vllm:prompt_tokens", 5, {"engine": "1"}),
    Counter("vllm:generation_tokens", 8),
    Counter("vllm:some_metric_we_do_not_map", 3),
    Histogram("vllm:nixl_xfer_time_seconds", 2, 0.004),
    Histogram("vllm:nixl_bytes_transferred", 2, 2 * 1048576.0),
]


def test_table_maps_into_our_namespace_only() -> None:
    assert all(name.startswith("vllm:") for name in VLLM_METRICS)
    assert all(m.name.startswith("splitserve_worker_") for m in VLLM_METRICS.values())
    assert len({m.name for m in VLLM_METRICS.values()}) == len(VLLM_METRICS)


def test_read_sums_label_sets_and_splits_histograms() -> None:
    values = read_vllm_metrics(SNAPSHOT)
    assert values == {
        "splitserve_worker_vllm_prompt_tokens": 60.0,
        "splitserve_worker_vllm_generation_tokens": 8.0,
        "splitserve_worker_vllm_kv_transfer_seconds_count": 2.0,
        "splitserve_worker_vllm_kv_transfer_seconds_sum": 0.004,
        "splitserve_worker_vllm_kv_transfer_bytes_count": 2.0,
        "splitserve_worker_vllm_kv_transfer_bytes_sum": 2097152.0,
    }


def test_collector_exposes_renamed_metrics_and_never_vllm_names() -> None:
    registry = CollectorRegistry()
    registry.register(VllmMetricsCollector(lambda: SNAPSHOT))
    text = generate_latest(registry).decode()
    assert "splitserve_worker_vllm_prompt_tokens_total 60.0" in text
    assert "splitserve_worker_vllm_kv_transfer_seconds_count 2.0" in text
    assert "splitserve_worker_vllm_requests_running 0.0" in text  # absent in vLLM -> 0
    assert "vllm:" not in text


def test_collector_survives_a_failing_read() -> None:
    def broken() -> list[Counter]:
        raise RuntimeError("engine stopping")

    registry = CollectorRegistry()
    registry.register(VllmMetricsCollector(broken))
    assert "splitserve_worker_vllm_prompt_tokens_total 0.0" in generate_latest(registry).decode()
