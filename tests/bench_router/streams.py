"""Memory per in-flight stream: N slow streams held open at once on one router process.

`make bench-router` runs it last (`--slow-streams N`, default 10,000); alone:

    python -m tests.bench_router.streams [--count 10000] [--ramp-per-s 150] [--trace]

Set-up (so that it measures the router, not the backend or the client):

- **Backend**: `tests.bench_router.slow_worker`, a bench fake that serves `Worker.Multiplex`
  with one timer wheel for all streams (first token at once, then one every `--interval-s`,
  20 s by default, streams of 256 tokens, so none ends during the run); on the load core.
- **Router**: one process on its own core, SLO classes and admission on as in the rest of
  `make bench-router`. Admission lets every stream dispatch because the fake reports no engine
  steps (no fitted latency model: cold-start admission has room) and `max_outstanding_per_worker`
  is unset (the default); its load reports give KV room for far more than N. The edge's
  `max_connections` is raised to N + 1,024 and the token-stall timeout to 300 s.
- **Client**: one asyncio process (uvloop) on the load core; a connection per stream with a
  bare `asyncio.Protocol` that writes the request, checks the status line, counts the stream as
  open at its first SSE event and then reads and drops what follows. Streams are opened at
  `--ramp-per-s`; at each checkpoint (1,000, 5,000, N) opening pauses until every stream opened
  so far is open or failed, then after `--settle-s` the router's RSS is read.

`--trace` runs the router under tracemalloc (`traced_router`), takes a snapshot at the first
two checkpoints and prints the largest differences (RSS figures of a traced run are inflated by
tracemalloc's own bookkeeping: quote them from an untraced run).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from splitserve.router.tokenizer import default_tokenizer_dir
from tests.bench_router import loadgen
from tests.bench_router.run import (
    LOAD_CORE,
    ROUTER_CORE,
    Procs,
    _at_least,
    _cpu_s,
    _free_port,
    _router_args,
    _rss_mb,
    _wait_file,
    _wait_http,
)

CHECKPOINTS = (1000, 5000, 10000)
MAX_TOKENS = 256


@dataclass
class Holding:
    opened: int = 0
    started: int = 0
    failed: int = 0
    lost: int = 0
    """Streams that were open and ended (the server closed) before the run's end."""
    statuses: dict[str, int] = field(default_factory=dict)
    closing: bool = False
    """Set before the client closes its own connections (those do not count as lost)."""
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def fail(self, what: str) -> None:
        self.failed += 1
        self.statuses[what] = self.statuses.get(what, 0) + 1
        self.changed.set()


class _Stream(asyncio.Protocol):
    """One held stream: the request out, the head checked, then every byte read and dropped."""

    __slots__ = ("buf", "holding", "raw", "state", "transport")

    def __init__(self, raw: bytes, holding: Holding) -> None:
        self.raw = raw
        self.holding = holding
        self.buf = b""
        self.state = "head"  # head -> open -> done
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self.transport.write(self.raw)

    def data_received(self, data: bytes) -> None:
        if self.state != "head":
            return
        self.buf += data
        if not self.buf.startswith(b"HTTP/1.1 200") and b"\r\n" in self.buf:
            self.state = "done"
            self.holding.fail(self.buf.split(b"\r\n", 1)[0].decode("latin-1"))
            return
        if b"data: " in self.buf:
            self.state = "open"
            self.buf = b""
            self.holding.started += 1
            self.holding.changed.set()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.state == "head":
            self.holding.fail(type(exc).__name__ if exc else "closed before the first event")
        elif self.state == "open" and not self.holding.closing:
            self.holding.lost += 1
        self.state = "done"


async def hold(
    port: int,
    raw: bytes,
    checkpoints: list[int],
    ramp_per_s: float,
    settle_s: float,
    at_checkpoint: Callable[[int, Holding], Any],
    max_wait_s: float = 120.0,
) -> tuple[Holding, list[Any]]:
    """Open streams up to each checkpoint in turn (at `ramp_per_s`), wait until all of them
    are open or failed (at most `max_wait_s` per checkpoint), wait `settle_s`, and record
    `at_checkpoint(n, holding)`. Then close everything."""
    loop = asyncio.get_running_loop()
    holding = Holding()
    transports: list[asyncio.BaseTransport] = []
    values: list[Any] = []
    batch = max(1, int(ramp_per_s / 20))
    try:
        for target in checkpoints:
            while holding.opened < target:
                t0 = time.perf_counter()
                for _ in range(min(batch, target - holding.opened)):
                    holding.opened += 1
                    try:
                        tr, _ = await loop.create_connection(
                            lambda: _Stream(raw, holding), "127.0.0.1", port
                        )
                        transports.append(tr)
                    except OSError as err:
                        holding.fail(type(err).__name__)
                await asyncio.sleep(max(0.0, batch / ramp_per_s - (time.perf_counter() - t0)))
            deadline = time.perf_counter() + max_wait_s
            while holding.started + holding.failed < holding.opened:
                holding.changed.clear()
                left = deadline - time.perf_counter()
                if left <= 0:
                    break
                try:
                    await asyncio.wait_for(holding.changed.wait(), left)
                except TimeoutError:
                    break
            await asyncio.sleep(settle_s)
            values.append(at_checkpoint(target, holding))
    finally:
        holding.closing = True
        for transport in transports:
            transport.close()
    return holding, values


