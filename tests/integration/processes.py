"""Starting `splitserve` processes in integration tests: spawn one with its output in a log file,
wait for its ready file."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def spawn(args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """`python -m splitserve ARGS`, stdout and stderr into `log`."""
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "splitserve", *args], stdout=out, stderr=out, env=env
        )


def stop(proc: subprocess.Popen[bytes], timeout_s: float = 60) -> None:
    """SIGTERM (the process drains), then SIGKILL if it is still running after `timeout_s`."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def ready(path: Path, proc: subprocess.Popen[bytes], timeout_s: float = 120) -> dict[str, Any]:
    """The process's ready file once it exists (fails if the process exits or time runs out)."""
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert proc.poll() is None, f"exited with {proc.returncode}"
        assert time.monotonic() < deadline, f"{path.name} not ready"
        time.sleep(0.1)
    info: dict[str, Any] = json.loads(path.read_text())
    return info


def up_ready(proc: subprocess.Popen[str], run_dir: Path, timeout_s: float = 120.0) -> None:
    """Wait for `splitserve up`'s router ready file in `run_dir` (`up` writes it once its whole
    stack serves); fails with up's output if it exits first, or when time runs out."""
    deadline = time.monotonic() + timeout_s
    while not (run_dir / "router.ready.json").exists():
        if proc.poll() is not None:
            out = proc.stdout.read() if proc.stdout else ""
            raise RuntimeError(f"splitserve up exited early ({proc.returncode}):\n{out}")
        if time.monotonic() > deadline:
            raise TimeoutError("splitserve up did not become ready")
        time.sleep(0.1)


def counted(read: Callable[[], list[float]], total: float, timeout_s: float = 10.0) -> list[float]:
    """`read()` once its values add up to `total`, or as it stands after `timeout_s`.

    A worker counts a stream in `splitserve_worker_requests_total` once the stream has closed,
    which can be just after the client has its last token: a loaded CI run sampled 196 of 200.
    """
    deadline = time.monotonic() + timeout_s
    values = read()
    while sum(values) < total and time.monotonic() < deadline:
        time.sleep(0.05)
        values = read()
    return values
