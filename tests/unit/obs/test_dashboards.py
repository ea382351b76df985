"""The generated Grafana dashboards: committed JSON matches the generator, the JSON is a
well-formed dashboard model, and every series a panel names is one the code exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from prometheus_client import CollectorRegistry

from splitserve.cli.gen_dashboards import gen_dashboards
from splitserve.obs.dashboards import DASHBOARDS, OUTPUT_DIRS, outputs
from splitserve.obs.dashboards.model import RATE, build, regex_value, series, substitute
from splitserve.obs.dashboards.sources import OPERATOR, ROUTER, VLLM_NAMES
from splitserve.obs.metrics import OperatorMetrics
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
    assert [v["name"] for v in variables] == ["datasource", "namespace", "service"]
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


# -- picking a service: the `namespace` and `service` variables ------------------------------------

_SELECTOR = re.compile(r"\b(splitserve_[a-z0-9_]+)(\{[^}]*\})?")
_AGGREGATION = re.compile(r"\b(sum|max|min|avg|count)\s*(?:by\s*\(([^)]*)\)\s*)?\(")
_SCOPE = ('namespace=~"$namespace"', 'service=~"$service"')
_OPERATOR_SCOPE = 'service=~"$namespace/$service"'


def _operator_series_without_service() -> set[str]:
    """The operator's own series (reconciles, API requests): no `service` label to narrow."""
    metrics = OperatorMetrics(CollectorRegistry())
    return {
        str(next(iter(attr.describe())).name)
        for attr in vars(metrics).values()
        if hasattr(attr, "_labelnames") and "service" not in attr._labelnames
    }


def _base(name: str) -> str:
    """A sample name's metric (family) name."""
    return re.sub(r"_(total|bucket|sum|count)$", "", name)


