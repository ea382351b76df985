"""vLLM's own metrics, read through one mapping table into `splitserve_worker_*` names.

vLLM keeps Prometheus metrics in-process (`vllm:*`, read with `vllm.v1.metrics.reader`).
`VLLM_METRICS` names each one we use and what it is called on our side, and
`VllmMetricsCollector` exposes exactly those, renamed, from the worker's own `CollectorRegistry`;
the dashboards read these names. (`VllmNativeCollector`, below, also passes vLLM's own
`vllm:*` series through unchanged, for tools written for `vllm serve`.) A vLLM upgrade that
renames a metric shows up as a missing entry in the contract tests, not as a silently empty
dashboard.

Counters are exported as counters (`..._total`), gauges as gauges, histograms as summaries
(`..._count` and `..._sum`); label sets are summed (one engine per worker).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

Kind = Literal["counter", "gauge", "histogram"]


@dataclass(frozen=True, slots=True)
class Mapped:
    name: str
    kind: Kind
    help: str


VLLM_METRICS: Mapping[str, Mapped] = {
    "vllm:num_requests_running": Mapped(
        "splitserve_worker_vllm_requests_running", "gauge", "Requests vLLM is computing."
    ),
    "vllm:num_requests_waiting": Mapped(
        "splitserve_worker_vllm_requests_waiting", "gauge", "Requests waiting in vLLM."
    ),
    "vllm:kv_cache_usage_perc": Mapped(
        "splitserve_worker_vllm_kv_cache_usage_ratio", "gauge", "Fraction of KV blocks in use."
    ),
    "vllm:num_preemptions": Mapped(
        "splitserve_worker_vllm_preemptions", "counter", "Sequences vLLM preempted."
    ),
    "vllm:prompt_tokens": Mapped(
        "splitserve_worker_vllm_prompt_tokens", "counter", "Prompt tokens vLLM processed."
    ),
    "vllm:generation_tokens": Mapped(
        "splitserve_worker_vllm_generation_tokens", "counter", "Tokens vLLM generated."
    ),
    "vllm:prefix_cache_queries": Mapped(
        "splitserve_worker_vllm_prefix_cache_queries",
        "counter",
        "Tokens looked up in the prefix cache.",
    ),
    "vllm:prefix_cache_hits": Mapped(
        "splitserve_worker_vllm_prefix_cache_hits", "counter", "Tokens found in the prefix cache."
    ),
    "vllm:nixl_xfer_time_seconds": Mapped(
        "splitserve_worker_vllm_kv_transfer_seconds",
        "histogram",
        "KV transfers this engine pulled over NIXL (count) and their time.",
    ),
    "vllm:nixl_bytes_transferred": Mapped(
        "splitserve_worker_vllm_kv_transfer_bytes",
        "histogram",
        "KV bytes pulled over NIXL per transfer.",
    ),
    "vllm:nixl_num_failed_transfers": Mapped(
        "splitserve_worker_vllm_kv_transfer_failures", "counter", "NIXL transfers that failed."
    ),
    "vllm:nixl_num_kv_expired_reqs": Mapped(
        "splitserve_worker_vllm_kv_expired",
        "counter",
        "Held KV freed because no decode engine pulled it in time.",
    ),
    "vllm:time_to_first_token_seconds": Mapped(
        "splitserve_worker_vllm_ttft_seconds", "histogram", "vLLM's time to first token."
    ),
    "vllm:request_queue_time_seconds": Mapped(
        "splitserve_worker_vllm_queue_seconds", "histogram", "Time requests waited in vLLM."
    ),
    "vllm:inter_token_latency_seconds": Mapped(
        "splitserve_worker_vllm_inter_token_seconds", "histogram", "vLLM's inter-token latency."
    ),
}


def read_vllm_metrics(
    metrics: Iterable[Any], table: Mapping[str, Mapped] = VLLM_METRICS
) -> dict[str, float]:
    """Sum vLLM metric snapshots into `{our name: value}`; histograms give `_count`/`_sum`."""
    out: dict[str, float] = {}
    for m in metrics:
        mapped = table.get(m.name)
        if mapped is None:
            continue
        if mapped.kind == "histogram":
            for suffix, value in (("_count", m.count), ("_sum", m.sum)):
                key = mapped.name + suffix
                out[key] = out.get(key, 0.0) + float(value)
        else:
            out[mapped.name] = out.get(mapped.name, 0.0) + float(m.value)
    return out


class VllmMetricsCollector:
    """A `prometheus_client` collector: register it in the worker's registry.

    `read` returns vLLM metric snapshots (`VllmEngine.vllm_metrics`); it is called on scrape.
    """

    def __init__(
        self, read: Callable[[], Iterable[Any]], table: Mapping[str, Mapped] = VLLM_METRICS
    ) -> None:
        self.read = read
        self.table = table

    def describe(self) -> list[Any]:
        return list(self._families({}))

    def collect(self) -> Iterator[Any]:
        try:
            values = read_vllm_metrics(self.read(), self.table)
        except Exception:  # a scrape must not fail because the engine is starting/stopping
            values = {}
        yield from self._families(values)

    def _families(self, values: Mapping[str, float]) -> Iterator[Any]:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            SummaryMetricFamily,
        )

        for mapped in self.table.values():
            n = mapped.name
            if mapped.kind == "counter":
                yield CounterMetricFamily(n, mapped.help, value=values.get(n, 0.0))
            elif mapped.kind == "gauge":
                yield GaugeMetricFamily(n, mapped.help, value=values.get(n, 0.0))
            else:
                yield SummaryMetricFamily(
                    n,
                    mapped.help,
                    count_value=int(values.get(n + "_count", 0)),
                    sum_value=values.get(n + "_sum", 0.0),
                )


NATIVE_PREFIX = "vllm:"


class VllmNativeCollector:
    """vLLM's own `vllm:*` series, passed through unchanged (names, labels such as
    `model_name`, histogram buckets), so dashboards, KEDA triggers and HPA adapters written for
    `vllm serve` read a worker as they read vLLM.

    `registry()` returns vLLM's registry (`vllm.v1.metrics.prometheus.get_prometheus_registry`:
    the process's, or a multiprocess collector over `PROMETHEUS_MULTIPROC_DIR` when that is
    set); it is read on scrape. Only families named `vllm:*` are passed.
    """

    def __init__(self, registry: Callable[[], Any]) -> None:
        self.registry = registry

    def collect(self) -> Iterator[Any]:
        try:
            families = list(self.registry().collect())
        except Exception:  # a scrape must not fail because the engine is starting/stopping
            return
        for family in families:
            if family.name.startswith(NATIVE_PREFIX):
                yield family
