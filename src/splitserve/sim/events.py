"""Simulator events and the queue that orders them.

Owns: the `Event` record (immutable) and `EventQueue`, a heap ordered by (time_s, priority, seq).
`seq` comes from a counter owned by each queue instance, so ties at the same time and priority
resolve in insertion order and two simulators in one process never share state. Pure: no I/O.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from enum import IntEnum
from typing import Final


class EventKind(IntEnum):
    """What happened; the value is the tie-break priority at equal times (lower runs first).

    Work that frees capacity (a step or a KV transfer ending) is handled before new arrivals at
    the same instant, so an arriving request sees the state after the frees, as a live router
    would a moment later.
    """

    STEP_DONE = 0
    TRANSFER_DONE = 1
    ARRIVAL = 2
    WAKE = 3


@dataclass(slots=True, init=False, unsafe_hash=True)
class Event:
    """One scheduled happening. Immutable: `Final` fields, checked by mypy (and enforced at
    runtime in the compiled build). A slotted dataclass with an explicit `__init__` rather than
    `frozen=True`, whose generated `__init__` (one `object.__setattr__` per field, interpreted
    even under mypyc) costs several times as much; one is built per event."""

    time_s: Final[float]
    kind: Final[EventKind]
    seq: Final[int]
    target: Final[int]
    """Index of the entity the event is for (a worker), or -1."""
    payload: Final[object | None]
    """Anything the handler needs. Spelled `object | None` (the same type as `object`): mypyc
    cannot build a dataclass with a field annotated plain `object`."""

    def __init__(
        self,
        time_s: float,
        kind: EventKind,
        seq: int,
        target: int = -1,
        payload: object | None = None,
    ) -> None:
        self.time_s = time_s
        self.kind = kind
        self.seq = seq
        self.target = target
        self.payload = payload

    @property
    def key(self) -> tuple[float, int, int]:
        return (self.time_s, int(self.kind), self.seq)


_PRIORITY: dict[EventKind, int] = {k: int(k) for k in EventKind}
"""`int(kind)` by lookup (cheaper than the `IntEnum` conversion on every push)."""
_heappush = heapq.heappush


class EventQueue:
    """A min-heap of events keyed by (time_s, priority, seq); `seq` is this queue's counter."""

    __slots__ = ("_heap", "_seq")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, int, Event]] = []
        self._seq = 0

    def __len__(self) -> int:
        return len(self._heap)

    def push(
        self, time_s: float, kind: EventKind, target: int = -1, payload: object = None
    ) -> Event:
        seq = self._seq
        self._seq = seq + 1
        event = Event(time_s, kind, seq, target, payload)
        _heappush(self._heap, (time_s, _PRIORITY[kind], seq, event))
        return event

    def heap_entries(self) -> list[tuple[float, int, int, Event]]:
        """The heap itself, `(time_s, priority, seq, event)` entries, for the event loop's
        inlined pop (`heapq.heappop`); push only through `push`."""
        return self._heap

    def pop(self) -> Event:
        """The earliest event. Raises `IndexError` when empty."""
        return heapq.heappop(self._heap)[3]

    def peek_time_s(self) -> float | None:
        return self._heap[0][0] if self._heap else None
