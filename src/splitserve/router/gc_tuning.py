"""The router process's cyclic garbage collector, set for a long-running server (issue 17).

Measured in the router at c=32 (docs/benchmarks.md, tenth pass): with CPython's defaults
(thresholds 700, 10, 10) the collector took ~6 % of the router's CPU, ~0.1 ms per streamed
request: young collections every dozen requests, and full collections (~40-70 ms each on the
2-core dev machine) that walk the ~130,000 objects the process holds after start-up (imports,
the tokenizer, the app), none of which ever becomes garbage.

`settle()` runs once, after start-up: one full collection, then `gc.freeze()` (what is alive
now moves to the permanent generation, which no later collection walks) and raised thresholds
(fewer young collections; each walks the young objects still alive and the cycles left since
the last one, so its pause grows with the threshold: `THRESHOLDS`). Nothing about requests
changes: objects are still freed by reference counting the moment they are dropped; cyclic
garbage made after start-up is still collected, only less often. Approximation: a cycle among
the frozen start-up objects that becomes garbage later is never collected (start-up state lives
as long as the process).

`SPLITSERVE_ROUTER_GC=0` leaves CPython's defaults (for comparisons); `1` (default) settles.
"""

from __future__ import annotations

import gc
from typing import Final

from splitserve.router.switches import env_switch

ENV: Final = "SPLITSERVE_ROUTER_GC"
"""`0`: CPython's collector settings untouched; `1` (default): `settle()` after start-up."""

THRESHOLDS: Final = (5_000, 20, 10)
"""Floors for `gc.set_threshold` (CPython's defaults: 700, 10, 10). Measured after the settle
(2-core dev machine, c=32, ~6,700 streamed requests; docs/benchmarks.md, tenth pass): 700 took
429 ms of collections, 5,000 288 ms in 3 ms pauses, 20,000 281 ms in 13 ms pauses (each young
collection frees the cycles the requests left, ~60 objects a request), so 5,000."""


def enabled_from_env(environ: dict[str, str] | None = None) -> bool:
    """The switch from `SPLITSERVE_ROUTER_GC` (unset: on).

    Raises:
        ValueError: a value other than 0 or 1, naming the variable.
    """
    return env_switch(ENV, environ)


def settle() -> tuple[int, int, int]:
    """Collect once, freeze what is alive, raise the thresholds to at least `THRESHOLDS` (a
    collector that is off, threshold 0, stays off). Returns the thresholds before."""
    old = gc.get_threshold()
    gc.collect()
    gc.freeze()
    t0, t1, t2 = old
    if t0 > 0:
        f0, f1, f2 = THRESHOLDS
        gc.set_threshold(max(t0, f0), max(t1, f1), max(t2, f2))
    return old
