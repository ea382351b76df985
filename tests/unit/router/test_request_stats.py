"""`RequestStats`: a request's metrics land in the series `labels()` names (cached children)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from splitserve.core.clock import ManualClock
from splitserve.obs.metrics import RouterMetrics
from splitserve.router.request_stats import RequestStats


def _value(reg: CollectorRegistry, name: str, **labels: str) -> float:
    value = reg.get_sample_value(name, labels)
    return 0.0 if value is None else value


def test_each_request_counts_in_its_own_series_across_registries() -> None:
    for _ in range(2):  # a second metrics object must not reuse the first one's children
        reg = CollectorRegistry()
        metrics = RouterMetrics(reg)
        clock = ManualClock()
        for path, outcome, tokens in (
            ("disaggregated", "ok", 4),
            ("disaggregated", "ok", 2),
            ("aggregated", "ok", 3),
            ("disaggregated", "cancelled", 1),
        ):
            stats = RequestStats(metrics, clock, num_prompt_tokens=10, slo_class="interactive")
            stats.start()
            clock.advance(0.1)
            stats.on_tokens(1, path)
            clock.advance(0.2)
            stats.on_tokens(tokens - 1, path)
            stats.finish(outcome, path)
        req = "splitserve_router_requests_total"
        assert _value(reg, req, outcome="ok", path="disaggregated", slo_class="interactive") == 2
        assert _value(reg, req, outcome="ok", path="aggregated", slo_class="interactive") == 1
        assert (
            _value(reg, req, outcome="cancelled", path="disaggregated", slo_class="interactive")
            == 1
        )
        ttft = "splitserve_router_ttft_seconds_count"
        assert _value(reg, ttft, path="disaggregated", slo_class="interactive") == 3
        assert _value(reg, ttft, path="aggregated", slo_class="interactive") == 1
        e2e = "splitserve_router_e2e_seconds_count"
        assert _value(reg, e2e, path="disaggregated", slo_class="interactive") == 2  # ok only
        tpot = "splitserve_router_tpot_seconds_count"
        assert _value(reg, tpot, path="disaggregated", slo_class="interactive") == 2
        assert _value(reg, "splitserve_router_inflight_requests") == 0
