"""`splitserve operator run` refuses numbers it cannot honour before kopf starts, naming the flag.

Before: `--metrics-port -1` / `70000` died in a traceback from `bind()`, and `--interval 0` /
`-1` and `--drain-wait -1` were taken (a tick every 0 s; a Drain with a negative wait).
"""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner

from splitserve.cli.operator import operator


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--interval", "0"),
        ("--interval", "-1"),
        ("--drain-wait", "-1"),
        ("--metrics-port", "-1"),
        ("--metrics-port", "70000"),
    ],
)
def test_a_number_it_cannot_honour_is_refused_naming_the_flag(
    flag: str, value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import kopf

    started: list[object] = []

    async def fake_operator(**kwargs: Any) -> None:
        started.append(kwargs)

    monkeypatch.setattr(kopf, "operator", fake_operator)
    monkeypatch.setenv("SPLITSERVE_NAMESPACE", "ops")
    r = CliRunner().invoke(operator, ["run", flag, value])
    assert r.exit_code == 2, r.output
    assert flag in r.output
    assert started == []
