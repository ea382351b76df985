"""`splitserve dashboard render --prometheus URL`: a value that is not an http(s) URL with a host
is refused naming the flag before any query.

Before: `--prometheus localhost:9090` (no scheme) or `--prometheus ''` died in urllib's
'unknown url type' ValueError traceback on the first panel's query.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from splitserve.cli.main import cli


@pytest.mark.parametrize("url", ["localhost:9090", "", "notaurl", "ftp://x", "http://"])
def test_a_prometheus_that_is_not_an_http_url_is_refused(tmp_path: Path, url: str) -> None:
    argv = ["dashboard", "render", "--prometheus", url, "--out", str(tmp_path / "o")]
    res = CliRunner().invoke(cli, argv)
    assert res.exit_code == 2, res.output
    assert "--prometheus" in res.output
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    ("argv", "namespace", "service"),
    [
        ([], 'namespace=~".*"', 'service=~".*"'),
        (["--namespace", "team-a", "--service", "chat.v2"], 'namespace=~"team-a"', r'"chat\\.v2"'),
    ],
)
def test_render_substitutes_the_service_variables(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    argv: list[str],
    namespace: str,
    service: str,
) -> None:
    """The queries sent to Prometheus carry the variables as Grafana writes them: All is `.*`
    (it also matches series without the labels: a local stack's), one name an escaped regex."""
    from splitserve.obs import render
    from splitserve.obs.dashboards import DASHBOARDS

    sent: list[str] = []

    def query_range(_url: str, expr: str, *_args: float) -> list[dict[str, object]]:
        sent.append(expr)
        return []

    monkeypatch.setattr(render, "query_range", query_range)
    monkeypatch.setattr(render, "DASHBOARDS", {"splitserve-pd": DASHBOARDS["splitserve-pd"]})
    base = ["dashboard", "render", "--prometheus", "http://127.0.0.1:1", "--out", str(tmp_path)]
    res = CliRunner().invoke(cli, base + argv)
    assert res.exit_code == 0, res.output
    assert (tmp_path / "splitserve-pd.png").exists()
    assert sent
    assert not [e for e in sent if "$" in e]
    router = [e for e in sent if "splitserve_router_" in e]
    assert router
    assert all(namespace in e and service in e for e in router), router