def _chat(port: int) -> bytes:
    body = {
        "model": "bench",
        "messages": [{"role": "user", "content": "tell me a long story"}],
        "max_tokens": MAX_TOKENS,
        "stream": True,
        "ignore_eos": True,
    }
    return loadgen.request_bytes(port, "/v1/chat/completions", json.dumps(body).encode())


def _snapshot(folder: Path, name: str, timeout_s: float = 300) -> Path:
    (folder / f"{name}.want").touch()
    snap = folder / f"{name}.snap"
    deadline = time.monotonic() + timeout_s
    while not snap.exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"tracemalloc snapshot {name} never came")
        time.sleep(0.2)
    return snap


def trace_diff(first: Path, second: Path, streams: int, top: int = 15) -> list[str]:
    """The largest growths between two snapshots, by allocation site and by the traceback
    of the deepest splitserve / grpc frame, as bytes per added stream."""
    a = tracemalloc.Snapshot.load(str(first))
    b = tracemalloc.Snapshot.load(str(second))
    total = sum(s.size_diff for s in b.compare_to(a, "filename"))
    lines = [f"traced (Python allocators) growth: {total / 1e6:.1f} MB, "
             f"{total / max(1, streams):.0f} B per added stream"]  # fmt: skip
    for stat in b.compare_to(a, "lineno")[:top]:
        frame = stat.traceback[0]
        per, blocks = stat.size_diff / max(1, streams), stat.count_diff / max(1, streams)
        lines.append(
            f"  {per:7.0f} B/stream  {blocks:5.1f} blocks/stream  "
            f"{_short(frame.filename)}:{frame.lineno}"
        )
    lines.append("by the allocation's calling code (first frame in splitserve, grpc or uvicorn):")
    by_site: dict[str, int] = {}
    for stat in b.compare_to(a, "traceback"):
        site = next(
            (f"{_short(f.filename)}:{f.lineno}" for f in reversed(stat.traceback)
             if any(k in f.filename for k in ("splitserve", "grpc", "uvicorn"))),
            f"{_short(stat.traceback[-1].filename)}:{stat.traceback[-1].lineno}",
        )  # fmt: skip
        by_site[site] = by_site.get(site, 0) + stat.size_diff
    for site, size in sorted(by_site.items(), key=lambda kv: -kv[1])[:top]:
        lines.append(f"  {size / max(1, streams):7.0f} B/stream  {site}")
    return lines


def _short(filename: str) -> str:
    for mark in ("site-packages/", "src/", "lib/python3"):
        if mark in filename:
            return filename.split(mark, 1)[1]
    return filename


