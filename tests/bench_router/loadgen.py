"""A bounded HTTP load generator for streamed OpenAI requests (`make bench-router`).

Closed loop (`concurrency` clients, each on its own keep-alive connection, one request at a
time) or open loop (Poisson arrivals at `rate` per second, each on a free keep-alive connection
or a new one). Both stop sending after `count` requests or `max_s` seconds, whichever comes
first; a request still in flight `grace_s` (`CAP_GRACE_S`) after `max_s` is cut and counted as an
error (`UNFINISHED`), so a stalled server cannot hold a run past its cap.
TTFT is the time from sending a request to its first SSE event; E2E to `data: [DONE]`.
Raw asyncio streams, so the generator's own cost per request stays small.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")

CAP_GRACE_S = 5.0
"""How long past its `max_s` a run waits for the requests in flight (normally milliseconds)."""
ERROR_EVENT = b'data: {"error"'
"""How a stream that failed after its status line ends (an OpenAI error event, then `[DONE]`);
such a request is an error ("error event"), not a finished one (it was counted as done)."""
UNFINISHED = "unfinished at the cap"
"""The status of a request cut at the cap (before, a closed loop waited for it forever and an
open loop dropped it from every count: its p99 and errors were of the finished requests)."""


@dataclass
class Result:
    ttft_s: list[float] = field(default_factory=list)
    e2e_s: list[float] = field(default_factory=list)
    errors: int = 0
    wall_s: float = 0.0
    statuses: dict[str, int] = field(default_factory=dict)
    """Non-200 answers by status line."""
    started_s: float = 0.0
    """`time.monotonic()` when the run started (the same clock in every process on Linux)."""
    cpu_s: float = 0.0
    """CPU time of the load generator process over the run (filled in by `loadproc`)."""

    @property
    def done(self) -> int:
        return len(self.e2e_s)

    def to_json(self) -> dict[str, object]:
        return {"ttft_s": self.ttft_s, "e2e_s": self.e2e_s, "errors": self.errors,
                "wall_s": self.wall_s, "statuses": self.statuses,
                "started_s": self.started_s, "cpu_s": self.cpu_s}  # fmt: skip

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Result:
        return cls(
            ttft_s=[float(x) for x in data["ttft_s"]],
            e2e_s=[float(x) for x in data["e2e_s"]],
            errors=int(data["errors"]),
            wall_s=float(data["wall_s"]),
            statuses={str(k): int(v) for k, v in data["statuses"].items()},
            started_s=float(data["started_s"]),
            cpu_s=float(data["cpu_s"]),
        )


def merge(results: list[Result]) -> Result:
    """Several load generators' results of one run as one: latencies pooled, counts and CPU
    summed, wall time from the earliest start to the latest end (so req/s = done / wall_s is the
    rate all of them together sustained)."""
    if not results:
        return Result()
    out = Result()
    for r in results:
        out.ttft_s += r.ttft_s
        out.e2e_s += r.e2e_s
        out.errors += r.errors
        out.cpu_s += r.cpu_s
        for status, n in r.statuses.items():
            out.statuses[status] = out.statuses.get(status, 0) + n
    out.started_s = min(r.started_s for r in results)
    out.wall_s = max(r.started_s + r.wall_s for r in results) - out.started_s
    return out


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


def request_bytes(port: int, path: str, body: bytes) -> bytes:
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


class _Conn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, port: int) -> _Conn:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 20)
        return cls(reader, writer)

    async def stream(self, raw: bytes, result: Result) -> bool:
        """One request; records its times. False: the connection is no longer usable."""
        start = time.perf_counter()
        self.writer.write(raw)
        head = await self.reader.readuntil(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            result.errors += 1
            status = head.split(b"\r\n", 1)[0].decode("latin-1")
            result.statuses[status] = result.statuses.get(status, 0) + 1
            return False
        first: float | None = None
        failed = False
        buf = b""
        while True:
            data = await self.reader.read(65536)
            if not data:
                result.errors += 1
                return False
            if first is None and b"data: " in data:
                first = time.perf_counter()
            buf = buf[-32:] + data
            failed = failed or ERROR_EVENT in buf
            if b"data: [DONE]" in buf:
                end = time.perf_counter()
                break
        # the chunked terminator may trail the [DONE] event in a later read
        if not buf.endswith(b"0\r\n\r\n"):
            await self.reader.readuntil(b"0\r\n\r\n")
        if failed:
            _error(result, "error event")
            return True
        assert first is not None
        result.ttft_s.append(first - start)
        result.e2e_s.append(end - start)
        return True

    def close(self) -> None:
        self.writer.close()


def _error(result: Result, status: str) -> None:
    result.errors += 1
    result.statuses[status] = result.statuses.get(status, 0) + 1


async def _until(tasks: list[asyncio.Task[None]], timeout_s: float) -> None:
    """Wait for `tasks` at most `timeout_s`, then cancel the rest (each counts its request as
    `UNFINISHED`); a task's own error is raised."""
    if not tasks:
        return
    done, pending = await asyncio.wait(tasks, timeout=max(0.0, timeout_s))
    for task in pending:
        task.cancel()
    if pending:
        await asyncio.wait(pending)
    for task in done:
        task.result()


