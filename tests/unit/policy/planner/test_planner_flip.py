"""Role assignment and flips: literal cases plus the module's invariants under hypothesis."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from splitserve.core.roles import Role
from splitserve.policy.planner.flip import (
    FlipParams,
    FlipPlan,
    FlipProgress,
    Step,
    WorkerObs,
    counts,
    plan,
    roles_to_probe,
    serving,
)

P, D, M = Role.PREFILL, Role.DECODE, Role.MIXED
PD = frozenset({P, D})


def make_worker(
    name: str,
    role: Role | None = None,
    *,
    allowed: frozenset[Role] = PD,
    ready: bool = True,
    flip: FlipProgress | None = None,
    fenced: bool = False,
) -> WorkerObs:
    return WorkerObs(name=name, allowed=allowed, role=role, ready=ready, flip=flip, fenced=fenced)


def test_progress_round_trips_and_advances() -> None:
    p = FlipProgress.start(P, D)
    assert p.step is Step.FENCE
    assert FlipProgress.decode(p.encode()) == p
    seen = []
    cur: FlipProgress | None = p
    while cur is not None:
        seen.append(cur.step)
        cur = cur.advanced()
    assert seen == [Step.FENCE, Step.DRAIN, Step.SET_ROLE, Step.RELABEL, Step.UNFENCE]
    assert FlipProgress.start(None, D).step is Step.SET_ROLE
    assert FlipProgress.decode(FlipProgress.start(None, D).encode()) == FlipProgress.start(None, D)


@pytest.mark.parametrize(
    "text", [None, "", "x", "fence:prefill", "jump:prefill:decode", "fence:p:d"]
)
def test_unreadable_progress_is_none(text: str | None) -> None:
    assert FlipProgress.decode(text) is None


def test_new_workers_are_assigned_to_the_largest_deficit() -> None:
    workers = [make_worker("a"), make_worker("b"), make_worker("c", D)]
    result = plan(workers, {P: 1, D: 2})
    assert dict(result.steps) == {
        "a": FlipProgress(Step.SET_ROLE, None, P),
        "b": FlipProgress(Step.SET_ROLE, None, D),
    }
    assert result.started == ("a", "b")


def test_unready_workers_wait() -> None:
    assert plan([make_worker("a", ready=False)], {D: 1}).steps == ()


def test_surplus_flips_to_deficit() -> None:
    workers = [make_worker("a", P), make_worker("b", P), make_worker("c", D)]
    result = plan(workers, {P: 1, D: 2})
    assert result.steps == (("a", FlipProgress(Step.FENCE, P, D)),)
    assert "flip a prefill -> decode" in result.reasons


def test_flip_respects_allowed_roles() -> None:
    workers = [
        make_worker("a", P, allowed=frozenset({P})),
        make_worker("b", P),
        make_worker("c", D),
    ]
    assert plan(workers, {P: 1, D: 2}).steps == (("b", FlipProgress(Step.FENCE, P, D)),)


def test_in_progress_flips_continue_and_use_the_budget() -> None:
    flipping = FlipProgress(Step.DRAIN, P, D)
    workers = [
        make_worker("a", P, flip=flipping, fenced=True),
        make_worker("b", P),
        make_worker("c", P),
    ]
    result = plan(workers, {P: 1, D: 2}, params=FlipParams(max_concurrent=1))
    assert result.steps == (("a", flipping),)
    result = plan(workers, {P: 1, D: 2}, params=FlipParams(max_concurrent=2))
    assert result.steps == (("a", flipping), ("b", FlipProgress(Step.FENCE, P, D)))


def test_never_takes_the_last_worker_of_a_role_with_queued_work() -> None:
    workers = [make_worker("a", P), make_worker("b", D)]
    result = plan(workers, {P: 0, D: 2}, queued={P: 3, D: 0})
    assert result.steps == ()
    assert any("hold a" in r for r in result.reasons)
    # Once the queue is empty the move goes ahead.
    assert plan(workers, {P: 0, D: 2}, queued={P: 0}).steps == (("a", FlipProgress.start(P, D)),)
    # Unknown queue: keep it too.
    assert plan(workers, {P: 0, D: 2}).steps == ()
    assert plan(workers, {P: 0, D: 2}, queued={D: 0}).steps == ()
    # A pool that wants workers keeps its last one, whatever the queue.
    assert plan(workers, {P: 1, D: 2}, queued={P: 0}).steps == ()


def test_roles_to_probe_are_last_workers_of_empty_pools() -> None:
    workers = [make_worker("a", P), make_worker("b", D), make_worker("c", D)]
    assert roles_to_probe(workers, {P: 0, D: 3}) == {P: "a"}
    assert roles_to_probe(workers, {P: 1, D: 0}) == {}


def test_disabled_flipping_still_assigns() -> None:
    workers = [make_worker("a", P), make_worker("b", P), make_worker("n")]
    result = plan(workers, {P: 1, D: 2}, params=FlipParams(enabled=False))
    assert result.steps == (("n", FlipProgress.start(None, D)),)


def test_surplus_names_workers_beyond_their_pool() -> None:
    workers = [make_worker("a", D), make_worker("b", D), make_worker("c", D)]
    assert plan(workers, {D: 2}).surplus == ("c",)


# ---------------------------------------------------------------------------------------------
# Properties

roles = st.sampled_from(list(Role))
allowed_sets = st.frozensets(roles, min_size=1)


@st.composite
def workers_st(draw: st.DrawFn) -> list[WorkerObs]:
    n = draw(st.integers(0, 8))
    out = []
    for i in range(n):
        allowed = draw(allowed_sets)
        role = draw(st.one_of(st.none(), st.sampled_from(sorted(allowed))))
        flip = None
        if role is not None and draw(st.booleans()) and len(allowed) > 1:
            target = draw(st.sampled_from(sorted(allowed - {role})))
            flip = FlipProgress(draw(st.sampled_from(list(Step))), role, target)
        out.append(
            make_worker(
                f"w{i}",
                role,
                allowed=allowed,
                ready=draw(st.booleans()),
                flip=flip,
                fenced=flip is not None and flip.step is not Step.FENCE,
            )
        )
    return out


desired_st = st.fixed_dictionaries({r: st.integers(0, 5) for r in Role})
queued_st = st.one_of(st.none(), st.fixed_dictionaries({r: st.integers(0, 3) for r in Role}))


def started_flips(result: FlipPlan) -> list[tuple[str, FlipProgress]]:
    return [(n, p) for n, p in result.steps if n in result.started and p.source is not None]


@settings(max_examples=300, deadline=None)
@given(workers_st(), desired_st, queued_st, st.integers(1, 3))
def test_invariants(
    workers: list[WorkerObs], desired: Mapping[Role, int], queued: Mapping[Role, int] | None, k: int
) -> None:
    result = plan(workers, desired, queued, FlipParams(max_concurrent=k))
    by_name = {w.name: w for w in workers}
    # every in-progress flip continues from its recorded step
    for w in workers:
        if w.flip is not None:
            assert (w.name, w.flip) in result.steps
    # only allowed targets
    for name, progress in result.steps:
        assert progress.target in by_name[name].allowed
    # concurrency
    before = sum(1 for w in workers if w.flip is not None and w.flip.source is not None)
    after = before + len(started_flips(result))
    assert after <= max(k, before)
    # never strand a role with queued work
    live = serving(workers)
    for role in Role:
        taken = sum(1 for _, p in started_flips(result) if p.source is role)
        busy = desired[role] > 0 or queued is None or queued[role] > 0
        if busy and live[role] >= 1:
            assert live[role] - taken >= 1, (role, result)
    # deterministic, whatever the input order
    shuffled = list(workers)
    random.Random(0).shuffle(shuffled)
    assert plan(shuffled, desired, queued, FlipParams(max_concurrent=k)) == result


def apply(workers: Sequence[WorkerObs], result: FlipPlan) -> list[WorkerObs]:
    """What the operator does with a plan: perform each step, record the next one."""
    steps = dict(result.steps)
    out = []
    for w in workers:
        p = steps.get(w.name)
        if p is not None:
            if p.step is Step.FENCE:
                w = replace(w, fenced=True)
            elif p.step is Step.RELABEL:
                w = replace(w, role=p.target)
            elif p.step is Step.UNFENCE:
                w = replace(w, fenced=False)
            w = replace(w, flip=p.advanced())
        out.append(w)
    return out


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.one_of(st.none(), roles), min_size=1, max_size=8),
    st.data(),
)
def test_converges_to_the_desired_split(initial: list[Role | None], data: st.DataObject) -> None:
    """All roles allowed and enough workers: every pool reaches its size; nothing stays fenced."""
    n = len(initial)
    p = data.draw(st.integers(0, n))
    d = data.draw(st.integers(0, n - p))
    desired = {P: p, D: d, M: n - p - d}
    workers = [make_worker(f"w{i}", r, allowed=frozenset(Role)) for i, r in enumerate(initial)]
    for _ in range(10 * n + 10):
        result = plan(workers, desired, dict.fromkeys(Role, 0))
        if not result.steps:
            break
        workers = apply(workers, result)
    assert counts(workers) == desired
    assert all(w.flip is None and not w.fenced for w in workers)
    assert serving(workers) == desired


def test_a_flip_into_a_role_the_group_no_longer_allows_is_abandoned() -> None:
    """The group's roles were edited (or the target's pool removed) mid-flip: the flip is given
    up, not carried into a role the group does not allow; the worker counts toward its label's
    role again. A flip with only its unfence left finishes (the worker already has the role)."""
    draining = FlipProgress(Step.DRAIN, P, D)
    workers = [
        make_worker("a", P, allowed=frozenset({P}), flip=draining, fenced=True),
        make_worker("b", P, allowed=frozenset({P})),
    ]
    result = plan(workers, {P: 2}, params=FlipParams(max_concurrent=1))
    assert result.steps == ()
    assert [n for n, _ in result.abandon] == ["a"]
    assert "no longer allows decode" in result.abandon[0][1]
    assert result.surplus == ()  # "a" counts as prefill again
    finishing = FlipProgress(Step.UNFENCE, P, D)
    workers = [make_worker("a", D, allowed=frozenset({P}), flip=finishing, fenced=True)]
    result = plan(workers, {P: 1}, params=FlipParams(max_concurrent=1))
    assert result.steps == (("a", finishing),)
    assert result.abandon == ()
