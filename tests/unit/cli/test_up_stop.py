"""`Stack.stop`: the router is stopped and waited for before any worker is signalled; a second
Ctrl-C (`hurry`) stops waiting for its drain. Fake processes, nothing started (the real-process
test is tests/integration/test_up_stop_drains.py)."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from splitserve.cli import up as up_cli
from splitserve.cli.up import Child, Stack


class FakeProc:
    """Exits `polls` polls after its SIGTERM (never, with None); records what it was sent."""

    def __init__(self, name: str, log: list[str], polls: int | None) -> None:
        self.name, self.log, self.polls = name, log, polls
        self.code: int | None = None
        self.termed = False

    def poll(self) -> int | None:
        if self.code is None and self.termed and self.polls is not None:
            self.polls -= 1
            if self.polls <= 0:
                self.code = 0
                self.log.append(f"{self.name} exited")
        return self.code

    def send_signal(self, sig: int) -> None:
        assert sig == signal.SIGTERM
        self.termed = True
        self.log.append(f"{self.name} SIGTERM")

    def wait(self, timeout: float | None = None) -> int:
        if self.poll() is None and self.polls is None:
            import subprocess

            raise subprocess.TimeoutExpired("fake", timeout or 0)
        while self.poll() is None:
            pass
        assert self.code is not None
        return self.code

    def kill(self) -> None:
        self.code = -9
        self.log.append(f"{self.name} SIGKILL")


def _stack(tmp_path: Path, log: list[str], router_polls: int | None) -> Stack:
    stack = Stack(tmp_path)
    for name, polls in (("prefill-0", 1), ("decode-0", 1), ("router", router_polls)):
        child = Child(name, [], tmp_path / f"{name}.log", tmp_path / f"{name}.ready.json")
        child.proc = FakeProc(name, log, polls)  # type: ignore[assignment]
        stack.children.append(child)
    return stack


def test_the_router_drains_before_any_worker_is_signalled(tmp_path: Path) -> None:
    log: list[str] = []
    _stack(tmp_path, log, router_polls=5).stop()
    assert log[:2] == ["router SIGTERM", "router exited"]
    assert sorted(log[2:4]) == ["decode-0 SIGTERM", "prefill-0 SIGTERM"]
    assert "SIGKILL" not in " ".join(log)


def test_hurry_stops_waiting_for_the_drain(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log: list[str] = []
    stack = _stack(tmp_path, log, router_polls=None)  # a router that never finishes draining
    calls = {"n": 0}

    def hurry_after_a_few(_s: float, **_kw: Any) -> None:
        calls["n"] += 1
        if calls["n"] > 3:
            stack.hurry = True

    clock = SimpleNamespace(monotonic=time.monotonic, sleep=hurry_after_a_few)
    monkeypatch.setattr(up_cli, "time", clock)
    stack.stop()
    assert log[:2] == ["router SIGTERM", "router SIGKILL"]
    assert calls["n"] < 10  # not the 40 s drain timeout
    assert "prefill-0 SIGTERM" in log
    assert "decode-0 SIGTERM" in log
