"""Closed-loop load from several processes at once (`make bench-router` on many cores).

One asyncio load generator saturates its own core long before 2-4 router processes do, so the
saturation runs of the scaling figure split the clients over several processes, one per load
core (pinned with `os.sched_setaffinity` in the child). The children start together (each says
`ready`, then all get `go`), and their results are merged (`loadgen.merge`: latencies pooled,
counts summed, wall time from the first start to the last end).

    python -m tests.bench_router.loadproc PORT RAW_FILE CONCURRENCY COUNT MAX_S   (a child)
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from tests.bench_router import loadgen
from tests.bench_router.loadgen import Result


def split(total: int, parts: int) -> list[int]:
    """`total` spread over `parts` as evenly as possible (the first ones get the remainder)."""
    if parts < 1:
        raise ValueError("parts must be >= 1")
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def _pinner(core: int) -> Callable[[], None]:
    def pin() -> None:
        os.sched_setaffinity(0, {core})

    return pin


def closed_loop(
    port: int, raw: bytes, concurrency: int, count: int, max_s: float, cores: Sequence[int]
) -> Result:
    """`concurrency` clients spread over one process per core of `cores`, stopping after
    `count` requests in all or `max_s` seconds; the merged result (`cpu_s`: the generators'
    CPU time together)."""
    cores = list(cores)[: max(1, concurrency)]
    conc = split(concurrency, len(cores))
    counts = split(count, len(cores))
    with tempfile.NamedTemporaryFile(prefix="bench-router-raw-", delete=False) as f:
        f.write(raw)
        raw_file = f.name
    children: list[subprocess.Popen[str]] = []
    try:
        for core, c, n in zip(cores, conc, counts, strict=True):
            args = [sys.executable, "-m", "tests.bench_router.loadproc", str(port), raw_file,
                    str(c), str(n), str(max_s)]  # fmt: skip
            child = subprocess.Popen(
                args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                preexec_fn=_pinner(core),
            )  # fmt: skip
            children.append(child)
        for child in children:
            assert child.stdout is not None
            if child.stdout.readline().strip() != "ready":
                raise SystemExit("a load generator process failed to start")
        for child in children:
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
        results = []
        for child in children:
            out, _ = child.communicate(timeout=max_s + 120)
            if child.returncode != 0:
                raise SystemExit(f"a load generator process exited with {child.returncode}")
            results.append(Result.from_json(json.loads(out.strip().splitlines()[-1])))
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
        Path(raw_file).unlink(missing_ok=True)
    return loadgen.merge(results)


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main(argv: list[str]) -> None:
    port, raw_file, concurrency, count, max_s = argv
    raw = Path(raw_file).read_bytes()
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        raise SystemExit(1)
    cpu0 = _cpu_s()
    result = asyncio.run(loadgen.closed_loop(int(port), raw, int(concurrency), int(count),
                                             float(max_s)))  # fmt: skip
    result.cpu_s = _cpu_s() - cpu0
    print(json.dumps(result.to_json()), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
