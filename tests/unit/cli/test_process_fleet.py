"""`ProcessFleet` (the fleet of `splitserve up --autoscale`) with fake processes, a fake router
that acknowledges the workers file, and a fake worker client: the order of fence, drain, file
and stop; a started worker joins the router only when ready; a flip keeps the new role for a
restart."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from splitserve.cli.autoscale_local import FleetError, ProcessFleet
from splitserve.cli.supervise import State
from splitserve.cli.up import Child
from splitserve.core.roles import Role


class FakeStack:
    def __init__(self, run_dir: Path) -> None:
        self.children: list[Child] = []
        self.run_dir = run_dir

    def add(self, name: str, role: str, address: str | None) -> Child:
        child = Child(
            name,
            [],
            self.run_dir / f"{name}.log",
            self.run_dir / f"{name}.ready.json",
            args=["worker", "serve", "--role", role, "--worker-id", name],
        )
        if address is not None:
            child.info = {"address": address}
        self.children.append(child)
        return child


class FakeSupervisor:
    def __init__(self) -> None:
        self.watched: list[str] = []
        self.state: dict[str, State] = {}

    def state_of(self, child: Child) -> State | None:
        return self.state.get(child.name, State.RUNNING)

    def watch(self, child: Child) -> None:
        self.watched.append(child.name)

    def unwatch(self, child: Child) -> None:
        if child.name in self.watched:
            self.watched.remove(child.name)


class Calls:
    log: ClassVar[list[str]] = []


class FakeClient:
    def drain(self, address: str, *, timeout_s: float) -> int:
        Calls.log.append(f"drain {address} fenced={_fenced(address)}")
        return 0

    def resume(self, address: str) -> None:
        Calls.log.append(f"resume {address}")

    def set_role(self, address: str, role: Role) -> None:
        Calls.log.append(f"set_role {address} {role.value}")


_FILE: list[Path] = []


def _fenced(address: str) -> bool | None:
    """What the router has applied for `address` (None: not in the router)."""
    applied = Path(f"{_FILE[0]}.applied")
    workers = json.loads(applied.read_text())["workers"] if applied.exists() else []
    return next((w["fenced"] for w in workers if w["address"] == address), None)


@pytest.fixture
def fleet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[ProcessFleet, Any]]:
    import splitserve.operator.workers as workers

    monkeypatch.setattr(workers, "GrpcWorkerClient", FakeClient)
    Calls.log = []
    stack = FakeStack(tmp_path)
    stack.add("prefill-0", "prefill", "127.0.0.1:1")
    stack.add("decode-1", "decode", "127.0.0.1:2")
    path = tmp_path / "workers.json"
    _FILE[:] = [path]
    stop = threading.Event()

    def router() -> None:  # acknowledges every version of the file
        while not stop.wait(0.01):
            if path.exists():
                Path(f"{path}.applied").write_text(path.read_text())

    t = threading.Thread(target=router, daemon=True)
    t.start()

    def spawn(name: str, role: Role) -> Child:
        return stack.add(name, role.value, None)

    supervisor = FakeSupervisor()
    f = ProcessFleet(stack, supervisor, path, spawn, lambda msg: None)  # type: ignore[arg-type]
    f.publish()
    yield f, (stack, supervisor, path)
    stop.set()
    t.join()


def test_start_joins_the_router_only_when_ready(fleet: tuple[ProcessFleet, Any]) -> None:
    f, (stack, supervisor, path) = fleet
    name = f.start(Role.PREFILL)
    assert name == "prefill-2"
    assert [w.ready for w in f.workers() if w.name == name] == [False]
    f.poll()
    assert "127.0.0.1:3" not in path.read_text()
    child = next(c for c in stack.children if c.name == name)
    child.ready_file.write_text(json.dumps({"address": "127.0.0.1:3"}))
    f.poll()
    assert [w.ready for w in f.workers() if w.name == name] == [True]
    assert "127.0.0.1:3" in path.read_text()
    assert supervisor.watched == [name]


def test_a_worker_marked_down_leaves_the_router_and_its_pool(
    fleet: tuple[ProcessFleet, Any],
) -> None:
    """A worker the supervisor gave up on was still counted as serving and kept in the
    router's file: the loop never replaced it and every request got 503."""
    f, (stack, supervisor, path) = fleet
    supervisor.state["prefill-0"] = State.WAITING  # exited, restarting: in its pool, not ready
    supervisor.state["decode-1"] = State.DOWN
    assert [(w.name, w.ready) for w in f.workers()] == [("prefill-0", False), ("decode-1", False)]
    f.poll()
    assert [w.name for w in f.workers()] == ["prefill-0"]
    assert "127.0.0.1:2" not in path.read_text()
    assert "127.0.0.1:1" in path.read_text()
    assert [c.name for c in stack.children] == ["prefill-0"]


