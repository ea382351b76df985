"""`splitserve profile --worker` that is not HOST:PORT (port 1-65535) is a usage error naming the
flag and the value, before any connection is tried.

Before: `--worker nohost` and `--worker 127.0.0.1:99999` waited for a connection, then said "no
worker answers at ... (or it requires mutual TLS ...)", as for a worker that is merely down.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from splitserve.cli import profile as cli_profile


@pytest.mark.parametrize("value", ["nohost", "127.0.0.1:99999", ":50051", "host:0", "h:5x"])
def test_a_worker_that_is_not_host_port_is_refused(
    value: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    called: list[object] = []

    async def fake(*args: object, **kwargs: object) -> None:
        called.append(args)

    monkeypatch.setattr(cli_profile, "profile_worker", fake)
    r = CliRunner().invoke(cli_profile.profile, ["--worker", value, "--out", str(tmp_path / "p")])
    assert r.exit_code == 2, r.output
    assert "--worker" in r.output
    assert repr(value) in r.output, r.output
    assert "HOST:PORT" in r.output
    assert called == []
