"""Event queue properties.

Invariants:
- events pop in non-decreasing (time_s, priority, seq) order, whatever the push order;
- at equal time and priority, events pop in push order (seq is the queue's own counter);
- two queues never share a counter.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from splitserve.sim.events import Event, EventKind, EventQueue

_kinds = st.sampled_from(list(EventKind))
_times = st.floats(min_value=0, max_value=100, allow_nan=False)


@given(st.lists(st.tuples(_times, _kinds), max_size=60))
def test_pops_in_key_order(pushes: list[tuple[float, EventKind]]) -> None:
    q = EventQueue()
    for t, k in pushes:
        q.push(t, k)
    out: list[Event] = []
    while len(q):
        out.append(q.pop())
    assert [e.key for e in out] == sorted(e.key for e in out)
    assert len(out) == len(pushes)


def test_ties_break_by_priority_then_insertion() -> None:
    q = EventQueue()
    a = q.push(1.0, EventKind.ARRIVAL, payload="a")
    b = q.push(1.0, EventKind.STEP_DONE, payload="b")
    c = q.push(1.0, EventKind.ARRIVAL, payload="c")
    assert [q.pop(), q.pop(), q.pop()] == [b, a, c]


def test_queues_do_not_share_sequence_numbers() -> None:
    q1, q2 = EventQueue(), EventQueue()
    assert q1.push(0.0, EventKind.WAKE).seq == 0
    assert q2.push(0.0, EventKind.WAKE).seq == 0
    assert q1.push(0.0, EventKind.WAKE).seq == 1
    assert q1.peek_time_s() == 0.0
    assert EventQueue().peek_time_s() is None
