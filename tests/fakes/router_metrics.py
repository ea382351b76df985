"""A router's SLO metrics as Prometheus text (METRICS_CONTRACT names), driven by a test.

The real router emits these from obs.metrics `RouterMetrics` (the SLO-router work); this fake
builds them with prometheus_client on its own registry, so the text is the real exposition
format, and lets a test add requests of a class with chosen latencies and lengths.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_TTFT = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64)
_TPOT = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28)
_LEN = (16, 64, 256, 1024, 4096, 16384)


class FakeRouterMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        p = "splitserve_router_"
        self.admission = Counter(p + "admission", "", ["slo_class", "outcome"], registry=r)
        self.slo = Counter(p + "slo_requests", "", ["slo_class", "result"], registry=r)
        self.requests = Counter(p + "requests", "", ["outcome", "path", "slo_class"], registry=r)
        self.ttft = Histogram(
            p + "ttft_seconds", "", ["path", "slo_class"], buckets=_TTFT, registry=r
        )
        self.tpot = Histogram(
            p + "tpot_seconds", "", ["path", "slo_class"], buckets=_TPOT, registry=r
        )
        self.prompt = Histogram(
            p + "prompt_length_tokens", "", ["slo_class"], buckets=_LEN, registry=r
        )
        self.output = Histogram(
            p + "output_length_tokens", "", ["slo_class"], buckets=_LEN, registry=r
        )
        self.queue = Gauge(p + "queue_depth", "", ["slo_class"], registry=r)

    def serve(
        self,
        n: int,
        slo_class: str = "chat",
        *,
        ttft_s: float = 0.3,
        tpot_s: float = 0.03,
        prompt: int = 1000,
        output: int = 200,
        met: bool = True,
    ) -> None:
        """`n` requests of the class, admitted and finished with these numbers."""
        self.admission.labels(slo_class, "admitted").inc(n)
        self.slo.labels(slo_class, "met" if met else "missed").inc(n)
        self.requests.labels("ok", "disaggregated", slo_class).inc(n)
        for _ in range(n):
            self.ttft.labels("disaggregated", slo_class).observe(ttft_s)
            self.tpot.labels("disaggregated", slo_class).observe(tpot_s)
            self.prompt.labels(slo_class).observe(prompt)
            self.output.labels(slo_class).observe(output)

    def shed(self, n: int, slo_class: str = "chat", *, queued_first: bool = False) -> None:
        """`n` requests of the class answered 429, as the router counts them: refused at
        arrival (admission `shed`), or queued at arrival and shed later (admission `queued`);
        both end as `requests_total{outcome="shed"}` (path `none`: never placed)."""
        self.admission.labels(slo_class, "queued" if queued_first else "shed").inc(n)
        self.requests.labels("shed", "none", slo_class).inc(n)

    def text(self) -> str:
        return generate_latest(self.registry).decode()
