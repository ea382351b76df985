"""`splitserve operator run` argument handling (the run itself is covered by integration tests)."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from click.testing import CliRunner

from splitserve.cli.operator import operator


def test_needs_a_namespace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPLITSERVE_NAMESPACE", raising=False)
    result = CliRunner().invoke(operator, ["run"])
    assert result.exit_code == 2
    assert "--namespace" in result.output


def test_configures_and_starts_kopf(monkeypatch: pytest.MonkeyPatch) -> None:
    import kopf

    from splitserve.operator import handlers

    seen: dict[str, Any] = {}

    async def fake_operator(**kwargs: Any) -> None:
        seen.update(kwargs)

    monkeypatch.setattr(kopf, "operator", fake_operator)
    root, aio = logging.getLogger(), logging.getLogger("asyncio")
    monkeypatch.setattr(root, "level", root.level)
    monkeypatch.setattr(root, "handlers", list(root.handlers))
    monkeypatch.setattr(aio, "propagate", aio.propagate)
    monkeypatch.setattr(aio, "handlers", list(aio.handlers))
    monkeypatch.setenv("SPLITSERVE_NAMESPACE", "ops")
    result = CliRunner().invoke(
        operator, ["run", "--interval", "2", "--router-image", "r:1", "--log-level", "WARNING"]
    )
    assert result.exit_code == 0, result.output
    assert seen["namespaces"] == ["ops"]
    assert seen["standalone"] is True
    op = seen["memo"]["operator"]
    assert isinstance(op, handlers.Operator)
    assert op.config.interval_s == 2
    assert op.config.settings.router_image == "r:1"
    timers = [h for h in seen["registry"]._spawning.get_all_handlers() if h.id == "tick"]
    assert [t.interval for t in timers] == [2]
    result = CliRunner().invoke(operator, ["run", "-A"])
    assert result.exit_code == 0, result.output
    assert seen["clusterwide"] is True
