"""The control loop over local worker processes (for `splitserve up --autoscale`).

The same observe -> decide -> flip -> act loop as the operator (`operator.control`), over a
`Fleet`: anything that can list its workers, start a worker of a role, stop one (draining it
first) and change one's role (drain, SetRole, resume). `splitserve up`'s process supervisor
provides the real one; tests pass a fake. Signals: the local router's `/metrics` (the same
`Window` as the operator) and each worker's load report.

`ProcessFleet` is the real fleet: worker processes of `splitserve up`'s `Stack`, published to
the router through a workers file (`router.discovery.FileDiscovery`; the router acknowledges each
version it applied). Stopping a worker: fence it in the file, wait for the router's
acknowledgement, `Drain` (wait until nothing is in flight, KV held for a pull included), drop it
from the file, wait again, then SIGTERM. A flip: fence, drain, `SetRole`, resume, unfence.
`AutoscaleThread` runs the loop beside `up`'s supervisor (a drain blocks only this thread).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import CancelledError, Future
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit

from splitserve.core.roles import Role
from splitserve.operator.control.loop import GrpcLoadProbe, LoadProbe, held_key, http_get
from splitserve.operator.control.signals import ClassTargets, Snapshot, Window, parse
from splitserve.policy.planner.aladdin import AladdinPerfModel
from splitserve.policy.planner.autoscaler import (
    AutoscalerParams,
    AutoscalerState,
    Decision,
    Kind,
    decide,
    live_params,
)
from splitserve.policy.planner.flipper import FlipDecision, drain_order, plan_flips
from splitserve.policy.planner.signals import PoolSignal, SignalProblem, SignalState, WorkerLoad

if TYPE_CHECKING:
    from splitserve.cli.supervise import Supervisor
    from splitserve.cli.up import Child, Stack

log = logging.getLogger(__name__)

ROLES = (Role.PREFILL, Role.DECODE)


@dataclass(frozen=True, slots=True)
class LocalWorker:
    name: str
    role: Role
    address: str
    """host:port of its gRPC service."""
    ready: bool = True


class Fleet(Protocol):
    def workers(self) -> Sequence[LocalWorker]: ...

    def start(self, role: Role) -> str:
        """Start a worker of `role`; returns its name (it shows in `workers()`, not ready yet)."""
        ...

    def stop(self, name: str) -> None:
        """Drain the worker, then stop its process."""
        ...

    def set_role(self, name: str, role: Role) -> None:
        """Drain, SetRole, resume."""
        ...


@dataclass
class LocalLoop:
    fleet: Fleet
    router_metrics_url: str
    classes: Sequence[ClassTargets]
    params: AutoscalerParams = field(default_factory=AutoscalerParams)
    min_replicas: int = 1
    max_replicas: int = 8
    window_s: float = 30.0
    max_concurrent_flips: int = 1
    get: Callable[[str], str] = http_get
    loads: LoadProbe = field(default_factory=GrpcLoadProbe)
    clock: Callable[[], float] = time.monotonic
    perf: AladdinPerfModel = field(default_factory=AladdinPerfModel)
    state: AutoscalerState = field(default_factory=AutoscalerState)
    log: list[str] = field(default_factory=list)
    last_held: str = ""
    """Which signals were missing or stale at the last hold (`held_key`; "": no hold)."""
    last_kept: dict[Role, str] = field(default_factory=dict)
    """Per pool, the last printed hold under pressure, its numbers masked (`_kept_key`)."""
    last_unstoppable: dict[Role, str] = field(default_factory=dict)
    """Per pool, the last printed scale-down that found no worker to stop (`_kept_key`)."""

    def __post_init__(self) -> None:
        self.window = Window(self.window_s, max_age_s=2 * self.params.interval_s + 5)

    def tick(self) -> tuple[Decision, tuple[FlipDecision, ...]]:
        now = self.clock()
        # Keyed by the router's address, as the operator keys its router pods: a problem then
        # reads "router 127.0.0.1:8000 missing: ..." (not "router router").
        addr = urlsplit(self.router_metrics_url).netloc or self.router_metrics_url
        try:
            snap = Snapshot(now, {addr: parse(self.get(self.router_metrics_url))})
        except (OSError, ValueError) as err:
            snap = Snapshot(now, {}, {addr: f"scrape failed: {err}"})
        self.window.add(snap)
        workers = list(self.fleet.workers())
        loads: dict[Role, list[WorkerLoad]] = {r: [] for r in ROLES}
        problems: list[SignalProblem] = []
        for w in workers:
            if not w.ready or w.role not in loads:
                continue
            try:
                rep = self.loads.load(w.address)
            except Exception:  # the worker is unknown, not idle
                continue
            loads[w.role].append(WorkerLoad(w.name, w.role, rep.queued, rep.running, rep.kv_used))
        ready = [w for w in workers if w.ready]
        if ready and not any(loads.values()):
            problems.append(SignalProblem("worker load", SignalState.MISSING, "no worker answered"))
        pools = {
            r: PoolSignal(
                r,
                sum(1 for w in workers if w.role is r),
                sum(1 for w in ready if w.role is r),
                self.min_replicas,
                self.max_replicas,
                tuple(loads[r]),
            )
            for r in ROLES
        }
        obs = self.window.observe(now, self.classes, pools, problems)
        decision, self.state = decide(obs, self.state, self.perf, self.params)
        # A hold is logged as the operator writes it to status.decisions: once when the set of
        # missing / stale signals changes, not every tick (an idle or unreachable router would
        # print one line per interval otherwise).
        key = held_key(obs) if decision.held else ""
        if key and key != self.last_held:
            self.log.append(f"hold: no action: {decision.held}")
        self.last_held = key
        decision, flips = plan_flips(
            decision,
            obs,
            [(Role.PREFILL, Role.DECODE), (Role.DECODE, Role.PREFILL)],
            self.max_concurrent_flips,
        )
        self._log_kept(decision, flips)
        self._act(decision, flips, pools)
        return decision, flips

    def _log_kept(self, decision: Decision, flips: Sequence[FlipDecision]) -> None:
        """A pool kept at its size although under pressure (at max, waiting for started
        workers or for their effect) is logged once per kind of reason, not every tick: the
        reason's numbers (ages, queue lengths) change while the situation does not."""
        flipped = {r for f in flips for r in (f.source, f.target)}
        for role, p in decision.pools.items():
            kept = p.kind is Kind.HOLD and bool(p.pressure) and role not in flipped
            key = _kept_key(p.reason) if kept else ""
            if key and key != self.last_kept.get(role, ""):
                self.log.append(f"hold: {p.reason}")
            self.last_kept[role] = key

    def _act(
        self,
        decision: Decision,
        flips: Sequence[FlipDecision],
        pools: dict[Role, PoolSignal],
    ) -> None:
        if decision.held:
            # Signals missing or stale: no sizing, no flips; only a pool outside its min / max
            # is brought back (a worker marked down leaves its pool below the minimum, and no
            # request can finish while it is empty, so no signal would ever come).
            bounds = [p for p in decision.pools.values() if p.kind is Kind.BOUNDS]
            if not bounds:
                return
            decision, flips = replace(decision, pools={p.role: p for p in bounds}), ()
        have = {r: p.current for r, p in pools.items()}
        for f in flips:
            names = list(f.workers) or list(drain_order(pools[f.source]))
            for name in names[: f.count]:
                self.fleet.set_role(name, f.target)
                self.log.append(f"flip {name} {f.source.value} -> {f.target.value}: {f.reason}")
            have[f.source] -= f.count
            have[f.target] += f.count
        # One line per pool and action: the reason is the pool's, not each worker's.
        for role, p in decision.pools.items():
            delta = p.desired - have[role]
            started = [self.fleet.start(role) for _ in range(max(0, delta))]
            if started:
                self.log.append(f"start {', '.join(started)} as {role.value}: {p.reason}")
            if delta < 0:
                self._stop(pools[role], -delta, p.reason)
            else:
                self.last_unstoppable[role] = ""

    def _stop(self, pool: PoolSignal, count: int, reason: str) -> None:
        """Stop `count` of the pool's workers, emptiest first. Only workers that reported their
        load can be picked: when none did (starting, or not answering), the line says so once
        per kind of reason (was "stop : <reason>" on every tick); when fewer than `count` did,
        it says how many of them were stopped."""
        stopped = drain_order(pool)[:count]
        for name in stopped:
            self.fleet.stop(name)
        silent = pool.current - len(pool.workers)
        if not stopped:
            key = _kept_key(reason)
            if key != self.last_unstoppable.get(pool.role, ""):
                self.log.append(
                    f"stop: no {pool.role.value} worker to stop ({silent} not reporting their "
                    f"load: starting or not answering): {reason}"
                )
            self.last_unstoppable[pool.role] = key
            return
        self.last_unstoppable[pool.role] = ""
        part = (
            ""
            if len(stopped) == count
            else f" ({len(stopped)} of {count}: {silent} not reporting their load)"
        )
        self.log.append(f"stop {', '.join(stopped)}{part}: {reason}")


