"""`make bench-slo` killed with a plain `kill` (SIGTERM) stops its `splitserve up` stack.

Before: only Ctrl-C (SIGINT to the whole process group) stopped it; SIGTERM to the benchmark
alone ended it at once and left `up`, its router and its workers running (reparented to init)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            out += [int(c) for c in (task / "children").read_text().split()]
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_sigterm_stops_the_stack(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "splitserve.cli.bench_slo", "--rates", "1", "--duration",
            "30", "--work", str(tmp_path / "work"), "--out", str(tmp_path / "o.json")]  # fmt: skip
    bench = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    up: list[int] = []
    try:
        deadline = time.monotonic() + 20
        while not up and time.monotonic() < deadline and bench.poll() is None:
            up = _children(bench.pid)
            time.sleep(0.1)
        assert up, "the benchmark started no stack"
        time.sleep(1.0)  # `up` under way
        bench.send_signal(signal.SIGTERM)
        bench.wait(40)
        deadline = time.monotonic() + 40
        while any(_alive(p) for p in up) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(_alive(p) for p in up), "splitserve up outlived the benchmark"
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait()
        for pid in up:
            if _alive(pid):
                os.kill(pid, signal.SIGTERM)  # `up` stops its router and workers
