"""What a dashboard is made of, and how it becomes Grafana JSON.

Each dashboard module describes its panels as `Panel`s (title, PromQL, unit) built from the metric
objects of `splitserve.obs.metrics` (`series()` reads a metric's exported name, so a renamed metric
renames every panel); `build()` turns a `Dashboard` into Grafana's JSON model with
grafana-foundation-sdk. The same `Panel`s feed the reality check (every expression evaluated
against a real Prometheus) and `splitserve dashboard render`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Literal

from grafana_foundation_sdk.builders import common as common_b
from grafana_foundation_sdk.builders import dashboard as dashboard_b
from grafana_foundation_sdk.builders import prometheus as prometheus_b
from grafana_foundation_sdk.builders import stat as stat_b
from grafana_foundation_sdk.builders import timeseries as timeseries_b
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as common_m
from grafana_foundation_sdk.models import dashboard as dashboard_m
from prometheus_client.metrics import MetricWrapperBase

RATE = "$__rate_interval"
"""Grafana's rate window macro; evaluators substitute a fixed window."""

DATASOURCE = dashboard_m.DataSourceRef(type_val="prometheus", uid="${datasource}")


def series(metric: MetricWrapperBase, suffix: str = "") -> str:
    """The exported name of a metric (`_total` for counters), plus e.g. `_bucket`."""
    family = next(iter(metric.describe()))
    name = str(family.name) + ("_total" if family.type == "counter" else "")
    return name + suffix


def quantile(q: float, histogram: MetricWrapperBase, by: str) -> str:
    """`histogram_quantile` of a histogram over the rate window, grouped by `by` (plus `le`)."""
    groups = ", ".join(["le", *[g.strip() for g in by.split(",") if g.strip()]])
    return (
        f"histogram_quantile({q}, sum by ({groups}) (rate({series(histogram, '_bucket')}[{RATE}])))"
    )


@dataclass(frozen=True, slots=True)
class Query:
    expr: str
    legend: str = ""
    empty_in_local_stack: str = ""
    """Why this query has no data in the local-stack reality check (empty: it must have data)."""


@dataclass(frozen=True, slots=True)
class Panel:
    title: str
    description: str
    queries: tuple[Query, ...]
    unit: str = "short"
    kind: Literal["timeseries", "stat"] = "timeseries"
    width: int = 12
    stack: bool = False
    empty_in_local_stack: str = ""
    """Why no query of this panel has data in the local-stack reality check."""

    def empty_reason(self, query: Query) -> str:
        return query.empty_in_local_stack or self.empty_in_local_stack


@dataclass(frozen=True, slots=True)
class Row:
    title: str
    panels: tuple[Panel, ...]


@dataclass(frozen=True, slots=True)
class Dashboard:
    uid: str
    title: str
    description: str
    rows: tuple[Row, ...]
    tags: tuple[str, ...] = field(default=("splitserve",))

    @property
    def panels(self) -> tuple[Panel, ...]:
        return tuple(p for row in self.rows for p in row.panels)


def _target(query: Query, ref: str) -> prometheus_b.Dataquery:
    target = prometheus_b.Dataquery().expr(query.expr).ref_id(ref).range()
    target = target.datasource(DATASOURCE)
    return target.legend_format(query.legend) if query.legend else target


def _panel(panel: Panel) -> timeseries_b.Panel | stat_b.Panel:
    built: timeseries_b.Panel | stat_b.Panel
    if panel.kind == "stat":
        built = stat_b.Panel().reduce_options(
            common_b.ReduceDataOptions().calcs(["lastNotNull"]).values(False)
        )
    else:
        built = (
            timeseries_b.Panel()
            .line_width(1)
            .fill_opacity(10 if not panel.stack else 40)
            .legend(
                common_b.VizLegendOptions()
                .display_mode(common_m.LegendDisplayMode.LIST)
                .placement(common_m.LegendPlacement.BOTTOM)
                .show_legend(True)
            )
            .tooltip(common_b.VizTooltipOptions().mode(common_m.TooltipDisplayMode.MULTI))
        )
        if panel.stack:
            built = built.stacking(common_b.StackingConfig().mode(common_m.StackingMode.NORMAL))
    built = built.title(panel.title).description(panel.description).unit(panel.unit)
    built = built.datasource(DATASOURCE).height(8).span(panel.width)
    for i, query in enumerate(panel.queries):
        built = built.with_target(_target(query, chr(ord("A") + i)))
    return built


def build(spec: Dashboard) -> dict[str, object]:
    """Grafana's dashboard JSON model of `spec`."""
    board = (
        dashboard_b.Dashboard(spec.title)
        .uid(spec.uid)
        .description(spec.description)
        .tags(list(spec.tags))
        .editable()
        .refresh("30s")
        .time("now-1h", "now")
        .timezone("browser")
        .tooltip(dashboard_m.DashboardCursorSync.CROSSHAIR)
        .with_variable(
            dashboard_b.DatasourceVariable("datasource").label("Prometheus").type("prometheus")
        )
    )
    ids = iter(range(1, 1000))
    for row in spec.rows:
        board = board.with_row(dashboard_b.Row(row.title).id(next(ids)))
        for panel in row.panels:
            board = board.with_panel(_panel(panel).id(next(ids)))
    encoded = json.dumps(board.build(), cls=JSONEncoder, sort_keys=True)
    out: dict[str, object] = json.loads(encoded)
    return out


def to_json(spec: Dashboard) -> str:
    return json.dumps(build(spec), indent=2, sort_keys=True) + "\n"
