"""Timestamps of a P/D decode's hand-off, token 1 -> token 2 (`make bench-kv --trace`).

Off unless `SPLITSERVE_KV_TRACE` names a file. Then the vLLM engine of a decode worker appends
one JSON line per event of each decode it continues from a prefill (`{"rid", "event", "t"}`,
`t` from `time.perf_counter()`: CLOCK_MONOTONIC on Linux, so the bench client, which appends its
own events for the same request to the same file, shares the clock). Events, in the order one
decode meets them (`MILESTONES`): the worker service takes the Decode call, the call reaches
the engine, the engine thread takes the request and has added it to vLLM, the scheduler first
sees it, the NIXL READ is posted and returns, vLLM reports the READ done (the asynchronous path
only), the engine step that yields token 2 starts and ends, the token is handed to the asyncio
side and leaves the engine's stream.
`breakdown` turns the lines into per-request intervals.

A measuring aid, not a metric: each event is a small locked write (a few microseconds).
"""

from __future__ import annotations

import itertools
import json
import os
import statistics
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

TRACE_ENV = "SPLITSERVE_KV_TRACE"

MILESTONES: tuple[tuple[str, str], ...] = (
    ("token1", "router has token 1 (Prefill answered)"),
    ("received", "the worker service's Decode handler starts (gRPC delivered the call)"),
    ("call", "Decode call reaches the engine (after the service's checks)"),
    ("picked", "the engine thread takes the request (before `add_request`)"),
    ("added", "request added to vLLM (engine thread)"),
    ("seen", "scheduler first sees it (schedule() returns)"),
    ("post", "NIXL READ posted (start_load_kv)"),
    ("prep", "vLLM calls NIXL's make_prepped_xfer (after its own bookkeeping)"),
    ("prepped", "make_prepped_xfer returns"),
    ("transfer", "vLLM calls NIXL's transfer()"),
    ("transferred", "transfer() returns (with `cma`, the copy is done)"),
    ("posted", "start_load_kv returns"),
    ("xfer_seen", "vLLM's `check_xfer_state` finds the READ done (NIXL's xferDuration ends here)"),
    ("recv_done", "vLLM reports the READ done (async path)"),
    ("recv_core_end", "the engine core's step that reported it returns (after update_from_output)"),
    ("recv_step_end", "that engine step returns to the engine thread (after output processing)"),
    ("step2_start", "the step that yields token 2 starts"),
    ("step2_sched", "its schedule() returns"),
    ("step2_fwd_start", "its model execution starts"),
    ("step2_fwd_end", "its model execution (forward, sampling) ends"),
    ("step2_end", "that step ends"),
    ("dispatch", "token 2 handed to the asyncio side"),
    ("yield", "token 2 leaves the engine stream"),
    ("token2", "router has token 2"),
)
"""Trace events in the order a decode meets them, with what each marks."""