# ---------------------------------------------------------------------------------------------
# the real fleet: `splitserve up`'s worker processes


class FleetError(Exception):
    """A fleet action did not complete (the loop logs it and tries again on a later tick)."""


@dataclass
class _Member:
    child: Child
    role: Role
    serving: bool
    fenced: bool = False


class ProcessFleet:
    """`Fleet` over `splitserve up`'s worker processes and the router's workers file.

    `lock` guards the stack's and the supervisor's lists: `up`'s main loop holds it around
    `poll()` and `Supervisor.tick()`; the fleet holds it only while changing them, never while
    it waits for a drain.

    Worker processes are started in the thread that made the fleet (`up`'s main thread, at its
    next `poll()`), not in the loop's: a child asks the kernel for SIGTERM when its parent
    *thread* ends (`process.die_with_parent`), so workers the loop's thread started were
    terminated the moment `up` stopped that thread on Ctrl-C, before the router had drained
    the requests running on them (and whenever that thread died).
    """

    def __init__(
        self,
        stack: Stack,
        supervisor: Supervisor,
        workers_file: Path,
        spawn: Callable[[str, Role], Child],
        echo: Callable[[str], None],
        *,
        ack_timeout_s: float = 10.0,
        drain_timeout_s: float = 120.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stack = stack
        self.supervisor = supervisor
        self.workers_file = workers_file
        self._spawn = spawn
        self.echo = echo
        self.ack_timeout_s = ack_timeout_s
        self.drain_timeout_s = drain_timeout_s
        self.clock = clock
        self.lock = threading.RLock()
        self._owner = threading.get_ident()
        self._calls: deque[tuple[Callable[[], Child], Future[Child]]] = deque()
        self._calls_lock = threading.Lock()
        self._closed = False
        self.members: dict[str, _Member] = {}
        for child in stack.children:
            role = _role_arg(child.args)
            if role is not None:
                self.members[child.name] = _Member(child, role, serving=True)
        self._next = len(self.members)

    # -- the workers file ------------------------------------------------------------------

    def file_text(self) -> str:
        from splitserve.router.discovery import EndpointState, workers_file_text

        return workers_file_text(
            EndpointState(str(m.child.info["address"]), m.role, True, m.fenced, name)
            for name, m in self.members.items()
            if m.serving
        )

    def publish(self, wait: bool = True) -> None:
        """Write the workers file; with `wait`, until the router says it applied it."""
        from splitserve.router.discovery import applied_path

        text = self.file_text()
        tmp = self.workers_file.with_suffix(".tmp")
        tmp.write_text(text)
        os.replace(tmp, self.workers_file)
        if not wait:
            return
        ack = Path(applied_path(str(self.workers_file)))
        deadline = self.clock() + self.ack_timeout_s
        while self.clock() < deadline:
            try:
                if ack.read_text() == text:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise FleetError(f"the router did not apply {self.workers_file} in {self.ack_timeout_s} s")

    # -- Fleet -----------------------------------------------------------------------------

    def workers(self) -> Sequence[LocalWorker]:
        """Every member; ready: serving and not exited (one the supervisor is restarting
        counts in its pool, not as ready)."""
        from splitserve.cli.supervise import State

        with self.lock:
            return [
                LocalWorker(
                    name,
                    m.role,
                    str(m.child.info.get("address", "")),
                    m.serving and self.supervisor.state_of(m.child) in (State.RUNNING, None),
                )
                for name, m in self.members.items()
            ]

    def start(self, role: Role) -> str:
        with self.lock:
            while f"{role.value}-{self._next}" in self.members:
                self._next += 1
            name = f"{role.value}-{self._next}"
            self._next += 1
        child = self._in_owner_thread(lambda: self._spawn(name, role), name)
        with self.lock:
            self.members[name] = _Member(child, role, serving=False)
        self.echo(f"autoscale: starting {name}")
        return name

    def close(self) -> None:
        """`up` is stopping: no worker starts from here on (a start waiting for the main loop
        is refused, so none is left running after the stack stopped)."""
        with self._calls_lock:
            self._closed = True
            calls, self._calls = list(self._calls), deque()
        for _, future in calls:
            future.cancel()

    def _in_owner_thread(self, spawn: Callable[[], Child], name: str) -> Child:
        """`spawn()` run in the fleet's thread: at once from it, else at its next `poll()`."""
        if threading.get_ident() == self._owner:
            return spawn()
        future: Future[Child] = Future()
        with self._calls_lock:
            if self._closed:
                raise FleetError(f"{name} not started: up is stopping")
            self._calls.append((spawn, future))
        try:
            return future.result(timeout=self.ack_timeout_s)
        except CancelledError:
            raise FleetError(f"{name} not started: up is stopping") from None
        except TimeoutError:
            if future.cancel():
                raise FleetError(
                    f"{name} not started: up's main loop did not start it in "
                    f"{self.ack_timeout_s:g} s"
                ) from None
            return future.result()

    def poll(self) -> None:
        """Workers the loop asked for are started; started workers that became ready join the
        router (and the supervisor); ones that exited before they were ready are dropped.
        Called often by `up`'s main loop, in the thread that made the fleet."""
        from splitserve.cli.supervise import State

        while True:
            with self._calls_lock:
                if not self._calls:
                    break
                spawn, future = self._calls.popleft()
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(spawn())
                except Exception as err:
                    future.set_exception(err)
        with self.lock:
            changed = False
            for name, m in list(self.members.items()):
                if m.serving:
                    if self.supervisor.state_of(m.child) is State.DOWN:
                        # Marked down (`--on-exit down`, or too many quick crashes): out of
                        # the router and of its pool, so the loop sees the pool as it is
                        # (below its minimum, it starts another).
                        del self.members[name]
                        self._forget(m.child)
                        changed = True
                        self.echo(f"autoscale: {name} is down: out of the router and its pool")
                    continue
                code = m.child.exited()
                if code is not None:
                    self.echo(
                        f"autoscale: {name} exited ({code}) before it was ready:\n"
                        f"{m.child.log_tail()}"
                    )
                    del self.members[name]
                    self._forget(m.child)
                    continue
                if m.child.ready_file.exists():
                    m.child.info = json.loads(m.child.ready_file.read_text())
                    m.serving = True
                    self.supervisor.watch(m.child)
                    changed = True
                    self.echo(f"autoscale: {name} is ready ({m.child.info['address']})")
            if changed:
                self.publish(wait=False)

    def stop(self, name: str) -> None:
        m = self.members[name]
        if not m.serving:  # not in the router yet: nothing to drain
            with self.lock:
                del self.members[name]
                self._terminate(m.child)
            self.echo(f"autoscale: {name} stopped before it was ready")
            return
        self._fence_and_drain(name, m)
        with self.lock:
            del self.members[name]
        try:
            self.publish()
        finally:  # fenced and drained: stopped even if the router did not confirm its removal
            with self.lock:
                self._terminate(m.child)
        self.echo(f"autoscale: {name} drained and stopped")

    def set_role(self, name: str, role: Role) -> None:
        from splitserve.operator.workers import GrpcWorkerClient, WorkerCallError

        m = self.members[name]
        address = self._fence_and_drain(name, m)
        client = GrpcWorkerClient()
        try:
            client.set_role(address, role)
            client.resume(address)
        except WorkerCallError as err:
            # Given up as the operator abandons a flip: the worker keeps its role and is
            # unfenced (it was left fenced, out of the router for good, while the loop counted
            # it in its pool). A worker that died meanwhile restarts in its old role.
            with contextlib.suppress(WorkerCallError):
                client.set_role(address, m.role)
                client.resume(address)
            with self.lock:
                m.fenced = False
            self.publish(wait=False)
            raise FleetError(
                f"{name}: flip to {role.value} failed ({err}); it stays {m.role.value}"
            ) from err
        with self.lock:
            old, m.role, m.fenced = m.role, role, False
            _set_role_arg(m.child.args, role)  # a restart keeps the new role
        self.publish()
        self.echo(f"autoscale: {name} flipped {old.value} -> {role.value}")

    # -- internals -------------------------------------------------------------------------

    def _fence_and_drain(self, name: str, m: _Member) -> str:
        from splitserve.operator.workers import GrpcWorkerClient, WorkerCallError

        address = str(m.child.info["address"])
        with self.lock:
            m.fenced = True
        try:
            self.publish()  # the router sends it nothing new from here on
        except FleetError:
            with self.lock:
                m.fenced = False  # not left fenced by an action that did not happen
            self.publish(wait=False)
            raise
        try:
            in_flight = GrpcWorkerClient().drain(address, timeout_s=self.drain_timeout_s)
        except WorkerCallError as err:
            if m.child.exited() is None:
                with self.lock:
                    m.fenced = False
                self.publish(wait=False)
                raise FleetError(f"{name}: drain failed: {err}") from err
            in_flight = 0  # it died meanwhile: nothing left to wait for
        if in_flight:
            self.echo(
                f"autoscale: {name} still had {in_flight} requests in flight after "
                f"{self.drain_timeout_s:g} s of draining; going on"
            )
        return address

    def _terminate(self, child: Child) -> None:
        self._forget(child)
        if child.proc is not None and child.proc.poll() is None:
            child.proc.terminate()
            try:
                child.proc.wait(10)
            except Exception:
                child.proc.kill()
                child.proc.wait()

    def _forget(self, child: Child) -> None:
        if child in self.stack.children:
            self.stack.children.remove(child)
        self.supervisor.unwatch(child)


def _kept_key(reason: str) -> str:
    return re.sub(r"\d+(\.\d+)?", "#", reason)


def _role_arg(args: Sequence[str]) -> Role | None:
    if args[:2] != ["worker", "serve"] or "--role" not in args:
        return None
    return Role(args[args.index("--role") + 1])


def _set_role_arg(args: list[str], role: Role) -> None:
    args[args.index("--role") + 1] = role.value


class AutoscaleThread:
    """Runs `loop.tick()` every `interval_s` in a daemon thread until `stop()`."""

    def __init__(self, loop: LocalLoop, interval_s: float, echo: Callable[[str], None]) -> None:
        self.loop = loop
        self.interval_s = interval_s
        self.echo = echo
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="autoscale", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        self._thread.join(timeout_s)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.run_once()

    def run_once(self) -> None:
        """One tick; its log lines printed (actions, and a hold when its reason changes)."""
        seen = len(self.loop.log)
        try:
            self.loop.tick()
        except Exception as err:  # one failed tick is logged; the next one tries again
            self.echo(f"autoscale: tick failed: {type(err).__name__}: {err}")
        for line in self.loop.log[seen:]:
            self.echo(f"autoscale: {line}")


def sim_perf_model(opts: dict[str, Any], tpot_s: float) -> AladdinPerfModel:
    """The loop's performance model for `up`'s simulated workers: Eq 2/3 fitted to the same
    latency model the workers price their steps with, then stretched by their time scale (every
    step takes `--sim-time-scale` times as long, so every coefficient does)."""
    import dataclasses

    from splitserve.core.perf import HARDWARE, MODELS, RooflineModel, build_latency_model
    from splitserve.policy.planner.aladdin import fit_perf_model

    scale = float(opts["sim_time_scale"]) or 1.0
    name = opts.get("sim_latency_model") or "roofline"
    latency = build_latency_model(name, opts["sim_shape"], opts["sim_hardware"], 1, 1.0)
    roofline = RooflineModel(MODELS[opts["sim_shape"]], HARDWARE[opts["sim_hardware"]], tp=1)
    block_size = 16  # the worker's (worker.runtime.WorkerConfig.block_size)
    blocks = opts.get("sim_kv_blocks") or roofline.kv_capacity_tokens() // block_size
    try:  # fitted where the TPOT target decides; a target no batch comes near: everywhere
        model = fit_perf_model(latency, int(blocks) * block_size, 1, atgt_slo_s=tpot_s / scale)
    except ValueError:
        model = fit_perf_model(latency, int(blocks) * block_size, 1)
    m = model.model
    return dataclasses.replace(
        m, k1=m.k1 * scale, c1=m.c1 * scale, k2=m.k2 * scale, c2=m.c2 * scale, c3=m.c3 * scale
    )


def loop_classes(opts: dict[str, Any]) -> list[ClassTargets]:
    """The classes the loop sizes for: `up`'s SLO options, else the operator's default."""
    from splitserve.api.router import PlacementSettings
    from splitserve.cli.slo_options import slo_settings
    from splitserve.operator.control.loop import class_targets

    slo, _ = slo_settings(
        opts["slo_classes"],
        opts["default_slo_class"],
        opts["slo_config"],
        opts["placement_profile"],
        opts["disaggregation"],
        PlacementSettings(),
    )
    return class_targets(() if slo is None else slo.classes)


def loop_params(opts: dict[str, Any]) -> AutoscalerParams:
    """The operator's policy (`live_params`) from `up`'s `--autoscale-*` options:
    `--autoscale-burst-weight` is its `scaling.burstWeight` (the busiest sub-window comes from
    the router's admission counter, one snapshot per tick, as with the operator's direct
    scrapes)."""
    return live_params(
        float(opts["autoscale_interval_s"]),
        float(opts["autoscale_stabilization_s"]),
        float(opts["autoscale_burst_weight"]),
        float(opts["autoscale_horizon_s"]),
    )


def start_autoscale(
    stack: Stack,
    supervisor: Supervisor,
    opts: dict[str, Any],
    spawn: Callable[[str, Role], Child],
    echo: Callable[[str], None],
) -> tuple[ProcessFleet, AutoscaleThread]:
    """The loop over `up`'s stack (`--autoscale`), started."""
    router = stack.children[-1].info
    fleet = ProcessFleet(stack, supervisor, opts["workers_file"], spawn, echo)
    classes = loop_classes(opts)
    tpots = [c.tpot_s for c in classes if c.tpot_s is not None]
    interval_s = float(opts["autoscale_interval_s"])
    params = loop_params(opts)
    loop = LocalLoop(
        fleet,
        f"http://{router['host']}:{router['port']}/metrics",
        classes,
        params=params,
        min_replicas=opts["autoscale_min"],
        max_replicas=opts["autoscale_max"],
        window_s=float(opts["autoscale_window_s"]),
        perf=sim_perf_model(opts, min(tpots) if tpots else 0.2),
    )
    thread = AutoscaleThread(loop, interval_s, echo)
    thread.start()
    return fleet, thread


AUTOSCALE_OPTIONS = (
    "autoscale_interval_s",
    "autoscale_stabilization_s",
    "autoscale_window_s",
    "autoscale_horizon_s",
    "autoscale_burst_weight",
    "autoscale_min",
    "autoscale_max",
)


def autoscale_usage_error(
    opts: dict[str, Any], given: Callable[[str], bool] = lambda name: False
) -> str | None:
    """Why `--autoscale` cannot run with these options (None: it can). `given(name)`: the user
    set that option (its `--autoscale-*` companions act only with `--autoscale`)."""
    if not opts["autoscale"]:
        named = [f"--{n.replace('_', '-')}" for n in AUTOSCALE_OPTIONS if given(n)]
        verb = "needs" if len(named) == 1 else "need"
        return f"{', '.join(named)} {verb} --autoscale" if named else None
    if opts["engine"] != "sim":
        return (
            "--autoscale runs with --engine sim only: the loop's performance model is fitted "
            "to the simulated engines' latency model (a vLLM profile is not wired in yet)"
        )
    if opts["mixed"]:
        return (
            "--autoscale sizes prefill and decode pools; --mixed workers are not supported "
            "(the local fleet starts, stops and flips prefill / decode workers only, and the "
            "router's workers file has no mixed pool the loop could resize; use --prefill / "
            "--decode, or run --mixed without --autoscale)"
        )
    if opts["autoscale_min"] > opts["autoscale_max"]:
        return "--autoscale-min must be <= --autoscale-max"
    if opts["autoscale_min"] < 1:
        return "--autoscale-min must be >= 1 (a pool of 0 serves nothing)"
    for role in ("prefill", "decode"):  # the starting sizes are the loop's first pools
        n, low, high = opts[role], opts["autoscale_min"], opts["autoscale_max"]
        if not low <= n <= high:
            bound, side = ("--autoscale-max", "above") if n > high else ("--autoscale-min", "below")
            return (
                f"--{role} {n} is {side} {bound} {high if n > high else low}: the loop keeps "
                f"each pool within --autoscale-min..--autoscale-max ({low}..{high}), so it "
                f"would not start with these workers; set --{role} within them or change {bound}"
            )
    return None
