"""The flipper: move workers between roles before scaling out (TetriInfer §3.5, Splitwise §4.3).

Given the autoscaler's decision for a tick, when one role wants more workers (it scales up, or is
under SLO / queue pressure) and another role has *headroom* (it could give workers away now
without breaking its own scale-down rule: stabilization window, hysteresis, no pressure), move up
to `max_concurrent` (less the flips already in progress) workers from the second to the first
instead of starting new ones. A flip is faster and cheaper than a cold start: the weights are
loaded already (`fence → drain → SetRole → relabel → unfence`, `policy.planner.flip`).

The result is a new `Decision` whose desired sizes, applied by the existing flip machine, produce
the flips: the donor pool shrinks by `k`, the receiving pool still grows by what it wanted, and
the worker group grows only by the part no flip covered.

Rules:
- only between roles one worker group may take both of (`flippable` pairs);
- never below the donor's `minReplicas`;
- never takes the last worker of a role with queued work, or whose queue is unknown;
- the emptiest workers of the donor go first (`drain_order`).

Pure.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from splitserve.core.roles import Role
from splitserve.policy.planner.autoscaler import Decision, Kind, PoolDecision
from splitserve.policy.planner.signals import Observation, PoolSignal


@dataclass(frozen=True, slots=True)
class FlipDecision:
    source: Role
    target: Role
    count: int
    workers: tuple[str, ...]
    """The donor's workers to flip, emptiest first (may be shorter than `count` when the donor's
    workers did not report load: the actuator then picks)."""
    reason: str


def drain_order(pool: PoolSignal) -> tuple[str, ...]:
    """The pool's workers, emptiest first (consolidation-aware scale-down): fewest requests,
    then least KV, then name."""
    return tuple(
        w.name for w in sorted(pool.workers, key=lambda w: (w.work, w.kv_used or 0.0, w.name))
    )


def plan_flips(
    decision: Decision,
    obs: Observation,
    flippable: Iterable[tuple[Role, Role]],
    max_concurrent: int,
    in_flight: int = 0,
    enabled: bool = True,
) -> tuple[Decision, tuple[FlipDecision, ...]]:
    """Turn part of the scale-ups into flips. Returns the edited decision and the flips."""
    if not enabled or decision.held:
        return decision, ()
    pairs = {(a, b) for a, b in flippable if a is not b}
    budget = max(0, max_concurrent - in_flight)
    pools = dict(decision.pools)
    flips: list[FlipDecision] = []
    # Receivers: largest shortfall first; donors: most headroom first; role order breaks ties.
    order = list(Role)
    receivers = sorted(
        (p for p in pools.values() if p.desired > p.current),
        key=lambda p: (-(p.desired - p.current), order.index(p.role)),
    )
    for recv in receivers:
        want = recv.desired - recv.current
        donors = sorted(
            (p for p in pools.values() if (p.role, recv.role) in pairs and p.role is not recv.role),
            key=lambda p: (-p.headroom, order.index(p.role)),
        )
        for donor in donors:
            if budget <= 0 or want <= 0:
                break
            k = min(want, budget, _giveable(donor, obs.pools.get(donor.role)))
            if k <= 0:
                continue
            sig = obs.pools.get(donor.role)
            names = drain_order(sig)[:k] if sig is not None else ()
            reason = (
                f"flip {k} {donor.role.value} -> {recv.role.value}: "
                f"{recv.role.value} needs {want} more ({recv.pressure or recv.reason}); "
                f"{donor.role.value} has headroom {donor.headroom} "
                f"(stabilized need {donor.down_target} of {donor.current})"
            )
            flips.append(FlipDecision(donor.role, recv.role, k, names, reason))
            donor = replace(donor, desired=donor.current - k, kind=Kind.FLIP, reason=reason)
            pools[donor.role] = donor
            recv = replace(recv, kind=Kind.FLIP, reason=reason)
            pools[recv.role] = recv
            budget -= k
            want -= k
    return replace(decision, pools=pools), tuple(flips)


def _giveable(donor: PoolDecision, sig: PoolSignal | None) -> int:
    n = donor.headroom
    floor = sig.min_replicas if sig is not None else 0
    n = min(n, donor.current - floor)
    if sig is not None and donor.current - n <= 0:
        queued = sig.queued
        if queued is None or queued > 0 or (sig.running or 0) > 0:
            n = donor.current - 1  # keep the last worker: queued (or unknown) work needs it
    return max(0, n)