class KvTrace:
    """Appends events to a file; thread-safe (the engine thread and the asyncio loop write)."""

    def __init__(self, path: str | Path) -> None:
        self._lock = threading.Lock()
        self._out: TextIO = open(path, "a", buffering=1)  # noqa: SIM115 (lives with the engine)
        self._open: set[str] = set()
        """Decodes between their call and token 2 (the worker's request ids)."""
        self._alias: dict[str, str] = {}
        """vLLM's internal request id -> the worker's, for traced decodes."""
        self._unseen: set[str] = set()
        self._step_start: float | None = None
        self._posting: list[str] = []
        """Traced decodes inside the current `start_load_kv` (their NIXL calls are timed)."""
        self._inflight: list[str] = []
        """Traced decodes whose READ `transfer()` posted and whose telemetry vLLM has not read
        yet. The READ's state checks and telemetry are not tied to a request id, so they are
        credited to these: exact with one hand-off at a time (the bench), approximate with
        several in flight."""
        self._phases: dict[str, float] = {}
        """Times within the traced step: `step_sched`, `step_fwd_start`, `step_fwd_end`."""
        self._recv_core: list[str] = []
        """Traced decodes whose READ this engine-core step reported done (`recv_core_end`)."""
        self._recv_step: list[str] = []
        """... and whose engine step has not returned yet (`recv_step_end`)."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> KvTrace | None:
        path = env.get(TRACE_ENV)
        return cls(path) if path else None

    def mark(self, rid: str, event: str, t: float | None = None) -> None:
        stamp = time.perf_counter() if t is None else t
        line = json.dumps({"rid": rid, "event": event, "t": stamp})
        with self._lock:
            self._out.write(line + "\n")

    # -- a decode's life in the engine -------------------------------------------------

    def begin(self, rid: str) -> None:
        """A decode continued from a prefill reached the engine: trace it until token 2."""
        self._open.add(rid)
        self.mark(rid, "call")

    def received(self, rid: str) -> None:
        """The worker service took a Decode call for `rid` (before its checks)."""
        self.mark(rid, "received")

    def picked(self, rid: str) -> None:
        """The engine thread took `rid`'s request off its command queue."""
        if rid in self._open:
            self.mark(rid, "picked")

    def added(self, rid: str, internal: str) -> None:
        """vLLM took the request (in the engine thread) under its internal id `internal`."""
        if rid in self._open:
            self._alias[internal] = rid
            self._unseen.add(rid)
            self.mark(rid, "added")

    def scheduled(self) -> None:
        """After a `schedule()`: requests added before it have been seen by the scheduler."""
        if self._step_start is not None:
            self._phases.setdefault("step_sched", time.perf_counter())
        if self._unseen:
            now = time.perf_counter()
            for rid in list(self._unseen):
                self.mark(rid, "seen", now)
            self._unseen.clear()

    def install(self, worker: Any) -> None:
        """Time the NIXL worker's READ posts and its reports of finished READs (wrapping the
        outermost `start_load_kv` / `get_transfer_results`, whoever wrapped them before)."""
        post = worker.start_load_kv
        results = worker.get_transfer_results

        def start_load_kv(metadata: Any, *args: Any, **kwargs: Any) -> Any:
            recv = getattr(metadata, "reqs_to_recv", {})
            ids = [self._alias[i] for i in recv if i in self._alias]
            for rid in ids:
                self.mark(rid, "post")
            self._posting = ids
            try:
                out = post(metadata, *args, **kwargs)
            finally:
                self._posting = []
            for rid in ids:
                self.mark(rid, "posted")
            return out

        def get_transfer_results(*args: Any, **kwargs: Any) -> Any:
            out = results(*args, **kwargs)
            for i in getattr(out, "finished_recving", ()):
                rid = self._alias.get(i)
                if rid is not None and rid in self._open:
                    self.mark(rid, "recv_done")
                    self._recv_core.append(rid)
            return out

        worker.start_load_kv = start_load_kv
        worker.get_transfer_results = get_transfer_results
        wrapper = getattr(worker, "nixl_wrapper", None)
        if wrapper is not None:
            self._time_nixl(wrapper)

    def _time_nixl(self, wrapper: Any) -> None:
        """Time NIXL's `make_prepped_xfer` and `transfer` when vLLM calls them for a traced
        decode inside `start_load_kv` (other calls, the warm-up READ's among them, pass)."""
        calls = (("make_prepped_xfer", "prep", "prepped"), ("transfer", "transfer", "transferred"))
        for method, before, after in calls:
            inner = getattr(wrapper, method)

            def timed(*args: Any, _inner: Any = inner, _b: str = before, _a: str = after,
                      **kwargs: Any) -> Any:  # fmt: skip
                ids = self._posting
                for rid in ids:
                    self.mark(rid, _b)
                cpu = time.thread_time()
                out = _inner(*args, **kwargs)
                cpu = time.thread_time() - cpu
                if _a == "prepped" and len(args) > 2:
                    for rid in ids:  # not a time either: how many descriptors vLLM asked for
                        self.mark(rid, "prepped_descs", float(len(args[2])))
                        # ... and in how many runs of consecutive descriptor ids they lie on
                        # each side (local: the decode's blocks; remote: the prefill's).
                        self.mark(rid, "local_runs", float(id_runs(args[2])))
                        if len(args) > 4:
                            self.mark(rid, "remote_runs", float(id_runs(args[4])))
                for rid in ids:
                    self.mark(rid, _a)
                    # Not a time: the CPU seconds the calling thread spent in the call (with
                    # `cma` the copy runs in `transfer()`; wall time above it is waiting for
                    # the core). `milestones` skips it; `cpu_seconds` reads it.
                    self.mark(rid, _a + "_cpu", cpu)
                if _a == "transferred":
                    self._inflight = [*self._inflight, *ids]
                return out

            setattr(wrapper, method, timed)
        self._time_completion(wrapper)

    def _time_completion(self, wrapper: Any) -> None:
        """Mark when vLLM's `check_xfer_state` (its `get_finished` poll, once per engine step)
        first finds a traced READ done (`xfer_seen`), how many of its checks found it still in
        progress (`xfer_checks`), and the READ's telemetry as vLLM reads it right after:
        `tel_xfer` / `tel_post` (NIXL's xferDuration / postDuration, seconds: xferDuration
        runs from the post's start to the check that saw it done) and `tel_descs` (descriptors
        after merging). Not times, except `xfer_seen`; `value` reads them."""
        check = getattr(wrapper, "check_xfer_state", None)
        telemetry = getattr(wrapper, "get_xfer_telemetry", None)
        if check is None or telemetry is None:
            return
        pending: dict[str, int] = {}

        def check_xfer_state(*args: Any, **kwargs: Any) -> Any:
            out = check(*args, **kwargs)
            ids = self._inflight
            if not ids:
                return out
            if out == "PROC":
                for rid in ids:
                    pending[rid] = pending.get(rid, 0) + 1
            else:
                now = time.perf_counter()
                for rid in ids:
                    self.mark(rid, "xfer_seen", now)
                    self.mark(rid, "xfer_checks", float(pending.pop(rid, 0)))
            return out

        def get_xfer_telemetry(*args: Any, **kwargs: Any) -> Any:
            out = telemetry(*args, **kwargs)
            ids, self._inflight = self._inflight, []
            for rid in ids:
                self.mark(rid, "tel_xfer", float(out.xferDuration) / 1e6)
                self.mark(rid, "tel_post", float(out.postDuration) / 1e6)
                self.mark(rid, "tel_descs", float(out.descCount))
            return out

        wrapper.check_xfer_state = check_xfer_state
        wrapper.get_xfer_telemetry = get_xfer_telemetry

    def install_executor(self, executor: Any) -> None:
        """Time the model execution of traced steps (the executor's `execute_model` and
        `sample_tokens`, on this instance)."""
        execute = executor.execute_model
        sample = executor.sample_tokens

        def execute_model(*args: Any, **kwargs: Any) -> Any:
            if self._step_start is not None:
                self._phases["step_fwd_start"] = time.perf_counter()
            out = execute(*args, **kwargs)
            if self._step_start is not None:
                self._phases["step_fwd_end"] = time.perf_counter()
            return out

        def sample_tokens(*args: Any, **kwargs: Any) -> Any:
            out = sample(*args, **kwargs)
            if self._step_start is not None:
                self._phases["step_fwd_end"] = time.perf_counter()
            return out

        executor.execute_model = execute_model
        executor.sample_tokens = sample_tokens

    def install_core(self, core: Any) -> None:
        """Mark when the engine core's step in which a traced READ was reported done returns
        (`recv_core_end`; wrapping this instance's `step_fn`, whoever wrapped it before)."""
        step = core.step_fn

        def step_fn(*args: Any, **kwargs: Any) -> Any:
            out = step(*args, **kwargs)
            if self._recv_core:
                now = time.perf_counter()
                for rid in self._recv_core:
                    self.mark(rid, "recv_core_end", now)
                self._recv_step.extend(self._recv_core)
                self._recv_core = []
            return out

        core.step_fn = step_fn

    def step_started(self) -> None:
        self._phases = {}
        self._step_start = time.perf_counter() if self._open else None

    def step_ended(self) -> None:
        """After an engine step: every traced request gets the step's times."""
        start, self._step_start = self._step_start, None
        end = time.perf_counter()
        if self._recv_step:
            for rid in self._recv_step:
                self.mark(rid, "recv_step_end", end)
            self._recv_step = []
        if start is None:
            return
        for rid in list(self._open):
            self.mark(rid, "step_start", start)
            self.mark(rid, "step_end", end)
            for name, t in self._phases.items():
                self.mark(rid, name, t)

    def dispatched(self, rid: str) -> None:
        """Token 2 left the engine thread: the engine side of this decode is traced."""
        if rid in self._open:
            self._open.discard(rid)
            self._unseen.discard(rid)
            for internal in [i for i, r in self._alias.items() if r == rid]:
                del self._alias[internal]
            self.mark(rid, "dispatch")

    def close(self) -> None:
        with self._lock:
            self._out.close()


