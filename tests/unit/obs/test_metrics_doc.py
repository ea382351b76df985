"""docs/metrics.md against the code: every series its router, worker and operator tables name is
registered with the type and labels the table gives, and every router and worker series we
register is in the tables (the operator's control-loop series are listed in operations.md).

A live `splitserve up` stack showed the same names and labels on /metrics (new-user probe,
2026-11-27); this keeps the tables from drifting without starting one."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client import CollectorRegistry

from splitserve.obs.metrics import OperatorMetrics, PoolLoadCollector, RouterMetrics, WorkerMetrics

DOC = Path(__file__).resolve().parents[3] / "docs" / "metrics.md"
NAME = re.compile(r"`(splitserve_[a-z0-9_]+)`")
LABEL = re.compile(r"[a-z_]+")


Families = dict[str, tuple[str, set[str]]]
"""name (as documented: counters with `_total`) -> (type, label names)."""


def _families(registry: CollectorRegistry) -> Families:
    out: Families = {}
    for family in registry.collect():
        name = family.name + ("_total" if family.type == "counter" else "")
        labels: set[str] = set()
        for sample in family.samples:
            labels |= set(sample.labels) - {"le"}
        out[name] = (family.type, labels)
    return out


def _registered(cls: type[RouterMetrics | WorkerMetrics | OperatorMetrics]) -> Families:
    registry = CollectorRegistry()
    metrics = cls(registry)
    for attr in vars(metrics).values():  # one child each, so labelled series have samples
        if getattr(attr, "_labelnames", None):
            attr.labels(*["x"] * len(attr._labelnames))
    return _families(registry)


def _table(section: str) -> Families:
    """The `| series | type | labels | meaning |` rows of one `## section` of the doc."""
    text = DOC.read_text()
    start = text.index(f"\n## {section}")
    end = text.find("\n## ", start + 1)
    rows: Families = {}
    for line in text[start : end if end > 0 else None].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 4 or not NAME.search(cells[0]):
            continue
        labels = set(LABEL.findall(re.sub(r"\([^)]*\)", "", cells[2])))
        for name in NAME.findall(cells[0]):
            rows[name] = (cells[1], labels)
    return rows


def _check(documented: Families, live: Families) -> list[str]:
    problems = []
    for name, (kind, labels) in documented.items():
        if name not in live:
            problems.append(f"{name}: not registered")
            continue
        live_kind, live_labels = live[name]
        if live_kind != kind:
            problems.append(f"{name}: documented {kind}, registered {live_kind}")
        if labels != live_labels:
            problems.append(f"{name}: documented labels {sorted(labels)}, {sorted(live_labels)}")
    return problems


def test_the_router_table_is_what_the_router_registers() -> None:
    pools = CollectorRegistry()
    pools.register(PoolLoadCollector(lambda: [("prefill", 1, 1, 1, 2)]))
    live = _registered(RouterMetrics) | _families(pools)
    documented = _table("Router")
    assert _check(documented, live) == []
    assert sorted(set(live) - set(documented)) == []


def test_the_worker_table_is_what_a_worker_registers() -> None:
    live = _registered(WorkerMetrics)
    documented = _table("Worker")
    assert _check(documented, live) == []
    assert sorted(set(live) - set(documented)) == []


def test_the_operator_table_names_registered_series() -> None:
    assert _check(_table("Operator"), _registered(OperatorMetrics)) == []
