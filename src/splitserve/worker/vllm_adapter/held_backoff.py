"""Back-off of the engine's steps while it only holds KV and nothing changes.

A prefill engine whose only work is KV held for a decode worker's READ steps vLLM so that the
connector sees the READ's notification and frees the blocks (or the lease expires). A decode
worker lost after the prefill never reads: the blocks stay held for the whole lease (30 s) and
the engine stepped every `SPLITSERVE_KV_HELD_POLL_MS` (5 ms) all along. `HeldBackoff` doubles
the pause between such steps while the held state stays the same, up to
`SPLITSERVE_KV_HELD_POLL_MAX_MS`, and starts again at the base pause as soon as it changes;
`held_pause` spends a pause in base-sized slices and ends it early when the engine has
something to do (a command, a READ notification), so nothing waits longer than before.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Hashable, Mapping

HELD_POLL_MAX_ENV = "SPLITSERVE_KV_HELD_POLL_MAX_MS"
"""Longest pause (ms) between the engine's steps while it only holds KV and nothing changes:
0.1 to 60000, not below `SPLITSERVE_KV_HELD_POLL_MS`; equal to it = no back-off (the behaviour
before). Default 200."""
HELD_POLL_MAX_DEFAULT_MS = 200.0


class HeldBackoff:
    """The pause before the engine's next step while only held KV is left: `base_s` after any
    change of the held state (or a `reset`), then doubled at each unchanged step, at most
    `cap_s`."""

    def __init__(self, base_s: float, cap_s: float) -> None:
        if not 0 < base_s <= cap_s:
            raise ValueError(f"need 0 < base_s <= cap_s, not {base_s} / {cap_s}")
        self.base_s = base_s
        self.cap_s = cap_s
        self._pause_s = base_s
        self._state: Hashable | None = None

    def next(self, state: Hashable) -> float:
        """The pause to take now, given what the engine holds now (any hashable summary: a
        change means a READ completed, a lease ended, a request came or went)."""
        if state != self._state:
            self._state = state
            self._pause_s = self.base_s
        pause = self._pause_s
        self._pause_s = min(self.cap_s, pause * 2)
        return pause

    def reset(self) -> None:
        """Back to the base pause (something happened the held state does not show)."""
        self._state = None
        self._pause_s = self.base_s


def held_pause(
    pause_s: float,
    slice_s: float,
    wake: Callable[[], bool],
    sleep: Callable[[float], None],
    now: Callable[[], float],
) -> bool:
    """Spend `pause_s` in sleeps of at most `slice_s`, calling `wake()` before each: True (and at
    once) when it says the engine has something to do, False when the pause ran out. With
    `slice_s` the base poll, a command or a READ notification waits no longer than before the
    back-off."""
    deadline = now() + pause_s
    while True:
        if wake():
            return True
        remaining = deadline - now()
        if remaining <= 0:
            return False
        sleep(min(slice_s, remaining))


def held_poll_max_s(base_s: float, env: Mapping[str, str] = os.environ) -> float:
    """Seconds: `SPLITSERVE_KV_HELD_POLL_MAX_MS` (0.1 to 60000 ms, not below the base poll
    `base_s`) if set, else 200 ms (or the base poll if that is longer). Anything else is
    refused, naming the variable."""
    value = env.get(HELD_POLL_MAX_ENV, "")
    if value == "":
        return max(base_s, HELD_POLL_MAX_DEFAULT_MS / 1000)
    try:
        cap_ms = float(value)
    except ValueError:
        cap_ms = float("nan")
    if not 0.1 <= cap_ms <= 60_000:
        raise ValueError(
            f"{HELD_POLL_MAX_ENV} must be a number of ms in [0.1, 60000], not {value!r}"
        )
    if cap_ms / 1000 < base_s:
        raise ValueError(
            f"{HELD_POLL_MAX_ENV} ({value} ms) must not be below SPLITSERVE_KV_HELD_POLL_MS "
            f"({base_s * 1000:g} ms)"
        )
    return cap_ms / 1000
