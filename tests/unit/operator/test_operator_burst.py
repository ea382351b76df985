"""Burst headroom in the live loop: `scaling.burstWeight` and the busiest sub-window's arrival
rate (`Observation.arrival_rate_peak_per_s`), from direct router scrapes and from Prometheus,
against the in-memory API server."""

from __future__ import annotations

import json
from typing import Any

import pytest

from splitserve.operator.control.signals import busiest_rate, parse
from splitserve.policy.planner.signals import SignalState
from tests.unit.operator.test_operator_control import Env

SCALING = {"mode": "Managed", "intervalSeconds": 10, "windowSeconds": 30}
POOLS = {
    "prefill": {"replicas": 1, "minReplicas": 1, "maxReplicas": 40},
    "decode": {"replicas": 1, "minReplicas": 1, "maxReplicas": 40},
}


def _bursty(env: Env) -> Any:
    """20 s at 1 req/s, then 10 s at 20 req/s: the 30 s window's mean is 7.3 req/s."""
    env.tick(0.0)
    env.tick(n=10, prompt=2000, output=200)
    env.tick(n=10, prompt=2000, output=200)
    return env.tick(n=200, prompt=2000, output=200)


def test_bursty_window_sizes_pools_larger_than_its_mean_alone() -> None:
    sized: dict[float, dict[str, int]] = {}
    for weight in (0.0, 1.0):
        env = Env(pools=POOLS, scaling={**SCALING, "burstWeight": weight})
        result = _bursty(env)
        obs = result.observation
        assert obs.arrival_rate_per_s == pytest.approx(220 / 30)
        assert obs.arrival_rate_peak_per_s == pytest.approx(20.0)
        sized[weight] = env.pools_spec()
    assert sized[1.0]["prefill"] > sized[0.0]["prefill"]
    assert sized[1.0]["decode"] > sized[0.0]["decode"]


def test_default_burst_weight_acts_and_peak_is_in_the_decision_inputs() -> None:
    env = Env(pools=POOLS, scaling=SCALING)  # burstWeight left out: 1
    result = _bursty(env)
    # the busiest 10 s (20 req/s) less what Poisson arrivals at the mean (7.33 req/s) show in
    # the busiest of the window's sub-windows anyway (live_params: burst_poisson)
    assert "burst 19.3" in result.decision.pools[next(iter(result.decision.pools))].reason
    scale = [d for d in env.status()["decisions"] if d["kind"] == "scale"]
    assert scale[-1]["inputs"]["arrivalRatePeak"] == "20/s"
    assert scale[-1]["inputs"]["forecastRate"] == "19.3/s"


def test_burst_weight_out_of_range_is_refused() -> None:
    from pydantic import ValidationError

    from splitserve.api import v1alpha1 as v1

    with pytest.raises(ValidationError, match=r"burst_weight|burstWeight"):
        v1.ScalingSpec.model_validate({"burstWeight": 1.5})


def _prometheus_env(range_answer: Any) -> tuple[Env, list[str]]:
    env = Env(
        pools=POOLS,
        scaling={
            **SCALING,
            "metricsSource": "Prometheus",
            "prometheusUrl": "http://prom:9090",
        },
    )
    seen: list[str] = []

    def prom(url: str) -> str:
        seen.append(url)
        if "%5B30s%5D" in url:  # the range query: [30s] (URL-encoded)
            return str(range_answer(url))
        result = [
            {
                "metric": {"__name__": name, "pod": "svc-router-0", **dict(labels)},
                "value": [0, str(value)],
            }
            for (name, labels), value in parse(env.router.text()).items()
        ]
        return json.dumps({"status": "success", "data": {"result": result}})

    env.controller.get = prom
    return env, seen


