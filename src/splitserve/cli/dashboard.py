"""`splitserve dashboard render`: the Grafana dashboards drawn as PNG from a Prometheus."""

from __future__ import annotations

import time
from pathlib import Path

import click

from splitserve.cli.numbers import FiniteFloat
from splitserve.cli.paths import OutDir


def _http_url(value: str) -> str:
    """An http(s) URL with a host (urllib died in an 'unknown url type' traceback without)."""
    from urllib.parse import urlsplit

    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise click.BadParameter(
            f"{value!r} is not an http(s) URL with a host, e.g. http://127.0.0.1:9090"
        )
    return value


@click.group()
def dashboard() -> None:
    """The Grafana dashboards (splitserve.obs.dashboards) without Grafana."""


@dashboard.command("render")
@click.option(
    "--prometheus",
    required=True,
    callback=lambda _ctx, _param, value: _http_url(value),
    help="Prometheus base URL, e.g. http://127.0.0.1:9090",
)
@click.option(
    "--out",
    type=OutDir(),
    required=True,
    help="Folder for <dashboard>.png.",
)
@click.option(
    "--since-s",
    type=FiniteFloat(min=1),
    default=3600,
    show_default=True,
    help="Time range: the last this many seconds.",
)
@click.option(
    "--scrape-interval-s",
    type=FiniteFloat(min=0.1),
    default=15,
    show_default=True,
    help="Prometheus' scrape interval (for $__rate_interval, as Grafana computes it).",
)
@click.option(
    "--namespace",
    default=None,
    help="The dashboards' `namespace` variable: one namespace's services only (default: All).",
)
@click.option(
    "--service",
    default=None,
    help="The dashboards' `service` variable: one LLMService's series only (default: All).",
)
def render_cmd(
    prometheus: str,
    out: Path,
    since_s: float,
    scrape_interval_s: float,
    namespace: str | None,
    service: str | None,
) -> None:
    """Draw every dashboard's panels from PROMETHEUS' query_range API (matplotlib)."""
    from splitserve.obs.dashboards.model import ALL, regex_value
    from splitserve.obs.render import render_all

    end_s = time.time()
    try:
        files = render_all(
            prometheus,
            out,
            start_s=end_s - since_s,
            end_s=end_s,
            scrape_interval_s=scrape_interval_s,
            namespace=ALL if namespace is None else regex_value(namespace),
            service=ALL if service is None else regex_value(service),
        )
    except OSError as err:
        raise click.ClickException(f"--prometheus {prometheus}: {err}") from err
    for path in files:
        click.echo(f"wrote {path}")
