"""What a dashboard is made of, and how it becomes Grafana JSON.

Each dashboard module describes its panels as `Panel`s (title, PromQL, unit) built from the metric
objects of `splitserve.obs.metrics` (`series()` reads a metric's exported name, so a renamed metric
renames every panel, and adds the matchers of the `namespace` / `service` variables, so every
panel shows the service(s) picked at the top); `build()` turns a `Dashboard` into Grafana's JSON
model with grafana-foundation-sdk. The same `Panel`s feed the reality check (every expression
evaluated against a real Prometheus) and `splitserve dashboard render`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Final, Literal

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


NAMESPACE: Final = "namespace"
SERVICE: Final = "service"
"""The dashboards' template variables: which service's series every panel shows. Router targets
get both labels from the Prometheus Operator (the ServiceMonitor: the router's Service is named
after its LLMService), worker pods from the chart's PodMonitor (`namespace`, and `service` copied
from the pod label `splitserve.io/service`)."""

ALL: Final = ".*"
"""The variables' All value, as Grafana substitutes it (a custom all value is never escaped). It
also matches series without the label (a matcher that matches "" does): the local stack's, and
anything scraped without the monitors."""

SCOPE: Final = f'{NAMESPACE}=~"${NAMESPACE}", {SERVICE}=~"${SERVICE}"'
"""The matchers that restrict a router or worker series to the chosen service(s)."""

OPERATOR_SCOPE: Final = f'{SERVICE}=~"${NAMESPACE}/${SERVICE}"'
"""The same for the operator's per-service series, whose own `service` label is
`<namespace>/<name>` (the operator pod's `namespace` target label is the operator's namespace,
not the service's, so it is not matched). With All: `.*/.*`, every service."""

BY_SERVICE: Final = f"{NAMESPACE}, {SERVICE}"
"""Grouping labels that keep one service's routers or workers apart from another's."""

SERVICE_LEGEND: Final = "{{namespace}}/{{service}}"
"""A router or worker series' service in a legend (the operator's `{{service}}` reads the same)."""

_VARIABLE_METRIC: Final = "splitserve_router_inflight_requests"
"""The series the variables list values from: every router exports it from its start."""


def selector(name: str, matchers: str = "", *, scope: str = SCOPE) -> str:
    """`name{scope, matchers}`: a series name restricted to the chosen service(s)."""
    inner = ", ".join(m for m in (scope, matchers) if m)
    return f"{name}{{{inner}}}" if inner else name


def _scope(metric: MetricWrapperBase, name: str) -> str:
    if not name.startswith("splitserve_operator_"):
        return SCOPE
    # The operator's reconcile and API series are the operator's own (no `service` label): they
    # cannot be narrowed to one service. (`_labelnames`: prometheus_client has no public getter.)
    return OPERATOR_SCOPE if SERVICE in metric._labelnames else ""


def series(metric: MetricWrapperBase, suffix: str = "", matchers: str = "") -> str:
    """The selector of a metric: its exported name (`_total` for counters), plus e.g. `_bucket`,
    restricted to the chosen service(s) (`SCOPE`; `OPERATOR_SCOPE` for the operator's
    per-service series), plus `matchers` (e.g. `state="ready"`)."""
    family = next(iter(metric.describe()))
    name = str(family.name) + ("_total" if family.type == "counter" else "") + suffix
    return selector(name, matchers, scope=_scope(metric, name))


def quantile(q: float, histogram: MetricWrapperBase, by: str) -> str:
    """`histogram_quantile` of a histogram over the rate window, grouped by `by` (plus `le`)."""
    groups = ", ".join(["le", *[g.strip() for g in by.split(",") if g.strip()]])
    return (
        f"histogram_quantile({q}, sum by ({groups}) (rate({series(histogram, '_bucket')}[{RATE}])))"
    )


def substitute(expr: str, rate_window: str, namespace: str = ALL, service: str = ALL) -> str:
    """`expr` as Grafana sends it to Prometheus: `$__rate_interval` replaced by `rate_window`, the
    variables by regexes (`ALL` for All; `regex_value` for one name)."""
    for name, value in ((NAMESPACE, namespace), (SERVICE, service)):
        expr = expr.replace(f"${name}", value)
    return expr.replace(RATE, rate_window)


_REGEX_SPECIAL: Final = re.compile(r"[\\^$*+?.()|{}\[\]]")


def regex_value(name: str) -> str:
    """One selected value as Grafana's Prometheus data source writes it into a regex matcher: each
    regex special character behind `\\\\` (a backslash, escaped in the PromQL string), so a
    Kubernetes name's `.` matches only itself."""
    return _REGEX_SPECIAL.sub(lambda m: "\\\\" + m.group(0), name)


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


def _variable(name: str, label: str, query: str) -> dashboard_b.QueryVariable:
    """A service picker: the values of a router label, several at once, All (`ALL`) first."""
    return (
        dashboard_b.QueryVariable(name)
        .label(label)
        .query(query)
        .datasource(DATASOURCE)
        .multi(True)
        .include_all(True)
        .all_value(ALL)
        .current(dashboard_m.VariableOption(selected=True, text=["All"], value=["$__all"]))
        .refresh(dashboard_m.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(dashboard_m.VariableSort.ALPHABETICAL_ASC)
    )


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
        .with_variable(
            _variable(NAMESPACE, "Namespace", f"label_values({_VARIABLE_METRIC}, {NAMESPACE})")
        )
        .with_variable(
            _variable(
                SERVICE,
                "Service",
                f'label_values({_VARIABLE_METRIC}{{{NAMESPACE}=~"${NAMESPACE}"}}, {SERVICE})',
            )
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