def run(
    procs: Procs,
    work: Path,
    tok_dir: Path,
    count: int,
    *,
    ramp_per_s: float = 150.0,
    settle_s: float = 3.0,
    interval_s: float = 20.0,
    trace: bool = False,
) -> dict[str, Any]:
    """The scenario: slow worker, router, client; RSS idle and at each checkpoint."""
    ready = work / "slow-worker.json"
    w = procs.spawn(
        "slow-worker",
        [sys.executable, "-m", "tests.bench_router.slow_worker",
         "--ready-file", str(ready), "--interval-s", str(interval_s)],
        LOAD_CORE,
    )  # fmt: skip
    address = _wait_file(ready, w)["address"]
    port = _free_port()
    args = _router_args([address], tok_dir, port, "--edge", f"max_connections={count + 1024}",
                        "--default-max-tokens", str(MAX_TOKENS),
                        "--token-stall-timeout-s", "300")  # fmt: skip
    snaps = work / "snaps"
    if trace:
        snaps.mkdir(exist_ok=True)
        args = [args[0], "-m", "tests.bench_router.traced_router", str(snaps), *args[3:]]
    router = procs.spawn("router-streams", args, ROUTER_CORE)
    _wait_http(port, "/ready", proc=router)  # a router that failed to start: at once, not 120 s
    time.sleep(1.0)
    idle_mb = _rss_mb(router.pid)
    checkpoints = sorted({c for c in CHECKPOINTS if c < count} | {count})
    snap_files: list[tuple[int, Path]] = []

    def at(n: int, h: Holding) -> dict[str, Any]:
        row = {"target": n, "open": h.started, "failed": h.failed, "lost": h.lost,
               "rss_mb": round(_rss_mb(router.pid), 1),
               "router_cpu_s": round(_cpu_s(router.pid), 1)}  # fmt: skip
        if trace and len(snap_files) < 2:
            snap_files.append((h.started, _snapshot(snaps, f"at-{n}")))
        print(json.dumps(row), flush=True)
        return row

    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        holding, rows = runner.run(hold(port, _chat(port), checkpoints, ramp_per_s, settle_s, at))
    router.terminate()
    w.terminate()
    for p in (router, w):
        p.wait(60)
    result: dict[str, Any] = {
        "streams": count,
        "ramp_per_s": ramp_per_s,
        "interval_s": interval_s,
        "idle_rss_mb": round(idle_mb, 1),
        "checkpoints": rows,
        "failed": holding.failed,
        "lost": holding.lost,
        "statuses": holding.statuses,
        "traced": trace,
    }
    last = rows[-1]
    result["kb_per_stream"] = round((last["rss_mb"] - idle_mb) * 1024 / max(1, last["open"]), 1)
    if len(rows) >= 2 and rows[-1]["open"] > rows[0]["open"]:
        slope = (rows[-1]["rss_mb"] - rows[0]["rss_mb"]) / (rows[-1]["open"] - rows[0]["open"])
        result["kb_per_stream_marginal"] = round(slope * 1024, 1)
    if trace and len(snap_files) == 2:
        (n1, s1), (n2, s2) = snap_files
        result["trace"] = trace_diff(s1, s2, n2 - n1)
    return result


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def report_lines(ss: dict[str, Any]) -> list[str]:
    traced = "traced: RSS inflated by tracemalloc; " if ss["traced"] else ""
    lines = [
        f"slow streams on one router process ({traced}"
        f"ramp {ss['ramp_per_s']:.0f}/s, a token every {ss['interval_s']:.0f} s per stream): "
        f"RSS idle {ss['idle_rss_mb']:.0f} MB; {ss['failed']} failed {ss['statuses']}, "
        f"{ss['lost']} ended early",
        "",
        "| streams asked | open at once | RSS (MB) | KB per open stream above idle |",
        "|---|---|---|---|",
    ]
    for row in ss["checkpoints"]:
        per = (row["rss_mb"] - ss["idle_rss_mb"]) * 1024 / max(1, row["open"])
        lines.append(f"| {row['target']} | {row['open']} | {row['rss_mb']:.0f} | {per:.1f} |")
    if "kb_per_stream_marginal" in ss:
        lines.append("")
        lines.append(f"marginal: {ss['kb_per_stream_marginal']:.1f} KB per stream "
                     "(first to last checkpoint)")  # fmt: skip
    if "trace" in ss:
        lines += ["", "```", *ss["trace"], "```"]
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.bench_router.streams")
    parser.add_argument("--count", type=_at_least(1), default=10000)
    parser.add_argument("--ramp-per-s", type=_at_least(0, float, above=True), default=150.0)
    parser.add_argument("--settle-s", type=_at_least(0, float), default=3.0)
    parser.add_argument("--interval-s", type=_at_least(0, float, above=True), default=20.0)
    parser.add_argument("--trace", action="store_true")
    parser.add_argument("--out", default="out/bench-router-streams.md")
    args = parser.parse_args(argv)
    if (os.cpu_count() or 1) < 2:
        raise SystemExit("needs 2 cores (router on one, client and backend on the other)")
    # a plain `kill` stops the router and the backend too (the finally below; they were left)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    os.sched_setaffinity(0, {LOAD_CORE})
    work = Path(tempfile.mkdtemp(prefix="bench-streams-"))
    cache = Path(os.environ.get("SPLITSERVE_CACHE_DIR", work / "cache"))
    tok_dir = default_tokenizer_dir(cache / "tokenizer")
    procs = Procs(work)
    try:
        result = run(procs, work, tok_dir, args.count, ramp_per_s=args.ramp_per_s,
                     settle_s=args.settle_s, interval_s=args.interval_s,
                     trace=args.trace)  # fmt: skip
    finally:
        procs.stop()
    text = "\n".join(report_lines(result)) + "\n"
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(json.dumps(result))
    print(text)


if __name__ == "__main__":
    main()
