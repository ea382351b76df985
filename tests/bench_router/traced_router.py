"""`splitserve ...` under tracemalloc, with snapshots on request (the slow-stream scenario's
`--trace`): where the router's memory per held stream goes.

    python -m tests.bench_router.traced_router DIR splitserve-args...

A thread watches DIR: for each `NAME.want` that appears it dumps `tracemalloc.take_snapshot()`
to `NAME.snap` (written under a temporary name and renamed, so a reader never sees half a file).
Tracing starts at the first request (tracing the start-up's imports would take minutes), so the
first snapshot is nearly empty and later ones hold what was allocated since and is still alive:
the difference between two is what grew between them. tracemalloc keeps
`BENCH_TRACEMALLOC_FRAMES` frames per allocation (default 6). It sees only what goes through
Python's allocators: gRPC's C core and uvloop's libuv allocate outside them.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import tracemalloc
from pathlib import Path


def _watch(folder: Path) -> None:
    while True:
        for want in sorted(folder.glob("*.want")):
            if not tracemalloc.is_tracing():
                tracemalloc.start(int(os.environ.get("BENCH_TRACEMALLOC_FRAMES", "6")))
            snap = want.with_suffix(".snap")
            tmp = want.with_suffix(".part")
            tracemalloc.take_snapshot().dump(str(tmp))
            tmp.replace(snap)
            want.unlink()
        time.sleep(0.2)


def main() -> None:
    folder = Path(sys.argv[1])
    threading.Thread(target=_watch, args=(folder,), daemon=True, name="tracemalloc").start()
    sys.argv = ["splitserve", *sys.argv[2:]]
    from splitserve.cli.main import main as splitserve_main

    splitserve_main()


if __name__ == "__main__":
    main()
