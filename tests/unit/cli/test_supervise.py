"""`splitserve up` supervision decisions: back-off, marking down, the ports a restart keeps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from splitserve.cli.supervise import (
    BACKOFF_MAX_S,
    MAX_QUICK_CRASHES,
    STABLE_S,
    History,
    Supervisor,
    next_action,
    respawn_args,
)


def test_quick_crashes_back_off_exponentially_then_mark_down() -> None:
    history = History()
    delays = [next_action("restart", history, ran_s=1.0) for _ in range(MAX_QUICK_CRASHES)]
    assert [a.kind for a in delays] == ["restart"] * MAX_QUICK_CRASHES
    assert [a.delay_s for a in delays] == [1.0, 2.0, 4.0, 8.0, 16.0]
    assert next_action("restart", history, ran_s=1.0).kind == "down"


def test_a_stable_run_resets_the_back_off() -> None:
    history = History()
    for _ in range(3):
        next_action("restart", history, ran_s=0.5)
    action = next_action("restart", history, ran_s=STABLE_S + 1)
    assert action.kind == "restart"
    assert action.delay_s == 1.0


def test_back_off_is_capped() -> None:
    history = History(quick_crashes=20)
    # Past the crash limit it is down; just below the cap the delay never exceeds the maximum.
    assert next_action("restart", history, ran_s=0.1).kind == "down"
    assert all(
        next_action("restart", History(quick_crashes=k), ran_s=0.1).delay_s <= BACKOFF_MAX_S
        for k in range(MAX_QUICK_CRASHES)
    )


@pytest.mark.parametrize("policy", ["down", "stop"])
def test_other_policies_act_at_once(policy: str) -> None:
    assert next_action(policy, History(), ran_s=100.0).kind == policy


def test_an_unknown_policy_is_refused() -> None:
    with pytest.raises(ValueError, match="policy"):
        next_action("reboot", History(), ran_s=1.0)


def test_a_restarted_worker_keeps_its_ports_before_engine_args() -> None:
    args = ["worker", "serve", "--role", "decode", "--", "--dtype", "float32"]
    out = respawn_args(args, {"port": 5001, "metrics_port": 9001}, "worker")
    assert out == [
        *("worker", "serve", "--role", "decode"),
        *("--port", "5001", "--metrics-port", "9001"),
        *("--", "--dtype", "float32"),
    ]


def test_a_restarted_worker_keeps_its_link_and_health_ports() -> None:
    info: dict[str, object] = {"port": 5001, "metrics_port": 9001, "link_port": 9002}
    info["health_port"] = 9003
    out = respawn_args(["worker", "serve"], info, "worker")
    assert out[2:] == [
        *("--port", "5001", "--metrics-port", "9001"),
        *("--link-port", "9002", "--health-port", "9003"),
    ]


def test_a_restarted_worker_without_a_link_gets_no_link_pin() -> None:
    info: dict[str, object] = {"port": 5001, "link_port": None, "health_port": None}
    assert "--link-port" not in respawn_args(["worker", "serve"], info, "worker")


def test_a_restarted_router_keeps_its_http_and_grpc_ports() -> None:
    out = respawn_args(
        ["router", "serve", "--port", "0"], {"port": 8123, "grpc_port": 50123}, "router"
    )
    assert out[-4:] == ["--port", "8123", "--grpc-port", "50123"]


class _FakeChild:
    def __init__(self, name: str, ready_file: Path) -> None:
        self.name = name
        self.ready_file = ready_file
        self.code: int | None = None
        self.info: dict[str, object] = {"port": 1, "address": "127.0.0.1:1"}

    def exited(self) -> int | None:
        return self.code

    def log_tail(self, lines: int = 20) -> str:
        return "boom"


class _FakeStack:
    def __init__(self, children: list[_FakeChild]) -> None:
        self.children = children
        self.respawned: list[str] = []

    def respawn(self, child: _FakeChild) -> None:
        self.respawned.append(child.name)
        child.code = None


def test_supervisor_restarts_after_the_back_off_and_sees_it_ready(tmp_path: Path) -> None:
    now = [0.0]
    child = _FakeChild("decode-0", tmp_path / "decode-0.ready.json")
    stack = _FakeStack([child])
    messages: list[str] = []
    sup = Supervisor(stack, "restart", messages.append, clock=lambda: now[0])  # type: ignore[arg-type]
    now[0] = 5.0
    child.code = -9
    assert sup.tick()
    assert sup.states() == {"decode-0": "waiting"}
    now[0] = 5.5
    assert sup.tick()
    assert stack.respawned == []  # 1 s back-off not over
    now[0] = 6.1
    assert sup.tick()
    assert stack.respawned == ["decode-0"]
    assert sup.states() == {"decode-0": "starting"}
    child.ready_file.write_text(json.dumps({"address": "127.0.0.1:1", "port": 1}))
    assert sup.tick()
    assert sup.states() == {"decode-0": "running"}
    assert any("restarting in 1 s" in m for m in messages)


def test_supervisor_stop_and_down_policies(tmp_path: Path) -> None:
    a = _FakeChild("prefill-0", tmp_path / "a.json")
    down = Supervisor(_FakeStack([a]), "down", lambda _m: None)  # type: ignore[arg-type]
    a.code = 1
    assert down.tick()
    assert down.states() == {"prefill-0": "down"}
    b = _FakeChild("router", tmp_path / "b.json")
    stop = Supervisor(_FakeStack([b]), "stop", lambda _m: None)  # type: ignore[arg-type]
    b.code = 1
    assert not stop.tick()


def test_a_router_marked_down_stops_the_stack(tmp_path: Path) -> None:
    """Nothing serves without the router: `up` kept running its workers alone, /health dead."""
    router = _FakeChild("router", tmp_path / "router.ready.json")
    worker = _FakeChild("decode-0", tmp_path / "decode-0.ready.json")
    messages: list[str] = []
    sup = Supervisor(_FakeStack([worker, router]), "down", messages.append)  # type: ignore[arg-type]
    router.code = 1
    assert not sup.tick()
    assert "nothing serves without it: stopping" in messages[-1]


def test_a_restarted_router_is_ready_again_at_its_http_address(tmp_path: Path) -> None:
    now = [0.0]
    router = _FakeChild("router", tmp_path / "router.ready.json")
    messages: list[str] = []
    sup = Supervisor(_FakeStack([router]), "restart", messages.append, clock=lambda: now[0])  # type: ignore[arg-type]
    router.code = -9
    assert sup.tick()
    now[0] = 2.0
    assert sup.tick()
    router.ready_file.write_text(json.dumps({"host": "127.0.0.1", "port": 8000, "grpc_port": 1}))
    assert sup.tick()
    assert messages[-1] == "router is ready again (127.0.0.1:8000)"  # was "()"


def test_a_restart_that_hangs_is_killed_after_the_ready_timeout(tmp_path: Path) -> None:
    """--ready-timeout-s covered only the first start: a restarted process hanging while it
    started stayed STARTING for good."""
    now = [0.0]
    child = _FakeChild("decode-0", tmp_path / "decode-0.ready.json")
    kills: list[str] = []
    child.proc = type("P", (), {"kill": lambda self: kills.append("kill")})()  # type: ignore[attr-defined]
    stack = _FakeStack([child])
    messages: list[str] = []
    sup = Supervisor(
        stack,  # type: ignore[arg-type]
        "restart",
        messages.append,
        clock=lambda: now[0],
        ready_timeout_s=10.0,
    )
    child.code = 1
    assert sup.tick()
    now[0] = 1.5
    assert sup.tick()
    assert sup.states() == {"decode-0": "starting"}
    now[0] = 11.0
    assert sup.tick()
    assert kills == []  # 9.5 s: not yet
    now[0] = 12.0
    assert sup.tick()
    assert kills == ["kill"]
    assert "not ready within 10 s" in messages[-1]
    assert sup.tick()
    assert kills == ["kill"]  # once
    child.code = -9  # the kill lands: a crash like any other, restarted after its back-off
    assert sup.tick()
    assert sup.states() == {"decode-0": "waiting"}