def test_prometheus_peak_from_the_raw_samples_of_the_window() -> None:
    import urllib.parse

    def answer(url: str) -> str:
        at = float(urllib.parse.parse_qs(urllib.parse.urlparse(url).query)["time"][0])
        # One router scraped every 5 s: 40 requests in the last 10 s, 5 in the 20 s before.
        counts = [(at - 30, 100), (at - 25, 101), (at - 20, 103), (at - 15, 104)]
        counts += [(at - 10, 105), (at - 5, 125), (at, 145)]
        series = [
            {
                "metric": {
                    "__name__": "splitserve_router_admission_total",
                    "pod": "svc-router-0",
                    "slo_class": "chat",
                    "outcome": "admitted",
                },
                "values": [[t, str(v)] for t, v in counts],
            }
        ]
        return json.dumps({"status": "success", "data": {"resultType": "matrix", "result": series}})

    env, seen = _prometheus_env(answer)
    env.tick(0.0)
    result = env.tick(n=45, prompt=2000, output=200)
    assert result.observation.arrival_rate_peak_per_s == pytest.approx(4.0)
    assert result.observation.peak_problem is None
    assert any("splitserve_router_admission_total" in urllib.parse.unquote(u) for u in seen)


def test_prometheus_range_query_failure_is_an_explicit_unknown_peak() -> None:
    def answer(url: str) -> str:
        return json.dumps({"status": "error", "error": "too many samples"})

    env, _ = _prometheus_env(answer)
    env.tick(0.0)
    result = None
    for _ in range(3):
        result = env.tick(n=300, prompt=2000, output=200)
    assert result is not None
    obs = result.observation
    assert obs.arrival_rate_peak_per_s is None
    assert obs.peak_problem is not None
    assert obs.peak_problem.state is SignalState.MISSING
    assert "too many samples" in obs.peak_problem.reason
    # The loop still acts, on the mean, and says the peak is unknown.
    assert env.pools_spec()["prefill"] > 1
    scale = [d for d in env.status()["decisions"] if d["kind"] == "scale"]
    assert scale[0]["inputs"]["arrivalRatePeak"].startswith("unknown: Prometheus range query")
    assert "no burst peak" in scale[0]["message"]


def test_busiest_rate_sums_routers_and_counts_restarts_from_zero() -> None:
    a = [(0.0, 0.0), (10.0, 10.0), (20.0, 20.0), (30.0, 220.0)]
    b = [(0.0, 50.0), (10.0, 60.0), (20.0, 5.0), (30.0, 15.0)]  # restarted before 20 s
    rate, why = busiest_rate({"a": a, "b": b}, 30.0, 30.0, 10.0)
    assert why == ""
    assert rate == pytest.approx(21.0)  # (200 + 10) / 10


def test_busiest_rate_is_no_finer_than_the_samples() -> None:
    # Samples every 15 s: the sub-window becomes 15 s, not 10.
    pts = [(0.0, 0.0), (15.0, 15.0), (30.0, 165.0)]
    rate, _ = busiest_rate({"a": pts}, 30.0, 30.0, 10.0)
    assert rate == pytest.approx(10.0)


def test_busiest_rate_unknown_with_one_sample() -> None:
    rate, why = busiest_rate({"a": [(0.0, 5.0)]}, 0.0, 30.0, 10.0)
    assert rate is None
    assert "fewer than two samples" in why


def test_prompt_spread_from_the_routers_length_histogram() -> None:
    from prometheus_client import CollectorRegistry, Histogram, generate_latest

    from splitserve.operator.control.signals import histogram_cv2

    buckets = (1, 4, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
    rng = __import__("numpy").random.default_rng(0)
    for lengths in (rng.lognormal(7, 0.3, 4000), rng.lognormal(7, 1.0, 4000)):
        reg = CollectorRegistry()
        h = Histogram("splitserve_router_prompt_length_tokens", "", buckets=buckets, registry=reg)
        for x in lengths:
            h.observe(float(x))
        samples = parse(generate_latest(reg).decode())
        exact = float(lengths.var() / lengths.mean() ** 2)
        est = histogram_cv2(samples, "splitserve_router_prompt_length_tokens")
        assert est is not None
        # Read conservatively (tests/unit/operator/test_prompt_spread.py): never far below the
        # exact spread, a light one a little above it.
        assert 0.9 * exact <= est <= 2.0 * exact + 0.4
    assert histogram_cv2({}, "splitserve_router_prompt_length_tokens") is None


def test_live_observation_carries_the_prompt_spread() -> None:
    env = Env(pools=POOLS, scaling=SCALING)
    env.tick(0.0)
    env.router.serve(50, prompt=100)
    result = env.tick(n=50, prompt=3000)
    cv2 = result.observation.prompt_tokens_cv2
    assert cv2 is not None
    assert cv2 > 0.5  # two very different lengths: a wide spread
