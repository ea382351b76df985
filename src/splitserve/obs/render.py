"""Draw dashboards as PNG from a Prometheus (`splitserve dashboard render`).

No Grafana needed: each panel's queries are run through Prometheus' `query_range` API and drawn
with matplotlib where the dashboard's grid puts the panel (24 columns, Grafana's grid units).
`$__rate_interval` becomes what Grafana would use: max(4 x scrape interval, step + scrape
interval). The `namespace` and `service` variables become regexes as Grafana writes them: All is
`.*` (which also matches series without those labels, as a local stack's are). Stat panels are
drawn as time series too (an approximation of Grafana's look).
"""

from __future__ import annotations

import json
import math
import re
import textwrap
import urllib.parse
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from splitserve.obs.dashboards import DASHBOARDS
from splitserve.obs.dashboards.model import ALL, Dashboard, build, substitute

_LABEL = re.compile(r"\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}")
_UNITS = {"s": "seconds", "percentunit": "ratio", "reqps": "req/s", "Bps": "bytes/s", "ops": "/s"}

Series = tuple[str, list[float], list[float]]
"""(legend, timestamps, values)."""


def query_range(
    prometheus: str, expr: str, start_s: float, end_s: float, step_s: float
) -> list[dict[str, object]]:
    """The `matrix` result of one range query."""
    params = urllib.parse.urlencode(
        {"query": expr, "start": f"{start_s:.3f}", "end": f"{end_s:.3f}", "step": f"{step_s:g}"}
    )
    url = f"{prometheus.rstrip('/')}/api/v1/query_range?{params}"
    with urllib.request.urlopen(url, timeout=30) as resp:
        body = json.loads(resp.read())
    if body.get("status") != "success":
        raise RuntimeError(f"{expr}: {body.get('error', body)}")
    result: list[dict[str, object]] = body["data"]["result"]
    return result


def legend(template: str, labels: dict[str, str]) -> str:
    if not template:
        return ", ".join(f"{k}={v}" for k, v in sorted(labels.items())) or "value"
    return _LABEL.sub(lambda m: labels.get(m.group(1), ""), template).strip()


def rate_interval(step_s: float, scrape_interval_s: float) -> str:
    return f"{math.ceil(max(4 * scrape_interval_s, step_s + scrape_interval_s))}s"


def render(
    board: Dashboard,
    prometheus: str,
    out: Path,
    *,
    start_s: float,
    end_s: float,
    scrape_interval_s: float = 15.0,
    namespace: str = ALL,
    service: str = ALL,
) -> Path:
    """Draw one dashboard into `out` (a PNG file); `namespace` and `service` are the variables'
    values as regexes (`ALL`, or `model.regex_value` of one name)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    step_s = max(1.0, (end_s - start_s) / 240)
    window = rate_interval(step_s, scrape_interval_s)
    model = build(board)
    panels: list[dict[str, object]] = model["panels"]  # type: ignore[assignment]
    specs = {p.title: p for p in board.panels}
    rows_total = max(int(p["gridPos"]["y"]) + int(p["gridPos"]["h"]) for p in panels)  # type: ignore[index]
    fig = plt.figure(figsize=(22, rows_total * 0.5 + 1), dpi=80)
    grid = fig.add_gridspec(
        rows_total, 24, hspace=4, wspace=2.5, left=0.03, right=0.99, top=0.95, bottom=0.03
    )
    fig.suptitle(board.title, fontsize=16, x=0.01, y=0.99, ha="left")
    for p in panels:
        pos: dict[str, int] = p["gridPos"]  # type: ignore[assignment]
        cell = grid[pos["y"] : pos["y"] + pos["h"], pos["x"] : pos["x"] + pos["w"]]
        if p["type"] == "row":
            ax = fig.add_subplot(cell)
            ax.axis("off")
            ax.text(0, 0.5, str(p["title"]), fontsize=13, fontweight="bold", va="center")
            continue
        spec = specs[str(p["title"])]
        ax = fig.add_subplot(cell)
        ax.set_title(spec.title, fontsize=10, loc="left")
        drawn = 0
        for q in spec.queries:
            expr = substitute(q.expr, window, namespace, service)
            for r in query_range(prometheus, expr, start_s, end_s, step_s):
                labels: dict[str, str] = r["metric"]  # type: ignore[assignment]
                points: Sequence[Sequence[object]] = r["values"]  # type: ignore[assignment]
                ts = [float(str(t)) - start_s for t, _ in points]
                vs = [float(str(v)) for _, v in points]
                ax.plot(ts, vs, linewidth=1.2, label=legend(q.legend, labels))
                drawn += 1
        if drawn == 0:
            why = spec.empty_in_local_stack or "no data"
            ax.text(0.5, 0.5, "no data", ha="center", va="center", fontsize=11, color="grey")
            ax.text(
                0.5,
                0.3,
                "\n".join(textwrap.wrap(why, 70)[:3]),
                ha="center",
                va="center",
                fontsize=7,
                color="grey",
            )
            ax.set_xticks([])
            ax.set_yticks([])
            continue
        ax.set_ylabel(_UNITS.get(spec.unit, ""), fontsize=8)
        ax.set_xlabel("seconds", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        if drawn <= 12:
            ax.legend(fontsize=6, loc="upper left")
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out


def render_all(
    prometheus: str,
    out_dir: Path,
    *,
    start_s: float,
    end_s: float,
    scrape_interval_s: float = 15.0,
    namespace: str = ALL,
    service: str = ALL,
) -> list[Path]:
    """Every dashboard, as `<out_dir>/<name>.png`."""
    return [
        render(
            board,
            prometheus,
            out_dir / f"{name}.png",
            start_s=start_s,
            end_s=end_s,
            scrape_interval_s=scrape_interval_s,
            namespace=namespace,
            service=service,
        )
        for name, board in DASHBOARDS.items()
    ]
