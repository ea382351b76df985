"""Role assignment and the flip state machine: which worker takes which role, and how it moves.

Roles are per-worker run-time settings. Pools say how many workers each role wants; this module
decides, from a frozen observation of the workers, which unassigned worker takes which role and
which worker moves from a role with too many workers to one with too few. A move (a *flip*) is a
resumable sequence of idempotent steps whose progress lives on the worker itself (a pod
annotation, `FlipProgress.encode()`), so an operator that restarts mid-flip picks up where the
last one stopped:

    fence     the router stops sending new work (pod label `splitserve.io/fenced=true`)
    drain     the worker finishes its in-flight work (gRPC Drain; repeated until idle)
    set-role  the worker switches role (gRPC SetRole; no restart)
    relabel   the pod's role label follows (pools and the router see the new role)
    unfence   the worker re-opens (Drain resume) and the fence label and progress are removed

A worker with no role yet is *assigned*: it starts at set-role (the router ignores workers
without a role label, so there is nothing to fence or drain).

Invariants (property-tested in tests/unit/policy/planner):
- a flip never takes the last serving worker of a role whose pool wants workers, or that has
  queued work, or whose queue is unknown (the caller passes queue lengths for the roles where it
  matters: one serving worker left, pool at zero);
- at most `max_concurrent` flips are in progress after planning (assignments are not flips);
- a worker only ever moves into a role its group allows;
- every in-progress flip is continued (from its recorded step) before any new one is started,
  except one whose target its group no longer allows (spec edited, pool removed): that one is
  abandoned (`FlipPlan.abandon`) unless only its unfence is left (the worker already has the
  role; it then finishes and a later plan moves it);
- planning is deterministic: the same observation gives the same plan.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Final

from splitserve.core.roles import Role


class Step(StrEnum):
    FENCE = "fence"
    DRAIN = "drain"
    SET_ROLE = "set-role"
    RELABEL = "relabel"
    UNFENCE = "unfence"


NEXT_STEP: Final[Mapping[Step, Step | None]] = {
    Step.FENCE: Step.DRAIN,
    Step.DRAIN: Step.SET_ROLE,
    Step.SET_ROLE: Step.RELABEL,
    Step.RELABEL: Step.UNFENCE,
    Step.UNFENCE: None,
}


@dataclass(frozen=True, slots=True)
class FlipProgress:
    """A flip in progress: the step to perform next, and the move."""

    step: Step
    source: Role | None
    """The role the worker leaves (None: an assignment of a new worker)."""
    target: Role

    def encode(self) -> str:
        return f"{self.step.value}:{self.source.value if self.source else ''}:{self.target.value}"

    @classmethod
    def decode(cls, text: str | None) -> FlipProgress | None:
        """Parse an annotation; None when absent or unreadable (the flip is then abandoned)."""
        if not text:
            return None
        parts = text.split(":")
        if len(parts) != 3:
            return None
        try:
            source = Role(parts[1]) if parts[1] else None
            return cls(Step(parts[0]), source, Role(parts[2]))
        except ValueError:
            return None

    def advanced(self) -> FlipProgress | None:
        """Progress after the current step succeeded; None when the flip is complete."""
        nxt = NEXT_STEP[self.step]
        return None if nxt is None else FlipProgress(nxt, self.source, self.target)

    @classmethod
    def start(cls, source: Role | None, target: Role) -> FlipProgress:
        return cls(Step.FENCE if source is not None else Step.SET_ROLE, source, target)


@dataclass(frozen=True, slots=True)
class WorkerObs:
    """One worker (pod) as the operator sees it."""

    name: str
    allowed: frozenset[Role]
    """Roles the worker's group may take."""
    role: Role | None = None
    """Its role label (None: not assigned yet)."""
    ready: bool = True
    """Running, ready and reachable (has an address)."""
    fenced: bool = False
    flip: FlipProgress | None = None
    scale_down_first: bool = False
    """The control loop found it emptiest when it shrank its pool: surplus before the others."""

    @property
    def serving(self) -> Role | None:
        """The role it serves right now: labelled, ready, not fenced and not being flipped."""
        if self.role is None or not self.ready or self.fenced or self.flip is not None:
            return None
        return self.role

    @property
    def counts_as(self) -> Role | None:
        """The role it counts toward for pool sizes: the flip's target, else its label."""
        return self.flip.target if self.flip is not None else self.role


@dataclass(frozen=True, slots=True)
class FlipParams:
    enabled: bool = True
    """Start flips (assignments of new workers happen regardless)."""
    max_concurrent: int = 1


@dataclass(frozen=True, slots=True)
class FlipPlan:
    steps: tuple[tuple[str, FlipProgress], ...] = ()
    """(worker, progress): perform `progress.step` on the worker; continued and new flips alike."""
    started: tuple[str, ...] = ()
    """Workers whose flip or assignment starts in this plan."""
    surplus: tuple[str, ...] = ()
    """Workers the pools do not need: delete these first when a Deployment shrinks."""
    reasons: tuple[str, ...] = field(default=())
    """One line per decision (and per flip that was held back), for status and logs."""
    abandon: tuple[tuple[str, str], ...] = ()
    """(worker, why): in-progress flips to give up (the worker keeps its role label, is
    re-opened and unfenced)."""


