"""The router process's garbage-collector settings (`router.gc_tuning`, issue 17)."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from splitserve.api.router import RouterConfig
from splitserve.cli import router as cli_router
from splitserve.router import gc_tuning, server
from splitserve.router.server import RouterServer
from tests.fakes.signals import run_stopped_at_once
from tests.unit.router.conftest import MODEL


@pytest.fixture
def restored_gc() -> Iterator[None]:
    """Whatever a test does to this process's collector is undone after it."""
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


def test_switch_from_env() -> None:
    assert gc_tuning.enabled_from_env({}) is True
    assert gc_tuning.enabled_from_env({gc_tuning.ENV: "1"}) is True
    assert gc_tuning.enabled_from_env({gc_tuning.ENV: " 0 "}) is False
    with pytest.raises(ValueError, match=gc_tuning.ENV):
        gc_tuning.enabled_from_env({gc_tuning.ENV: "off"})


@pytest.mark.usefixtures("restored_gc")
def test_settle_freezes_what_lives_and_raises_the_thresholds() -> None:
    gc.set_threshold(700, 10, 10)
    kept = [{"alive": i} for i in range(100)]  # tracked objects alive at the settle
    cycle: list[Any] = []
    cycle.append(cycle)  # garbage made before the settle: collected, not frozen
    del cycle
    old = gc_tuning.settle()
    assert old == (700, 10, 10)
    assert gc.get_threshold() == gc_tuning.THRESHOLDS
    assert gc.get_freeze_count() >= len(kept)
    collectable = {id(o) for o in gc.get_objects()}  # the frozen generation is not listed
    assert not any(id(d) in collectable for d in kept)
    # Cycles made after the settle are still collected.
    later: list[Any] = []
    later.append(later)
    del later
    assert gc.collect() >= 1


@pytest.mark.usefixtures("restored_gc")
def test_settle_keeps_higher_thresholds_and_a_disabled_collector() -> None:
    gc.set_threshold(50_000, 5, 200)
    gc_tuning.settle()
    assert gc.get_threshold() == (50_000, 20, 200)  # each floor applies on its own
    gc.unfreeze()
    gc.set_threshold(0, 10, 10)  # threshold 0: automatic collection off
    gc_tuning.settle()
    assert gc.get_threshold() == (0, 10, 10)


async def test_router_settles_only_when_asked(
    tokenizer_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []

    def fake_settle() -> tuple[int, int, int]:
        calls.append(1)
        return (700, 10, 10)

    monkeypatch.setattr(server, "settle_gc_now", fake_settle)
    config = RouterConfig(
        model_name=MODEL,
        tokenizer_dir=str(tokenizer_dir),
        http_host="127.0.0.1",
        http_port=0,
        grpc_port=None,
    )
    for settle, expected in ((False, []), (True, [1])):
        router = RouterServer(config, settle_gc=settle)
        await router.start()
        try:
            assert calls == expected
        finally:
            await router.stop(0)


def test_cli_passes_the_switch_and_refuses_a_bad_value(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    got: list[bool] = []
    path = tmp_path / "router.yaml"
    path.write_text(
        yaml.safe_dump({"model": {"name": "m", "source": "file:///m"}, "engine": {"kind": "sim"}})
    )

    def fake_serve(
        config: RouterConfig, ready: Any, reuse_port: bool, settle: bool, *_: Any
    ) -> None:
        got.append(settle)

    monkeypatch.setattr(cli_router, "_serve", fake_serve)
    runner = CliRunner()
    for value, expected in (("1", True), ("0", False)):
        result = runner.invoke(
            cli_router.router, ["serve", f"--config={path}"], env={gc_tuning.ENV: value}
        )
        assert result.exit_code == 0, result.output
        assert got[-1] is expected
    result = runner.invoke(
        cli_router.router, ["serve", f"--config={path}"], env={gc_tuning.ENV: "yes"}
    )
    assert result.exit_code == 2
    assert gc_tuning.ENV in result.output
    assert len(got) == 2


def test_serve_hands_the_switch_to_the_server(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[bool] = []

    class Double:
        settle_gc = False
        http_port, grpc_port = 1, 2

        def __init__(
            self, config: RouterConfig, *, reuse_port: bool = False, tokenizer: Any = None
        ) -> None:
            pass

        async def start(self) -> None:
            seen.append(self.settle_gc)

        async def wait(self) -> None:
            await asyncio.Event().wait()

        async def stop(self) -> None:
            pass

    monkeypatch.setattr(cli_router, "RouterServer", Double)
    monkeypatch.setattr(cli_router, "run_until_signalled", run_stopped_at_once)
    monkeypatch.setattr(cli_router, "_raise_fd_limit", lambda _: None)
    monkeypatch.setattr(cli_router, "_router_tokenizer", lambda *_: None)  # none is loaded
    config = RouterConfig(model_name=MODEL, tokenizer_dir="/unused")
    for settle in (True, False):
        cli_router._serve(config, None, False, settle)
    assert seen == [True, False]
