"""Where a vLLM worker's threads run: one core set for the whole process.

vLLM 0.32 run in-process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, the uni-process executor) applies
`VLLM_CPU_OMP_THREADS_BIND` nowhere (only its multi-process executor reads it), and its CPU
NixlConnector pins the thread that builds it, the engine thread, to the last core of each NUMA
node (`os.sched_setaffinity(0, ...)`, "reserve a core for KV loads"). Two workers on one machine
therefore computed on the same core whatever they were told. `pin_process` puts every thread of
the process on the worker's cores instead: after the engine is built, and again whenever it must
undo vLLM's pin.
"""

from __future__ import annotations

import contextlib
import os

from splitserve.core.errors import ConfigError

BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"
_NO_LIST = ("", "auto", "nobind", "all")


def parse_cpus(text: str) -> tuple[int, ...] | None:
    """`"0"`, `"0-3"`, `"0,2,4-5"` -> the cores; vLLM's `auto` / `nobind` (or nothing) -> None.

    vLLM's per-rank form `"0-1|2-3"` names one list per tensor-parallel rank; an in-process engine
    is one rank, so only the first list applies.
    """
    text = text.strip()
    if text in _NO_LIST:
        return None
    first = text.split("|", 1)[0]
    cpus: set[int] = set()
    try:
        for part in first.split(","):
            lo, dash, hi = part.strip().partition("-")
            if dash:
                cpus.update(range(int(lo), int(hi) + 1))
            else:
                cpus.add(int(lo))
    except ValueError:
        raise ConfigError(
            f"{BIND_ENV}={text!r} is not a core list (e.g. 0, 0-3, 0,2), auto or nobind"
        ) from None
    if not cpus or min(cpus) < 0:
        raise ConfigError(f"{BIND_ENV}={text!r} names no core")
    return tuple(sorted(cpus))


def cpus_from_env() -> tuple[int, ...] | None:
    return parse_cpus(os.environ.get(BIND_ENV, ""))


def thread_ids() -> list[int]:
    """This process's threads (Linux); [] where /proc is not there."""
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return []


def pin_process(cpus: tuple[int, ...] | frozenset[int] | set[int]) -> int:
    """Put every current thread of this process on `cpus`; threads they start inherit it.
    Returns how many threads were pinned (threads that exit meanwhile are skipped)."""
    if not hasattr(os, "sched_setaffinity"):
        return 0
    missing = set(cpus) - set(range(os.cpu_count() or 0))
    if missing:
        raise ConfigError(
            f"cannot pin to cores {sorted(missing)}: this machine has {os.cpu_count()} cores"
        )
    pinned = 0
    for tid in thread_ids():
        with contextlib.suppress(OSError):  # ProcessLookupError: the thread exited
            os.sched_setaffinity(tid, set(cpus))
            pinned += 1
    return pinned


def thread_affinities() -> dict[int, frozenset[int]]:
    """Each thread's cores (for tests and `bench-kv`)."""
    out: dict[int, frozenset[int]] = {}
    for tid in thread_ids():
        with contextlib.suppress(OSError):
            out[tid] = frozenset(os.sched_getaffinity(tid))
    return out