def test_stop_fences_drains_then_leaves_the_router_then_stops(
    fleet: tuple[ProcessFleet, Any],
) -> None:
    f, (stack, _, path) = fleet
    f.stop("prefill-0")
    # The drain ran while the router had the worker fenced; then it left the file.
    assert Calls.log == ["drain 127.0.0.1:1 fenced=True"]
    assert "127.0.0.1:1" not in path.read_text()
    assert _fenced("127.0.0.1:1") is None
    assert [c.name for c in stack.children] == ["decode-1"]
    assert [w.name for w in f.workers()] == ["decode-1"]


def test_flip_drains_sets_the_role_and_keeps_it_for_a_restart(
    fleet: tuple[ProcessFleet, Any],
) -> None:
    f, (stack, _, path) = fleet
    f.set_role("decode-1", Role.PREFILL)
    assert Calls.log == [
        "drain 127.0.0.1:2 fenced=True",
        "set_role 127.0.0.1:2 prefill",
        "resume 127.0.0.1:2",
    ]
    assert _fenced("127.0.0.1:2") is False
    assert {w.name: w.role for w in f.workers()}["decode-1"] is Role.PREFILL
    child = next(c for c in stack.children if c.name == "decode-1")
    assert child.args[child.args.index("--role") + 1] == "prefill"
    assert json.loads(path.read_text())["workers"][1]["role"] == "prefill"


def test_autoscale_options_are_refused_without_autoscale_and_with_what_it_cannot_run() -> None:
    from click.testing import CliRunner

    from splitserve.cli.up import up

    runner = CliRunner()
    cases = [
        (["--autoscale-max", "3"], "--autoscale-max needs --autoscale"),
        (["--autoscale-burst-weight", "0.5"], "--autoscale-burst-weight needs --autoscale"),
        (
            ["--autoscale-max", "3", "--autoscale-min", "1"],
            "--autoscale-min, --autoscale-max need --autoscale",
        ),
        (["--autoscale", "--autoscale-burst-weight", "1.5"], "--autoscale-burst-weight"),
        (["--autoscale", "--engine", "vllm"], "--engine sim only"),
        (["--autoscale", "--mixed", "1"], "--mixed workers are not supported"),
        (["--autoscale", "--autoscale-min", "3", "--autoscale-max", "2"], "<= --autoscale-max"),
        (["--autoscale", "--autoscale-min", "0"], "--autoscale-min must be >= 1"),
        (["--autoscale", "--prefill", "6"], "--prefill 6 is above --autoscale-max 4"),
        (
            ["--autoscale", "--decode", "5", "--autoscale-max", "3"],
            "--decode 5 is above --autoscale-max 3",
        ),
        (
            ["--autoscale", "--prefill", "1", "--autoscale-min", "2"],
            "--prefill 1 is below --autoscale-min 2",
        ),
        (["--autoscale", "--prefill", "0"], "--prefill 0 is below --autoscale-min 1"),
    ]
    for args, message in cases:
        result = runner.invoke(up, args)
        assert result.exit_code == 2, (args, result.output)
        assert message in result.output, (args, result.output)


def test_starting_sizes_within_the_autoscale_bounds_pass() -> None:
    from splitserve.cli.autoscale_local import autoscale_usage_error

    opts = {
        "autoscale": True, "engine": "sim", "mixed": 0, "prefill": 2, "decode": 3,
        "autoscale_min": 2, "autoscale_max": 3,
    }  # fmt: skip
    assert autoscale_usage_error(opts) is None
    assert "--decode 3 is above --autoscale-max 2" in str(
        autoscale_usage_error({**opts, "autoscale_max": 2})
    )


