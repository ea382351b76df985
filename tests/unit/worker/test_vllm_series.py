"""vLLM's series names on a simulated-engine worker, and the router's pool gauges: what vLLM
dashboards and KEDA triggers (`vllm:num_requests_waiting`) read."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from splitserve.core.ids import RequestId
from splitserve.core.request import Request, SamplingSpec
from splitserve.core.roles import Role
from splitserve.obs.metrics import PoolLoadCollector, VllmLoadCollector, VllmSeries, WorkerMetrics
from splitserve.worker.runtime import WorkerConfig, _ReleaseClient, _vllm_load, build_sim_engine

MODEL = "sim-model"


def _value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    value = registry.get_sample_value(name, {"model_name": MODEL, **labels})
    assert value is not None, name
    return value


async def test_sim_worker_exports_vllms_series() -> None:
    cfg = WorkerConfig(
        role=Role.MIXED, sim_time_scale=0.05, sim_num_kv_blocks=64, vocab_size=1000, model=MODEL
    )
    registry = CollectorRegistry()
    series = VllmSeries(registry, MODEL)
    release = _ReleaseClient()
    engine = build_sim_engine(cfg, "127.0.0.1:1", release, WorkerMetrics(registry), series)
    registry.register(VllmLoadCollector(MODEL, _vllm_load(engine)))
    await engine.start()
    try:
        prompt = tuple(range(1, 41))
        request = Request(RequestId("r1"), prompt, SamplingSpec(max_tokens=6, ignore_eos=True), 0.0)
        tokens = [t async for d in engine.generate(request) for t in d.token_ids]
        prefill = Request(RequestId("r2"), prompt, SamplingSpec(max_tokens=4), 0.0)
        outcome = await engine.prefill(prefill)  # holds KV: counts as running
        assert outcome.kv is not None
        text = generate_latest(registry).decode()
    finally:
        await engine.stop()
        await release.close()
    assert len(tokens) == 6
    assert _value(registry, "vllm:time_to_first_token_seconds_count") == 2
    assert _value(registry, "vllm:inter_token_latency_seconds_count") == 5
    assert _value(registry, "vllm:e2e_request_latency_seconds_count") == 2
    assert _value(registry, "vllm:prompt_tokens_total") == 80
    assert _value(registry, "vllm:generation_tokens_total") == 7
    assert _value(registry, "vllm:time_to_first_token_seconds_bucket", le="2560.0") == 2
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
    ):
        assert f'{name}{{model_name="{MODEL}"}}' in text
    # The held KV of r2 is in use while its decode has not pulled it.
    assert _value(registry, "vllm:kv_cache_usage_perc") > 0


def test_pool_gauges_sum_per_role() -> None:
    rows = [("prefill", 2, 1, 30, 100), ("prefill", 1, 0, 10, 100), ("decode", 0, 5, 50, 200)]
    registry = CollectorRegistry()
    registry.register(PoolLoadCollector(lambda: rows))

    def value(name: str, role: str) -> float | None:
        return registry.get_sample_value(name, {"role": role})

    assert value("splitserve_router_pool_waiting_requests", "prefill") == 3
    assert value("splitserve_router_pool_running_requests", "decode") == 5
    assert value("splitserve_router_pool_kv_usage_ratio", "prefill") == 0.2
    assert value("splitserve_router_pool_kv_usage_ratio", "decode") == 0.25