def load(path: str | Path) -> dict[str, list[tuple[str, float]]]:
    """The trace file's events by request, in file order."""
    out: dict[str, list[tuple[str, float]]] = {}
    for line in Path(path).read_text().splitlines():
        if not line.strip():
            continue
        e = json.loads(line)
        out.setdefault(str(e["rid"]), []).append((str(e["event"]), float(e["t"])))
    return out


def id_runs(ids: Sequence[int]) -> int:
    """How many runs of consecutive values `ids` has (1 for 4, 5, 6; 3 for 4, 5, 9, 2)."""
    seq = [int(i) for i in ids]
    return (1 + sum(1 for a, b in itertools.pairwise(seq) if b != a + 1)) if seq else 0


def value(events: Sequence[tuple[str, float]], name: str) -> float | None:
    """The first `name` mark of a request (a count or a duration, not a time); None if none."""
    for n, t in events:
        if n == name:
            return t
    return None


def cpu_seconds(events: Sequence[tuple[str, float]], call: str = "transferred") -> float | None:
    """CPU seconds the engine thread spent in a traced NIXL call (`prepped`, `transferred`):
    the first such call of the request; None if not traced."""
    for name, t in events:
        if name == call + "_cpu":
            return t
    return None


def milestones(events: Sequence[tuple[str, float]]) -> dict[str, float]:
    """One request's events as `MILESTONES` times: the first of each event, except the token-2
    step, which is the last step the engine ran for the request before it dispatched token 2."""
    first: dict[str, float] = {}
    for name, t in events:
        first.setdefault(name, t)
    out = {k: v for k, v in first.items() if k in dict(MILESTONES)}
    dispatch = first.get("dispatch")
    steps = [
        (s, e)
        for (n1, s), (n2, e) in itertools.pairwise(events)
        if n1 == "step_start" and n2 == "step_end" and (dispatch is None or e <= dispatch)
    ]
    if steps:
        start, end = steps[-1]
        out["step2_start"], out["step2_end"] = start, end
        out["steps"] = float(len(steps))
        for name, t in events:
            phase = name.startswith("step_") and name not in ("step_start", "step_end")
            if phase and start <= t <= end:
                out["step2_" + name.removeprefix("step_")] = t
    return out