def test_a_worker_the_loop_s_thread_starts_outlives_that_thread(
    fleet: tuple[ProcessFleet, Any],
) -> None:
    """A worker asks for SIGTERM when its parent *thread* ends (`die_with_parent`): one the
    loop's thread started was terminated as soon as `up` stopped that thread on Ctrl-C, before
    the router drained the requests running on it. Now the main loop (`poll()`, the fleet's
    thread) starts it; a real process, as `up` starts it (`Child.start`)."""
    f, (stack, _, _) = fleet
    started: list[Child] = []

    def spawn(name: str, role: Role) -> Child:
        child: Child = stack.add(name, role.value, None)
        child.argv = [sys.executable, "-c", "import time; time.sleep(60)"]
        child.start(dict(os.environ))
        started.append(child)
        return child

    f._spawn = spawn
    names: list[str] = []
    loop = threading.Thread(target=lambda: names.append(f.start(Role.DECODE)))
    loop.start()
    deadline = time.monotonic() + 20
    while loop.is_alive() and time.monotonic() < deadline:
        f.poll()  # up's main loop
        time.sleep(0.01)
    loop.join()
    try:
        assert names == ["decode-2"]
        time.sleep(0.5)  # the kernel's SIGTERM, had the thread been its parent
        assert started[0].exited() is None, "the worker died with the loop's thread"
    finally:
        for child in started:
            assert child.proc is not None
            child.proc.kill()
            child.proc.wait()


def test_no_worker_starts_once_up_is_stopping(fleet: tuple[ProcessFleet, Any]) -> None:
    """After `close()` (up stopping its stack) a start from the loop's thread is refused, so no
    worker is started behind the stack's stop and left running."""
    f, (stack, _, _) = fleet
    f.close()
    errors: list[Exception] = []

    def start() -> None:
        try:
            f.start(Role.DECODE)
        except FleetError as err:
            errors.append(err)

    loop = threading.Thread(target=start)
    loop.start()
    loop.join(20)
    f.poll()
    assert [str(e) for e in errors] == ["decode-2 not started: up is stopping"]
    assert [c.name for c in stack.children] == ["prefill-0", "decode-1"]


def test_a_flip_whose_worker_does_not_answer_set_role_leaves_it_unfenced_in_its_role(
    fleet: tuple[ProcessFleet, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker killed in the middle of its flip (after the drain, before SetRole): the flip
    failed with the worker left fenced in the workers file, so the router never sent the
    restarted worker anything while the loop counted it in its pool. Now the flip is given up
    as the operator abandons one: the worker is unfenced and keeps its role."""
    from splitserve.operator.workers import WorkerCallError

    def set_role(self: FakeClient, address: str, role: Role) -> None:
        raise WorkerCallError(f"{address}: connection refused")

    monkeypatch.setattr(FakeClient, "set_role", set_role)
    f, (stack, _, path) = fleet
    with pytest.raises(FleetError, match="decode-1: flip to prefill failed"):
        f.set_role("decode-1", Role.PREFILL)
    workers = {w["address"]: w for w in json.loads(path.read_text())["workers"]}
    assert workers["127.0.0.1:2"]["fenced"] is False
    assert workers["127.0.0.1:2"]["role"] == "decode"
    assert {w.name: w.role for w in f.workers()}["decode-1"] is Role.DECODE
    child = next(c for c in stack.children if c.name == "decode-1")
    assert child.args[child.args.index("--role") + 1] == "decode"


def test_a_drained_worker_is_stopped_even_when_the_router_does_not_acknowledge_its_removal(
    fleet: tuple[ProcessFleet, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The router not applying the file without the drained worker (busy, restarting) failed
    the stop after the worker had left the fleet: its process kept running, watched and
    restarted by the supervisor, in no pool and in no router. Now it is stopped anyway (it is
    fenced and drained: the router sends it nothing) and the error is still reported."""
    f, (stack, supervisor, _) = fleet
    supervisor.watched[:] = ["prefill-0", "decode-1"]
    publish = f.publish
    waited: list[bool] = []

    def slow_router(wait: bool = True) -> None:
        publish(wait=False)
        waited.append(wait)
        if wait and len(waited) > 1:  # the fence is applied; the removal is not
            raise FleetError("the router did not apply workers.json in 10 s")

    monkeypatch.setattr(f, "publish", slow_router)
    with pytest.raises(FleetError, match="did not apply"):
        f.stop("prefill-0")
    assert [c.name for c in stack.children] == ["decode-1"]
    assert supervisor.watched == ["decode-1"]
    assert [w.name for w in f.workers()] == ["decode-1"]