def _targets() -> list[tuple[str, str, str]]:
    """(dashboard file, panel title, expr) of every query in the committed JSON."""
    out = []
    for folder in OUTPUT_DIRS:
        for path in sorted((ROOT / folder).glob("*.json")):
            for panel in json.loads(path.read_text())["panels"]:
                for t in panel.get("targets", []):
                    out.append((f"{folder}/{path.name}", panel["title"], t["expr"]))
    assert len(out) > 80
    return out


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_namespace_and_service_variables_pick_a_service(name: str) -> None:
    """A namespace, then a service in it, listed from the routers' series; All first, as `.*`
    (never escaped by Grafana), which also matches series without those labels (a local stack's,
    where the All of listed values would match nothing)."""
    variables = {v["name"]: v for v in build(DASHBOARDS[name])["templating"]["list"]}  # type: ignore[index]
    namespace, service = variables["namespace"], variables["service"]
    for v in (namespace, service):
        assert v["type"] == "query"
        assert v["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert v["includeAll"] is True
        assert v["allValue"] == ".*"
        assert v["current"]["value"] in ("$__all", ["$__all"])
    assert re.fullmatch(r"label_values\(splitserve_router_\w+, namespace\)", namespace["query"])
    assert re.fullmatch(
        r'label_values\(splitserve_router_\w+\{namespace=~"\$namespace"\}, service\)',
        service["query"],
    ), service["query"]


def test_every_selector_is_narrowed_to_the_chosen_service() -> None:
    """Every series a query names carries the variables' matchers: router and worker series
    `namespace=~"$namespace", service=~"$service"` (target labels from the chart's monitors), the
    operator's per-service series `service=~"$namespace/$service"` (its own label, `ns/name`).
    Only the operator's own series, which have no `service` label, are left whole."""
    whole = _operator_series_without_service()
    assert whole, "the operator's reconcile / API series"
    problems = []
    seen = 0
    for board, title, expr in _targets():
        for m in _SELECTOR.finditer(expr):
            name, braces = m.group(1), m.group(2) or ""
            seen += 1
            if _base(name) in whole:
                assert "$namespace" not in braces, (board, title, expr)
                continue
            wanted = (_OPERATOR_SCOPE,) if name.startswith("splitserve_operator_") else _SCOPE
            if not all(w in braces for w in wanted):
                problems.append(f"{board} / {title}: {name}{braces}")
    assert seen > 60
    assert not problems, "\n".join(problems)


def test_aggregations_keep_services_apart() -> None:
    """An aggregation over routers or workers keeps `namespace, service` (or goes per worker,
    `instance`); one over the operator's per-service series keeps `service`: a chosen set of
    services (All included) never blends one service's latency, attainment or classes with
    another's."""
    whole = _operator_series_without_service()
    problems = []
    for board, title, expr in _targets():
        names = {_base(m.group(1)) for m in _SELECTOR.finditer(expr)}
        if names <= whole:
            continue
        operator = all(n.startswith("splitserve_operator_") for n in names)
        for m in _AGGREGATION.finditer(expr):
            labels = {g.strip() for g in (m.group(2) or "").split(",") if g.strip()}
            keeps = (
                {"service"} <= labels
                if operator
                else ({"namespace", "service"} <= labels or "instance" in labels)
            )
            if not keeps:
                problems.append(f"{board} / {title}: {m.group(0)} in {expr}")
    assert not problems, "\n".join(problems)


def test_substitute_is_what_grafana_sends() -> None:
    """All is `.*`; one name is escaped for a regex matcher, as Grafana's Prometheus data source
    does for a variable with an All option; `$__rate_interval` becomes the window."""
    expr = series(ROUTER.requests) + " " + series(OPERATOR.desired) + f" [{RATE}]"
    assert substitute(expr, "5m") == (
        'splitserve_router_requests_total{namespace=~".*", service=~".*"} '
        'splitserve_operator_pool_desired_replicas{service=~".*/.*"} [5m]'
    )
    one = substitute(expr, "1m", regex_value("team-a"), regex_value("chat.v2"))
    assert 'namespace=~"team-a", service=~"chat\\\\.v2"' in one
    assert 'service=~"team-a/chat\\\\.v2"' in one
    assert "$" not in one


def test_prometheus_reads_the_substituted_queries_as_grafana_means_them(tmp_path: Path) -> None:
    """With promtool (Prometheus' own PromQL engine): every query, variables substituted (All and
    one dotted name), parses; All (`.*`) also selects series without the labels (the local
    stack's), one service selects its own series only, for router and operator series alike."""
    import shutil
    import subprocess

    import yaml

    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (`make promtool`)")
    rules = [
        {"record": f"check:{pick}_{i}", "expr": substitute(q.expr, "5m", ns, svc)}
        for pick, ns, svc in (("all", ".*", ".*"), ("one", "team-a", regex_value("chat.v2")))
        for i, q in enumerate(q for d in DASHBOARDS.values() for p in d.panels for q in p.queries)
    ]
    router, operator = series(ROUTER.inflight), series(OPERATOR.desired)
    picks = {
        "all_router": (router, ".*", ".*", 4),
        "one_router": (router, "a", regex_value("x.y"), 1),
        "all_operator": (operator, ".*", ".*", 2),
        "one_operator": (operator, "a", regex_value("x.y"), 1),
    }
    rules += [
        {"record": name, "expr": f"count({substitute(sel, '5m', ns, svc)})"}
        for name, (sel, ns, svc, _) in picks.items()
    ]
    (tmp_path / "rules.yaml").write_text(
        yaml.safe_dump({"groups": [{"name": "d", "rules": rules}]})
    )
    inflight = "splitserve_router_inflight_requests"
    desired = "splitserve_operator_pool_desired_replicas"
    test = {
        "rule_files": ["rules.yaml"],
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {"series": s, "values": "1x5"}
                    for s in (
                        inflight,  # a local stack's router: neither label
                        inflight + '{namespace="a", service="x.y"}',
                        inflight + '{namespace="a", service="xzy"}',
                        inflight + '{namespace="b", service="x.y"}',
                        desired + '{service="a/x.y", role="decode"}',
                        desired + '{service="b/x.y", role="decode"}',
                    )
                ],
                "promql_expr_test": [
                    {"expr": name, "eval_time": "2m", "exp_samples": [{"labels": name, "value": n}]}
                    for name, (*_, n) in picks.items()
                ],
            }
        ],
    }
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(test))
    done = subprocess.run(
        [promtool, "test", "rules", "test.yaml"], cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
