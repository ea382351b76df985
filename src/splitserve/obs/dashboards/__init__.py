"""Grafana dashboards as code (grafana-foundation-sdk), one module per dashboard.

`splitserve gen dashboards` writes them to `deploy/grafana/` and into the chart
(`charts/splitserve/dashboards/`, shipped as a ConfigMap for Grafana's sidecar); `--check` fails
on drift (CI).
"""

from __future__ import annotations

from typing import Final

from splitserve.obs.dashboards import control, overview, pd, workers
from splitserve.obs.dashboards.model import Dashboard, to_json

DASHBOARDS: Final[dict[str, Dashboard]] = {
    "splitserve-overview": overview.DASHBOARD,
    "splitserve-pd": pd.DASHBOARD,
    "splitserve-control": control.DASHBOARD,
    "splitserve-workers": workers.DASHBOARD,
}
OUTPUT_DIRS: Final = ("deploy/grafana", "charts/splitserve/dashboards")


def outputs() -> dict[str, str]:
    """{repository-relative path: JSON text} of every dashboard in every output folder."""
    return {
        f"{folder}/{name}.json": to_json(board)
        for folder in OUTPUT_DIRS
        for name, board in DASHBOARDS.items()
    }