def breakdown(requests: Iterable[Mapping[str, float]]) -> list[tuple[str, str, float, int]]:
    """Median interval between consecutive milestones over `requests` (each one's
    `milestones`): (from, to, median seconds, requests with both), in the order they happen.
    Each request's milestones are taken in the order they happened (the in-step path reads
    the KV inside the token-2 step, so that step starts before the scheduler sees the
    request); milestones a request lacks are skipped for it (the in-step path has no
    `recv_done`)."""
    names = [m for m, _ in MILESTONES]
    rank = {n: i for i, n in enumerate(names)}
    spans: dict[tuple[str, str], list[float]] = {}
    starts: dict[tuple[str, str], list[float]] = {}
    for r in requests:
        present = sorted((n for n in names if n in r), key=lambda n: (r[n], rank[n]))
        if not present:
            continue
        t0 = r[present[0]]
        for a, b in itertools.pairwise(present):
            spans.setdefault((a, b), []).append(r[b] - r[a])
            starts.setdefault((a, b), []).append(r[a] - t0)
    out = [(a, b, statistics.median(xs), len(xs)) for (a, b), xs in spans.items()]
    out.sort(key=lambda x: (statistics.median(starts[x[0], x[1]]), rank[x[0]], rank[x[1]]))
    return out


def breakdown_rows(cols: Sequence[tuple[str, Sequence[Mapping[str, float]]]]) -> list[str]:
    """A markdown table of `breakdown` per column (label, the column's requests' milestones):
    the header and one row per interval, in the order the intervals happen; cells are the
    median in ms and how many requests had both ends."""
    tables = [breakdown(rows) for _, rows in cols]
    spans: list[tuple[str, str]] = []
    for table in tables:
        for a, b, _, _ in table:
            if (a, b) not in spans:
                spans.append((a, b))
    lines = [
        "| interval | " + " | ".join(f"{c} ms" for c, _ in cols) + " |",
        "|---|" + "---:|" * len(cols),
    ]
    for a, b in spans:
        cells = []
        for table in tables:
            hit = [x for x in table if (x[0], x[1]) == (a, b)]
            cells.append(f"{1000 * hit[0][2]:.2f} (n={hit[0][3]})" if hit else "")
        lines.append(f"| {a} -> {b} | " + " | ".join(cells) + " |")
    return lines


def describe(name: str) -> str:
    return dict(MILESTONES).get(name, name)
