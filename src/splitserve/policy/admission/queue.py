"""The router's bounded earliest-deadline-first queue.

Order: higher priority first, then the earlier TTFT deadline, then arrival order (`seq`). When
the queue is full a newcomer may take the place of the lowest-ranked *sheddable* entry; a
non-sheddable entry is never evicted, so non-sheddable requests are never shed before sheddable
ones. With only non-sheddable entries queued, a full queue refuses the newcomer.

Invariants (property-tested): `pop` returns entries in `rank_key` order; the size never exceeds
`capacity`; an evicted or refused entry is non-sheddable only when every other entry is too.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Entry:
    id: str
    priority: int
    deadline_s: float
    """The TTFT deadline (absolute, the owner's clock)."""
    sheddable: bool
    slo_class: str = "default"
    enqueued_s: float = 0.0
    seq: int = 0
    """Arrival order, for ties."""


def rank_key(e: Entry) -> tuple[int, float, int]:
    """Smaller first: priority (higher first), deadline, arrival."""
    return (-e.priority, e.deadline_s, e.seq)


@dataclass(slots=True)
class PushResult:
    queued: bool
    """Whether the newcomer is in the queue."""
    evicted: list[Entry] = field(default_factory=list)
    """Entries pushed out to make room (all sheddable)."""


class EdfQueue:
    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {capacity}")
        self.capacity = capacity
        self._keys: list[tuple[int, float, int]] = []
        self._entries: list[Entry] = []
        self._by_id: dict[str, Entry] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[Entry]:
        return iter(list(self._entries))

    def __contains__(self, entry_id: object) -> bool:
        return entry_id in self._by_id

    def head(self) -> Entry | None:
        return self._entries[0] if self._entries else None

    def ahead_of(self, entry: Entry) -> list[Entry]:
        """Queued entries that rank before `entry` (queued or not)."""
        i = bisect.bisect_left(self._keys, rank_key(entry))
        return self._entries[:i]

    def push(self, entry: Entry) -> PushResult:
        if entry.id in self._by_id:
            raise ValueError(f"entry {entry.id!r} is queued already")
        if len(self._entries) < self.capacity:
            self._insert(entry)
            return PushResult(True)
        # Full: the victim is the lowest-ranked sheddable among the queue and the newcomer.
        victim: Entry | None = entry if entry.sheddable else None
        for e in reversed(self._entries):
            if e.sheddable and (victim is None or rank_key(e) > rank_key(victim)):
                victim = e
                break
        if victim is None or victim is entry:
            return PushResult(False)
        self.remove(victim.id)
        self._insert(entry)
        return PushResult(True, [victim])

    def pop(self) -> Entry:
        if not self._entries:
            raise IndexError("pop from an empty EdfQueue")
        self._keys.pop(0)
        e = self._entries.pop(0)
        del self._by_id[e.id]
        return e

    def remove(self, entry_id: str) -> Entry | None:
        e = self._by_id.pop(entry_id, None)
        if e is None:
            return None
        i = bisect.bisect_left(self._keys, rank_key(e))
        while self._entries[i].id != entry_id:
            i += 1
        del self._keys[i]
        del self._entries[i]
        return e

    def _insert(self, entry: Entry) -> None:
        k = rank_key(entry)
        i = bisect.bisect_right(self._keys, k)
        self._keys.insert(i, k)
        self._entries.insert(i, entry)
        self._by_id[entry.id] = entry
