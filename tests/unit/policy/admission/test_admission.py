"""Pure admission policies: deadlines are monotone, the EDF queue pops in rank order and never
sheds a non-sheddable request while a sheddable one is queued, the gate sheds only sheddable
requests on a prediction."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from splitserve.core.errors import ConfigError
from splitserve.policy.admission import (
    AdmissionGate,
    EdfQueue,
    Entry,
    GateParams,
    Outcome,
    SloClassTable,
    SloOverrides,
    SloPolicyClass,
    UnknownSloClass,
    deadlines_for,
    rank_key,
)
from splitserve.policy.admission.classes import BadOverride

times = st.floats(min_value=0, max_value=1e6, allow_nan=False)
targets = st.floats(min_value=1e-3, max_value=1e3, allow_nan=False)


@given(times, times, targets, targets)
def test_deadlines_are_monotone_in_arrival_and_target(
    a1: float, a2: float, t1: float, t2: float
) -> None:
    (a1, a2), (t1, t2) = sorted((a1, a2)), sorted((t1, t2))
    c1 = SloPolicyClass("c", ttft_s=t1, tpot_s=0.1)
    c2 = SloPolicyClass("c", ttft_s=t2, tpot_s=0.1)
    assert deadlines_for(c1, a1).ttft_deadline_s <= deadlines_for(c1, a2).ttft_deadline_s
    assert deadlines_for(c1, a1).ttft_deadline_s <= deadlines_for(c2, a1).ttft_deadline_s
    assert deadlines_for(c1, a1).ttft_deadline_s >= a1


def test_offline_class_uses_its_completion_deadline() -> None:
    c = SloPolicyClass("offline", ttft_s=None, tpot_s=None, job_completion_s=60)
    d = deadlines_for(c, 10.0)
    assert d.ttft_deadline_s == 70.0
    assert d.e2e_deadline_s(100) == 70.0
    assert d.met(1.0, None, 59.0) == (True, True)
    assert d.met(1.0, None, 61.0) == (False, False)


def test_online_deadlines_and_overrides() -> None:
    c = SloPolicyClass("i", ttft_s=0.5, tpot_s=0.05, allow_overrides=True)
    d = deadlines_for(c, 100.0, SloOverrides(ttft_s=1.0))
    assert d.ttft_deadline_s == 101.0
    assert d.tpot_s == 0.05
    assert d.e2e_deadline_s(11) == pytest.approx(101.5)
    assert d.met(0.9, 0.04, 2.0) == (True, True)
    assert d.met(1.1, 0.06, 2.0) == (False, False)


def test_class_table_resolves_and_bounds_overrides() -> None:
    strict = SloPolicyClass("strict", ttft_s=0.5, tpot_s=0.05)
    loose = SloPolicyClass("loose", ttft_s=2.0, tpot_s=0.2, allow_overrides=True)
    table = SloClassTable([strict, loose], default="loose")
    assert table.resolve(None) is loose
    assert table.resolve("") is loose
    assert table.resolve("strict") is strict
    with pytest.raises(UnknownSloClass, match="gold"):
        table.resolve("gold")
    assert table.label("strict") == "strict"
    assert table.label("gold") == "other"
    with pytest.raises(BadOverride, match="allows no overrides") as err:
        table.check_overrides(strict, SloOverrides(ttft_s=0.4))
    assert err.value.param == "x-slo-ttft-ms"
    table.check_overrides(loose, SloOverrides(ttft_s=0.5, tpot_s=0.8))  # the 1/4x and 4x edges
    with pytest.raises(BadOverride, match="outside"):
        table.check_overrides(loose, SloOverrides(tpot_s=0.9))
    with pytest.raises(ConfigError):
        SloClassTable([strict], default="loose")
    assert SloClassTable().default.name == "default"


entries = st.lists(
    st.tuples(st.integers(-3, 3), st.floats(0, 100, allow_nan=False), st.booleans()),
    max_size=40,
)


def _entries(raw: list[tuple[int, float, bool]]) -> list[Entry]:
    return [Entry(f"r{i}", p, d, s, seq=i) for i, (p, d, s) in enumerate(raw)]


@given(entries)
def test_edf_pops_in_rank_order(raw: list[tuple[int, float, bool]]) -> None:
    q = EdfQueue(capacity=1000)
    for e in _entries(raw):
        assert q.push(e).queued
    popped = [q.pop() for _ in range(len(q))]
    assert [rank_key(e) for e in popped] == sorted(rank_key(e) for e in popped)


@given(entries, st.integers(0, 10))
def test_full_queue_never_sheds_unsheddable_before_sheddable(
    raw: list[tuple[int, float, bool]], capacity: int
) -> None:
    q = EdfQueue(capacity)
    for e in _entries(raw):
        before = list(q)
        result = q.push(e)
        assert len(q) <= capacity
        lost = list(result.evicted) + ([] if result.queued else [e])
        for victim in lost:
            if not victim.sheddable:
                # only when nothing sheddable was there to lose instead
                assert not any(x.sheddable for x in [*before, e] if x is not victim)
        if result.queued:
            assert e.id in q


def test_queue_remove_and_ahead_of() -> None:
    q = EdfQueue(10)
    a, b, c = (
        Entry("a", 0, 5.0, False, seq=1),
        Entry("b", 1, 9.0, False, seq=2),
        Entry("c", 0, 1.0, True, seq=3),
    )
    for e in (a, b, c):
        q.push(e)
    assert [e.id for e in q] == ["b", "c", "a"]  # priority first, then deadline
    assert [e.id for e in q.ahead_of(Entry("x", 0, 3.0, False, seq=9))] == ["b", "c"]
    assert q.remove("c") is c
    assert q.remove("c") is None
    assert [q.pop().id, q.pop().id] == ["b", "a"]
    with pytest.raises(IndexError):
        q.pop()


def test_gate_admits_queues_and_sheds() -> None:
    gate = AdmissionGate(GateParams(queue_capacity=2))
    shed_me = Entry("s", 0, 10.0, True, seq=1)
    v, _ = gate.arrive(shed_me, room=False, predicted_ttft_s=20.0, now_s=0.0)
    assert v.outcome is Outcome.SHED
    assert v.retry_after_s == 20.0
    keep = Entry("k", 0, 10.0, False, seq=2)
    v, _ = gate.arrive(keep, room=False, predicted_ttft_s=20.0, now_s=0.0)
    assert v.outcome is Outcome.QUEUED  # non-sheddable: queued however late
    maybe = Entry("m", 0, 30.0, True, seq=3)
    assert gate.arrive(maybe, room=False, predicted_ttft_s=1.0, now_s=0.0)[0].outcome is (
        Outcome.QUEUED
    )
    urgent = Entry("u", 5, 1.0, False, seq=4)
    v, evicted = gate.arrive(urgent, room=False, predicted_ttft_s=None, now_s=0.0)
    assert v.outcome is Outcome.QUEUED
    assert evicted == [maybe]  # the sheddable one makes room
    late = Entry("l", 0, 50.0, False, seq=5)
    v, _ = gate.arrive(late, room=False, predicted_ttft_s=None, now_s=0.0)
    assert v.outcome is Outcome.REJECTED  # full of non-sheddable entries
    # A newcomer queued behind others waits even when there is room (EDF order holds).
    assert (
        gate.arrive(Entry("n", 0, 99.0, False, seq=6), room=True, predicted_ttft_s=None, now_s=0.0)[
            0
        ].outcome
        is Outcome.REJECTED
    )
    assert gate.expire(0.0, lambda e: None) == []
    assert gate.admit_next(room=False) is None
    first, second = gate.admit_next(room=True), gate.admit_next(room=True)
    assert first is not None
    assert second is not None
    assert [first.id, second.id] == ["u", "k"]
    assert gate.admit_next(room=True) is None


def test_gate_release_sheds_hopeless_sheddable_entries_only() -> None:
    gate = AdmissionGate()
    gate.arrive(Entry("s", 0, 1.0, True, seq=1), room=False, predicted_ttft_s=None, now_s=0.0)
    gate.arrive(Entry("k", 0, 1.0, False, seq=2), room=False, predicted_ttft_s=None, now_s=0.0)
    shed = gate.expire(2.0, lambda e: None)
    assert [e.id for e in shed] == ["s"]
    assert [e.id for e in gate.queue] == ["k"]


@given(st.floats())
def test_retry_after_is_whole_seconds_within_bounds(backlog: float) -> None:
    gate = AdmissionGate()
    r = gate.retry_after(backlog)
    assert r == int(r)
    assert 1.0 <= r <= 60.0


def test_allow_overrides_without_a_latency_target_is_refused() -> None:
    """router.yaml / --slo-class: overrides on an offline class could never act."""
    with pytest.raises(ConfigError, match="allowOverrides needs a ttft or tpot target"):
        SloPolicyClass(
            "batch", ttft_s=None, tpot_s=None, job_completion_s=600, allow_overrides=True
        )
    SloPolicyClass("batch", ttft_s=None, tpot_s=None, job_completion_s=600)
