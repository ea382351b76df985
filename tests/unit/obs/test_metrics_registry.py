"""Metric names: every series is `splitserve_*`, and every series the shipped Prometheus rules
(and, when present, dashboards) name is one we register."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml
from prometheus_client import CollectorRegistry

from splitserve.obs.metrics import OperatorMetrics, RouterMetrics, WorkerMetrics, metric_names
from splitserve.worker.vllm_adapter.metrics_map import VLLM_METRICS

ROOT = Path(__file__).resolve().parents[3]
SERIES = re.compile(r"\b(splitserve_[a-z0-9_]+)")


def registered() -> set[str]:
    names: set[str] = set()
    for cls in (RouterMetrics, WorkerMetrics, OperatorMetrics):
        registry = CollectorRegistry()
        metrics = cls(registry)
        # Touch one child of each labelled metric so its samples appear.
        for attr in vars(metrics).values():
            if hasattr(attr, "_labelnames") and attr._labelnames:
                attr.labels(*["x"] * len(attr._labelnames))
        names |= metric_names(registry)
    return names


def exported() -> set[str]:
    """What a scrape can show: our registries plus vLLM's series as the worker maps them
    (counters `_total`, histograms as `_sum` / `_count`)."""
    suffixes = {"counter": ("_total",), "gauge": ("",), "histogram": ("_sum", "_count")}
    return registered() | {m.name + s for m in VLLM_METRICS.values() for s in suffixes[m.kind]}


def test_every_metric_has_our_prefix() -> None:
    names = registered()
    assert names
    assert all(n.startswith("splitserve_") for n in names), sorted(names)


def _rule_exprs() -> list[str]:
    exprs = []
    for path in sorted((ROOT / "deploy" / "prometheus").glob("*-rules.yaml")):
        for group in yaml.safe_load(path.read_text())["groups"]:
            exprs += [rule["expr"] for rule in group["rules"]]
    return exprs


def _dashboard_exprs() -> list[str]:
    exprs: list[str] = []
    for path in sorted(ROOT.glob("charts/*/dashboards/*.json")):
        exprs += re.findall(r'"expr":\s*"((?:[^"\\]|\\.)*)"', path.read_text())
    return [json.loads(f'"{e}"') for e in exprs]


def test_rules_and_dashboards_name_registered_series() -> None:
    exprs = _rule_exprs() + _dashboard_exprs()
    assert exprs, "no rule expressions found"
    names = exported()
    unknown = {s for e in exprs for s in SERIES.findall(e)} - names
    assert not unknown, f"series not registered in splitserve.obs.metrics: {sorted(unknown)}"


def test_kv_pull_buckets_resolve_sub_millisecond_pulls() -> None:
    """Simulated pulls average ~3.5 ms and NIXL pulls are sub-ms to a few ms: the histogram's
    buckets start near 0.5 ms (they were TTFT's, from 5 ms) and still reach a few seconds."""
    reg = CollectorRegistry()
    WorkerMetrics(reg)
    bounds = sorted(
        float(s.labels["le"])
        for fam in reg.collect()
        if fam.name == "splitserve_worker_kv_pull_seconds"
        for s in fam.samples
        if s.name.endswith("_bucket") and s.labels["le"] != "+Inf"
    )
    assert bounds[0] <= 0.0005
    assert sum(b < 0.005 for b in bounds) >= 3  # the range simulated and NIXL pulls fall in
    assert bounds[-1] >= 5
