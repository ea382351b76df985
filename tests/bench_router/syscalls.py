"""System calls per streamed request on the router's HTTP side, for router trees A and B.

Counts (with `strace -f` on the router process) the `write`s of response bytes (the status line
and headers, or chunked SSE events) and the `setsockopt`s per request, over a closed loop of
streamed chat requests (16 tokens, zero-delay sim workers, as `ab.py`). Counts, unlike CPU time,
do not move with the other tenants of a shared machine; what one such call costs is measured
apart (`docs/benchmarks.md`, router section). Needs `strace` and ptrace permission.

    python -m tests.bench_router.syscalls --a-src OLD/src [--b-src NEW/src] [--count 100]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import re
import subprocess
import tempfile
import time
from pathlib import Path

from splitserve.router.tokenizer import TextTokenizer, default_tokenizer_dir
from tests.bench_router import loadgen
from tests.bench_router.run import (
    LOAD_CORE,
    ROUTER_CORE,
    Procs,
    _free_port,
    _router_args,
    _router_pythonpath,
    _wait_http,
    chat_body,
    prompt_of,
    start_zero_delay_workers,
)

_CALL = re.compile(r'^\d+\s+(\w+)\((\d+), (?:"((?:[^"\\]|\\.){0,16}))?')
_CHUNK = re.compile(r"^[0-9a-f]+\\r\\n")


def _kind(call: str, data: str) -> str | None:
    if call == "setsockopt":
        return "setsockopt"
    if call != "write":
        return None
    if data.startswith("HTTP/1.1"):
        return "http write (head)"
    if _CHUNK.match(data):
        return "http write (events)"
    return None


def measure(
    procs: Procs, work: Path, name: str, src: str | None, workers: list[str], tok_dir: Path,
    prompt: str, n: int,
) -> dict[str, float]:  # fmt: skip
    env = dict(os.environ)
    if src:
        env["PYTHONPATH"] = _router_pythonpath(src)
    port = _free_port()
    router = procs.spawn(f"router-{name}", _router_args(workers, tok_dir, port), ROUTER_CORE, env)
    _wait_http(port, "/ready")
    raw = loadgen.request_bytes(port, "/v1/chat/completions", chat_body("bench", prompt))
    asyncio.run(loadgen.closed_loop(port, raw, 4, 100, 30))  # warm-up
    trace = work / f"strace-{name}.txt"
    spy = subprocess.Popen(
        ["strace", "-f", "-e", "trace=write,setsockopt", "-s", "16", "-o", str(trace),
         "-p", str(router.pid)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    time.sleep(1.5)  # attached to every thread
    result = asyncio.run(loadgen.closed_loop(port, raw, 4, n, 120))
    spy.terminate()
    spy.wait(30)
    router.terminate()
    counts: collections.Counter[str] = collections.Counter()
    for line in trace.read_text().splitlines():
        m = _CALL.match(line)
        if m is not None and (kind := _kind(m.group(1), m.group(3) or "")) is not None:
            counts[kind] += 1
    done = max(1, result.done)
    row = {k: round(v / done, 2) for k, v in sorted(counts.items())}
    row["http writes"] = round(
        (counts["http write (head)"] + counts["http write (events)"]) / done, 2
    )
    print(name, {"requests": result.done, "errors": result.errors, **row}, flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--a-src", required=True, help="src/ directory of router A (before)")
    parser.add_argument("--b-src", default=None, help="src/ of router B (default: this tree)")
    parser.add_argument("--count", type=int, default=100, help="requests traced per router")
    parser.add_argument("--prompt-tokens", type=int, default=200)
    args = parser.parse_args()
    os.sched_setaffinity(0, {LOAD_CORE})
    work = Path(tempfile.mkdtemp(prefix="bench-router-syscalls-"))
    cache = Path(os.environ.get("SPLITSERVE_CACHE_DIR", work / "cache"))
    tok_dir = default_tokenizer_dir(cache / "tokenizer")
    prompt = prompt_of(TextTokenizer.from_dir(tok_dir), args.prompt_tokens)
    procs = Procs(work)
    try:
        workers = list(start_zero_delay_workers(procs, work).values())
        for name, src in (("A", args.a_src), ("B", args.b_src)):
            measure(procs, work, name, src, workers, tok_dir, prompt, args.count)
    finally:
        procs.stop()


if __name__ == "__main__":
    main()
