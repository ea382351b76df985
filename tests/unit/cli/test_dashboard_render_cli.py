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
