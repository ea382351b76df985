"""The generated Grafana dashboards: committed JSON matches the generator, the JSON is a
well-formed dashboard model, and every series a panel names is one the code exports."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from splitserve.cli.gen_dashboards import gen_dashboards
from splitserve.obs.dashboards import DASHBOARDS, OUTPUT_DIRS, outputs
from splitserve.obs.dashboards.model import RATE, build
from splitserve.obs.dashboards.sources import VLLM_NAMES
from splitserve.worker.vllm_adapter.metrics_map import VLLM_METRICS

ROOT = Path(__file__).resolve().parents[3]


def test_committed_dashboards_match_the_generator() -> None:
    stale = [rel for rel, text in outputs().items() if (ROOT / rel).read_text() != text]
    assert not stale, f"run `make gen-dashboards`: {stale}"
    for folder in OUTPUT_DIRS:
        on_disk = {p.stem for p in (ROOT / folder).glob("*.json")}
        assert on_disk == set(DASHBOARDS), f"{folder} holds {on_disk}"


def test_check_flag_fails_on_drift_and_write_repairs_it(tmp_path: Path) -> None:
    runner = CliRunner()
    assert runner.invoke(gen_dashboards, ["--root", str(tmp_path), "--check"]).exit_code == 1
    assert runner.invoke(gen_dashboards, ["--root", str(tmp_path)]).exit_code == 0
    assert runner.invoke(gen_dashboards, ["--root", str(tmp_path), "--check"]).exit_code == 0
    target = tmp_path / "deploy/grafana/splitserve-pd.json"
    target.write_text(target.read_text().replace("Prefill", "Prefil"))
    result = runner.invoke(gen_dashboards, ["--root", str(tmp_path), "--check"])
    assert result.exit_code == 1
    assert "deploy/grafana/splitserve-pd.json" in result.output


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_dashboard_json_is_a_grafana_model(name: str) -> None:
    board = build(DASHBOARDS[name])
    assert board["uid"] == name
    assert board["title"]
    assert isinstance(board["schemaVersion"], int)
    variables = board["templating"]["list"]  # type: ignore[index]
    assert [v["name"] for v in variables] == ["datasource"]
    panels = board["panels"]
    assert isinstance(panels, list)
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    titles = [p["title"] for p in panels if p["type"] != "row"]
    assert len(titles) == len(set(titles)), "panel titles must be unique"
    cells: set[tuple[int, int]] = set()
    for p in panels:
        pos = p["gridPos"]
        assert pos["x"] >= 0, p["title"]
        assert pos["x"] + pos["w"] <= 24, p["title"]
        for dx in range(pos["w"]):
            for dy in range(pos["h"]):
                cell = (pos["x"] + dx, pos["y"] + dy)
                assert cell not in cells, f"{p['title']} overlaps another panel"
                cells.add(cell)
        if p["type"] == "row":
            continue
        assert p["type"] in {"timeseries", "stat"}
        assert p["description"], p["title"]
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert p["targets"], p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs))
        for t in p["targets"]:
            assert t["expr"].count("(") == t["expr"].count(")"), t["expr"]
            assert "[" not in t["expr"] or RATE in t["expr"], t["expr"]


def test_every_required_view_is_there() -> None:
    """The issue's list: what each dashboard must at least show."""
    titles = {name: {p.title for p in d.panels} for name, d in DASHBOARDS.items()}
    exprs = {
        name: " ".join(q.expr for p in d.panels for q in p.queries)
        for name, d in DASHBOARDS.items()
    }
    assert {"Requests by path and outcome", "SLO attainment per class", "TTFT per class",
            "TPOT per class", "End-to-end latency per class", "Shed and errors",
            "In flight and queued"} <= titles["splitserve-overview"]  # fmt: skip
    assert {"Waiting requests by role", "Running requests (batch) by role",
            "KV cache use per worker", "KV transfer bytes", "KV pull time p50 / p99",
            "KV transfer time (NIXL)",
            "Fallbacks and migrations by reason", "Role flips",
            } <= titles["splitserve-pd"]  # fmt: skip
    assert {"Desired vs current vs ready workers", "Decisions by kind and reason",
            "Signal staleness"} <= titles["splitserve-control"]  # fmt: skip
    assert {"Step time p50 / p99", "Tokens per step", "Preemptions"} <= titles["splitserve-workers"]
    assert "splitserve_worker_vllm_" in exprs["splitserve-workers"]


def test_vllm_names_are_the_workers_mapping() -> None:
    mapped: set[str] = set()
    for m in VLLM_METRICS.values():
        if m.kind == "counter":
            mapped.add(m.name + "_total")
        elif m.kind == "histogram":
            mapped.add(m.name)  # used with _sum / _count
        else:
            mapped.add(m.name)
    assert set(VLLM_NAMES) <= mapped, set(VLLM_NAMES) - mapped


def test_empty_panels_say_why() -> None:
    for d in DASHBOARDS.values():
        for p in d.panels:
            for q in p.queries:
                reason = p.empty_reason(q)
                assert reason == "" or len(reason) > 20, (p.title, reason)


def test_router_pool_views_count_each_worker_once() -> None:
    """Every router replica reports the whole pool (`splitserve_router_endpoints`): panels take
    the max over the routers of one service (the ServiceMonitor's `namespace`, `service` target
    labels), never the sum, which counted each worker once per router replica."""
    import re

    name = "splitserve_router_endpoints"
    seen = 0
    for d in DASHBOARDS.values():
        for panel in build(d)["panels"]:  # type: ignore[attr-defined]
            for t in panel.get("targets", []):
                if name not in t["expr"]:
                    continue
                seen += 1
                m = re.search(r"(\w+) by \(([^)]*)\) \(" + name + r"\b", t["expr"])
                assert m, (panel["title"], t["expr"])
                labels = {s.strip() for s in m.group(2).split(",")}
                assert m.group(1) == "max", (panel["title"], t["expr"])
                assert {"namespace", "service"} <= labels, (panel["title"], t["expr"])
                assert {"namespace", "service"} <= set(re.findall(r"\w+", t["legendFormat"]))
    assert seen >= 2


def test_rate_panels_have_a_per_second_unit() -> None:
    """A panel that draws only rates (`rate(...)` summed, no ratio or quantile) is in units per
    second; `short` (a bare count) misreads it (Overview "Tokens" did)."""
    import re

    per_second = {"ops", "reqps", "Bps", "cps", "binBps"}
    only_rate = re.compile(r"^sum(?: by \([^)]*\))? ?\(rate\([^()]*\)\)$")
    for d in DASHBOARDS.values():
        for p in d.panels:
            if all(only_rate.match(q.expr) for q in p.queries):
                assert p.unit in per_second, (d.uid, p.title, p.unit)