async def closed_loop(
    port: int,
    raw: bytes,
    concurrency: int,
    count: int,
    max_s: float,
    grace_s: float = CAP_GRACE_S,
) -> Result:
    result = Result()
    issued = 0
    deadline = time.perf_counter() + max_s

    async def client() -> None:
        nonlocal issued
        conn = await _Conn.open(port)
        try:
            while issued < count and time.perf_counter() < deadline:
                issued += 1
                try:
                    ok = await conn.stream(raw, result)
                except asyncio.CancelledError:
                    _error(result, UNFINISHED)
                    raise
                except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as err:
                    _error(result, type(err).__name__)
                    ok = False
                if not ok:
                    conn.close()
                    conn = await _Conn.open(port)
        finally:
            conn.close()

    result.started_s = time.monotonic()
    start = time.perf_counter()
    await _until([asyncio.create_task(client()) for _ in range(concurrency)], max_s + grace_s)
    result.wall_s = time.perf_counter() - start
    return result


async def open_loop(
    port: int, raw: bytes, rate: float, count: int, max_s: float, grace_s: float = CAP_GRACE_S
) -> Result:
    result = Result()
    idle: list[_Conn] = []
    rng = random.Random(1)
    tasks: list[asyncio.Task[None]] = []

    async def one() -> None:
        conn = None
        try:
            conn = idle.pop() if idle else await _Conn.open(port)
            ok = await conn.stream(raw, result)
        except asyncio.CancelledError:
            _error(result, UNFINISHED)
            if conn is not None:
                conn.close()
            raise
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as err:
            _error(result, type(err).__name__)
            ok = False
        if ok and conn is not None:
            idle.append(conn)
        elif conn is not None:
            conn.close()

    start = time.perf_counter()
    next_s = start
    for _ in range(count):
        next_s += rng.expovariate(rate)
        delay = next_s - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if time.perf_counter() - start > max_s:
            break
        tasks.append(asyncio.create_task(one()))
    await _until(tasks, start + max_s + grace_s - time.perf_counter())
    result.wall_s = time.perf_counter() - start
    for conn in idle:
        conn.close()
    return result


async def hold_streams(
    port: int,
    raw: bytes,
    count: int,
    ramp_per_s: float,
    max_s: float,
    at_peak: Callable[[], T],
    statuses: dict[str, int] | None = None,
) -> tuple[int, int, T]:
    """Open `count` streams (`ramp_per_s` new connections a second), each read up to its first
    SSE event and then left open without reading; call `at_peak()` once every stream has
    started (or `max_s` passed), then close them all. Returns (started, failed, at_peak's value).
    """
    started = failed = 0
    conns: list[_Conn] = []
    all_started = asyncio.Event()

    async def one() -> None:
        nonlocal started, failed
        try:
            conn = await _Conn.open(port)
            conns.append(conn)
            conn.writer.write(raw)
            head = await conn.reader.readuntil(b"\r\n\r\n")
            if not head.startswith(b"HTTP/1.1 200"):
                failed += 1
                status = head.split(b"\r\n", 1)[0].decode("latin-1")
                if statuses is not None:
                    statuses[status] = statuses.get(status, 0) + 1
            else:
                while b"data: " not in await conn.reader.read(4096):
                    pass
                started += 1
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as err:
            failed += 1
            if statuses is not None:
                name = type(err).__name__
                statuses[name] = statuses.get(name, 0) + 1
        if started + failed >= count:
            all_started.set()

    deadline = time.perf_counter() + max_s
    tasks = []
    for i in range(count):
        tasks.append(asyncio.create_task(one()))
        if i % 100 == 99:
            await asyncio.sleep(100 / ramp_per_s)
        if time.perf_counter() > deadline:
            break
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(all_started.wait(), max(1.0, deadline - time.perf_counter()))
    value = at_peak()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for conn in conns:
        conn.close()
    return started, failed, value