def counts(workers: Sequence[WorkerObs]) -> dict[Role, int]:
    """Workers per role, counting flips toward their target."""
    out = dict.fromkeys(Role, 0)
    for w in workers:
        if w.counts_as is not None:
            out[w.counts_as] += 1
    return out


def serving(workers: Sequence[WorkerObs]) -> dict[Role, int]:
    out = dict.fromkeys(Role, 0)
    for w in workers:
        if w.serving is not None:
            out[w.serving] += 1
    return out


def plan(
    workers: Sequence[WorkerObs],
    desired: Mapping[Role, int],
    queued: Mapping[Role, int] | None = None,
    params: FlipParams | None = None,
) -> FlipPlan:
    """Decide this tick's steps.

    `queued`: requests waiting or running per role, where known (a missing role is unknown).
    """
    params = params or FlipParams()
    ordered = sorted(workers, key=lambda w: w.name)
    want = {r: max(0, desired.get(r, 0)) for r in Role}
    steps: list[tuple[str, FlipProgress]] = []
    started: list[str] = []
    reasons: list[str] = []

    # 1. Continue every flip in progress from its recorded step; give up one whose target the
    # group no longer allows (it counts toward its label's role again).
    in_flight = 0
    abandon: list[tuple[str, str]] = []
    for i, w in enumerate(ordered):
        if w.flip is None:
            continue
        if w.flip.target not in w.allowed and w.flip.step is not Step.UNFENCE:
            source = w.flip.source.value if w.flip.source else "(none)"
            abandon.append(
                (
                    w.name,
                    f"abandon {w.name}: flip {source} -> {w.flip.target.value} given up at "
                    f"{w.flip.step.value}: its group no longer allows {w.flip.target.value}",
                )
            )
            ordered[i] = replace(w, flip=None)
            continue
        steps.append((w.name, w.flip))
        if w.flip.source is not None:
            in_flight += 1
    have = counts(ordered)
    live = serving(ordered)

    # 2. Assign workers that have no role yet: to the allowed role short of the most workers.
    for w in ordered:
        if w.role is not None or w.flip is not None or not w.ready or not w.allowed:
            continue
        target = min(w.allowed, key=lambda r: (have[r] - want[r], _order(r)))
        progress = FlipProgress.start(None, target)
        steps.append((w.name, progress))
        started.append(w.name)
        have[target] += 1
        reasons.append(f"assign {w.name} to {target.value}")

    # 3. Flip workers from roles with a surplus to roles with a deficit.
    def must_keep(role: Role) -> bool:
        if live[role] > 1:
            return False
        if want[role] > 0:
            return True
        return queued is None or role not in queued or queued[role] > 0

    budget = params.max_concurrent - in_flight if params.enabled else 0
    while budget > 0:
        deficits = sorted(
            (r for r in Role if have[r] < want[r]), key=lambda r: (have[r] - want[r], _order(r))
        )
        move = None
        for target in deficits:
            candidates = [
                w
                for w in ordered
                if w.serving is not None
                and w.name not in started
                and w.role != target
                and target in w.allowed
                and w.role is not None
                and have[w.role] > want[w.role]
            ]
            # Take from the role with the largest surplus, the emptiest (marked by the control
            # loop) first; name order breaks ties.
            candidates.sort(
                key=lambda w: (-_surplus(w, have, want), not w.scale_down_first, w.name)
            )
            for w in candidates:
                assert w.role is not None
                if must_keep(w.role):
                    reasons.append(
                        f"hold {w.name}: {w.role.value} would have no serving worker "
                        "while its pool wants workers or it has (or may have) queued work"
                    )
                    continue
                move = (w, target)
                break
            if move:
                break
        if move is None:
            break
        w, target = move
        assert w.role is not None
        steps.append((w.name, FlipProgress.start(w.role, target)))
        started.append(w.name)
        have[w.role] -= 1
        have[target] += 1
        live[w.role] -= 1
        budget -= 1
        reasons.append(f"flip {w.name} {w.role.value} -> {target.value}")

    # 4. Workers beyond what their role wants: the ones the control loop found emptiest first,
    # then the last names. Delete these first.
    surplus: list[str] = []
    over = {r: have[r] - want[r] for r in Role}
    newest_first = ordered[::-1]
    for w in sorted(newest_first, key=lambda w: not w.scale_down_first):
        r = w.counts_as
        if r is not None and w.flip is None and w.name not in started and over[r] > 0:
            surplus.append(w.name)
            over[r] -= 1
    unique_reasons = tuple(dict.fromkeys(reasons))
    return FlipPlan(
        tuple(steps), tuple(started), tuple(sorted(surplus)), unique_reasons, tuple(abandon)
    )


def roles_to_probe(workers: Sequence[WorkerObs], desired: Mapping[Role, int]) -> dict[Role, str]:
    """{role: its one serving worker} for pools at zero: flipping that worker needs its queue."""
    live = serving(workers)
    out: dict[Role, str] = {}
    for w in sorted(workers, key=lambda w: w.name):
        r = w.serving
        if r is not None and live[r] == 1 and desired.get(r, 0) <= 0:
            out[r] = w.name
    return out


def _order(role: Role) -> int:
    return list(Role).index(role)


def _surplus(w: WorkerObs, have: Mapping[Role, int], want: Mapping[Role, int]) -> int:
    return 0 if w.role is None else have[w.role] - want[w.role]
