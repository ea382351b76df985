"""Supervision for `splitserve up`: what happens when one of its processes exits on its own.

`restart` (the default): the process is started again with the same ports (so the router's
worker address, and clients' router address, stay valid), after a back-off that doubles with each
crash that follows a short run (1 s, 2 s, 4 s, ... up to 30 s) and resets once the process has
stayed up for `STABLE_S`. After `MAX_QUICK_CRASHES` crashes in a row without a stable run the
process is marked down and left down; the rest of the stack keeps serving (the router stops
placing work on a worker that does not answer).
`down`: a process that exits is marked down at once; the rest keeps serving.
`stop`: the first exit stops the whole stack (the old behaviour; exit code 1).

The decision (`next_action`) is a pure function of the exit history; `Supervisor` does the I/O.
"""

from __future__ import annotations

import enum
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from splitserve.cli.up import Child, Stack

BACKOFF_MIN_S = 1.0
BACKOFF_MAX_S = 30.0
STABLE_S = 30.0
"""A process up this long counts as healthy again: its back-off starts over."""
MAX_QUICK_CRASHES = 5
POLICIES = ("restart", "down", "stop")


class State(enum.Enum):
    RUNNING = "running"
    WAITING = "waiting"
    """Exited; restarts at `restart_at`."""
    STARTING = "starting"
    """Restarted; not ready yet."""
    DOWN = "down"


@dataclass
class History:
    """One process's crash record, as the decision sees it."""

    quick_crashes: int = 0
    """Exits in a row, each after a run shorter than `STABLE_S`."""
    restarts: int = 0


@dataclass(frozen=True, slots=True)
class Action:
    kind: str
    """`restart`, `down` or `stop`."""
    delay_s: float = 0.0


def next_action(policy: str, history: History, ran_s: float) -> Action:
    """What to do when a process exits after running `ran_s` seconds (updates `history`)."""
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
    if policy != "restart":
        return Action(policy)
    history.quick_crashes = 1 if ran_s >= STABLE_S else history.quick_crashes + 1
    if history.quick_crashes > MAX_QUICK_CRASHES:
        return Action("down")
    delay_s = min(BACKOFF_MAX_S, BACKOFF_MIN_S * 2 ** (history.quick_crashes - 1))
    return Action("restart", delay_s)


@dataclass
class Watched:
    child: Child
    history: History = field(default_factory=History)
    state: State = State.RUNNING
    started_s: float = 0.0
    restart_at_s: float = 0.0
    killed: bool = False
    """Killed for not getting ready in time after a restart (once per start)."""


class Supervisor:
    """Watches the stack's processes every `tick()` and applies the policy."""

    def __init__(
        self,
        stack: Stack,
        policy: str,
        echo: Callable[[str], None],
        clock: Callable[[], float] = time.monotonic,
        ready_timeout_s: float = 600.0,
    ) -> None:
        """`ready_timeout_s`: a restarted process not ready by then is killed, and its exit
        handled like any other (`up --ready-timeout-s`, as for the first start)."""
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
        self.stack = stack
        self.policy = policy
        self.echo = echo
        self.clock = clock
        self.ready_timeout_s = ready_timeout_s
        now = clock()
        self.watched = [Watched(c, started_s=now) for c in stack.children]

    def tick(self) -> bool:
        """One look at every process. Returns False when the stack must stop (`stop` policy)."""
        now = self.clock()
        for w in self.watched:
            if w.state in (State.RUNNING, State.STARTING):
                code = w.child.exited()
                if code is not None and not self._on_exit(w, code, now):
                    return False
                if w.state is State.STARTING and w.child.ready_file.exists():
                    w.child.info = json.loads(w.child.ready_file.read_text())
                    w.state = State.RUNNING
                    self.echo(f"{w.child.name} is ready again ({_where(w.child.info)})")
                elif (
                    w.state is State.STARTING
                    and not w.killed
                    and now - w.started_s > self.ready_timeout_s
                ):
                    # It hangs while starting (it stayed STARTING for good): its exit, seen on
                    # a later tick, is handled as a crash.
                    self.echo(
                        f"{w.child.name} was not ready within {self.ready_timeout_s:g} s of its "
                        "restart (--ready-timeout-s); killing it"
                    )
                    w.killed = True
                    if w.child.proc is not None:
                        w.child.proc.kill()
            elif w.state is State.WAITING and now >= w.restart_at_s:
                self.stack.respawn(w.child)
                w.history.restarts += 1
                w.state, w.started_s, w.killed = State.STARTING, now, False
        return True

    def _on_exit(self, w: Watched, code: int, now: float) -> bool:
        action = next_action(self.policy, w.history, now - w.started_s)
        name = w.child.name
        tail = w.child.log_tail()
        if action.kind == "stop":
            self.echo(f"{name} exited ({code}); stopping. Log tail:\n{tail}")
            return False
        if action.kind == "down" and name == "router":
            # Every request crosses it: nothing serves without it.
            self.echo(
                f"router exited ({code}) and is marked down ({w.history.restarts} restarts so "
                f"far); nothing serves without it: stopping. Log tail:\n{tail}"
            )
            return False
        if action.kind == "down":
            w.state = State.DOWN
            self.echo(
                f"{name} exited ({code}) and is marked down "
                f"({w.history.restarts} restarts so far); the rest keeps serving. Log tail:\n{tail}"
            )
            return True
        w.state, w.restart_at_s = State.WAITING, now + action.delay_s
        self.echo(f"{name} exited ({code}); restarting in {action.delay_s:g} s")
        return True

    def watch(self, child: Child) -> None:
        """Supervise a process started after `up` came up (`--autoscale`), ready now."""
        self.watched.append(Watched(child, started_s=self.clock()))

    def unwatch(self, child: Child) -> None:
        """Stop supervising a process that is being stopped on purpose (`--autoscale`)."""
        self.watched = [w for w in self.watched if w.child is not child]

    def state_of(self, child: Child) -> State | None:
        """The process's state; None when it is not supervised (not started by `up`, or
        stopped on purpose)."""
        return next((w.state for w in self.watched if w.child is child), None)

    def states(self) -> dict[str, str]:
        return {w.child.name: w.state.value for w in self.watched}


def _where(info: dict[str, Any]) -> str:
    """Where a ready process listens: a worker's `address`, the router's HTTP host:port."""
    if "address" in info:
        return str(info["address"])
    return f"{info.get('host', '')}:{info.get('port', '')}"


def respawn_args(child_args: list[str], info: dict[str, object], role: str) -> list[str]:
    """The arguments of a restarted process: the same, pinned to the ports it had (click takes
    an option's last value), before any `--` (engine arguments). A worker keeps its stream-link
    and health ports too: the router dials the link port it learnt, so a moved one would fail
    its requests until the next load report names the new one."""
    pins: list[str] = []
    if role == "router":
        pins = ["--port", str(info["port"]), "--grpc-port", str(info["grpc_port"])]
    else:
        pins = ["--port", str(info["port"])]
        for key in ("metrics_port", "link_port", "health_port"):
            if info.get(key):
                pins += [f"--{key.replace('_', '-')}", str(info[key])]
    cut = child_args.index("--") if "--" in child_args else len(child_args)
    return [*child_args[:cut], *pins, *child_args[cut:]]


def on_exit_option() -> Callable[[Callable[..., object]], Callable[..., object]]:
    return click.option(
        "--on-exit",
        type=click.Choice(POLICIES),
        default="restart",
        show_default=True,
        help="When a worker or the router exits on its own: restart it (same ports, back-off; "
        "marked down after repeated crashes), mark it down and keep serving, or stop the stack.",
    )
