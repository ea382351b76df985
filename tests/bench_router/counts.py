"""Call counts per request of one router tree under cProfile (issue 17's per-chunk path).

The `ab.py` set-up (zero-delay sim workers, SLO classes and admission on, router pinned to core 0,
200-token prompts), the router run as `python -m cProfile -o FILE -m splitserve router serve`;
after a warm-up, `--count` streamed chat requests at c=32, then the router is stopped (SIGTERM:
it exits normally and cProfile writes its file) and the calls of the functions of the per-chunk
path are printed per request. cProfile counts every resumption of a coroutine or generator as a
call, so `MuxStream.read` counts the request task's wake-ups at a token's read and
`stream_body` the body's resumptions. Counts only: cProfile's times are inflated.

    python -m tests.bench_router.counts [--src TREE/src] [--env K=V] [--arg=--link --arg=stream]
        [--count 2000]
        [--max-tokens 16] [--top 25] [--prof-out FILE]

`--top N` also prints the N largest self-time shares grouped by source file (cProfile's own
overhead inflates every call alike, so the shares are indicative, not CPU times); running once
with `--max-tokens 1` and once with 16 splits the per-request fixed cost from the per-token one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pstats
import shutil
import sys
import tempfile
from pathlib import Path

from splitserve.router.tokenizer import TextTokenizer, default_tokenizer_dir
from tests.bench_router import loadgen
from tests.bench_router.run import (
    BACKENDS,
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

FUNCTIONS = (
    ("mux.py", "read"),  # MuxStream.read: the request task at a token's read
    ("mux.py", "_push"),
    ("mux.py", "_read"),  # MuxLink._read: a Multiplex message read (gRPC link)
    ("mux.py", "_received"),  # StreamLink._received: a socket read (stream link)
    ("mux.py", "_handle"),  # one MuxResponse's events handed out (either link)
    ("mux.py", "_write"),  # MuxLink._write: the gRPC link's writer task resumptions
    ("mux.py", "_write_pending"),  # StreamLink: a frame of ops written
    ("fast_lane.py", "offer"),
    ("dispatch.py", "chunks"),
    ("dispatch.py", "_decode_any"),
    ("generation.py", "stream"),
    ("openai_stream.py", "stream_body"),
    ("http_sse.py", "__call__"),
    ("http_sse.py", "write"),
    ("http_sse.py", "write_chunk_now"),
    ("detokenizer.py", "push"),
    ("step_model.py", "observe_parts"),  # one step sample of a worker's step feed
    ("pool_view.py", "_take"),  # one load report
)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--src", default=None, help="src/ of the router (default: this tree)")
    parser.add_argument("--env", action="append", default=[], help="K=V for the router")
    parser.add_argument("--arg", action="append", default=[], help="a flag for the router")
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument(
        "--backend", choices=BACKENDS, default="sim", help="the zero-delay workers: sim or fake"
    )
    parser.add_argument("--prompt-tokens", type=int, default=200)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--top", type=int, default=0, help="print the N largest self-time files")
    parser.add_argument("--prof-out", default=None, help="keep the cProfile file here")
    args = parser.parse_args()
    os.sched_setaffinity(0, {LOAD_CORE})
    work = Path(tempfile.mkdtemp(prefix="bench-router-counts-"))
    cache = Path(os.environ.get("SPLITSERVE_CACHE_DIR", work / "cache"))
    tok_dir = default_tokenizer_dir(cache / "tokenizer")
    tokenizer = TextTokenizer.from_dir(tok_dir)
    procs = Procs(work)
    prof = work / "router.prof"
    try:
        workers = list(start_zero_delay_workers(procs, work, args.backend).values())
        env = dict(os.environ)
        if args.src:
            env["PYTHONPATH"] = _router_pythonpath(args.src)
        for kv in args.env:
            k, _, v = kv.partition("=")
            env[k] = v
        port = _free_port()
        cmd = _router_args(workers, tok_dir, port, *args.arg)
        cmd = [sys.executable, "-m", "cProfile", "-o", str(prof), *cmd[1:]]
        router = procs.spawn("router", cmd, ROUTER_CORE, env)
        _wait_http(port, "/ready", 120)
        raw = loadgen.request_bytes(
            port,
            "/v1/chat/completions",
            chat_body("bench", prompt_of(tokenizer, args.prompt_tokens), args.max_tokens),
        )
        asyncio.run(loadgen.closed_loop(port, raw, 8, 300, 60))  # warm-up
        sat = asyncio.run(loadgen.closed_loop(port, raw, args.concurrency, args.count, 60))
        total = 300 + sat.done
        router.terminate()
        router.wait(60)
    finally:
        procs.stop()
    stats = pstats.Stats(str(prof))
    counts: dict[str, float] = {}
    for (file, _, name), (_, ncalls, *_) in stats.stats.items():  # type: ignore[attr-defined]
        for want_file, want_name in FUNCTIONS:
            if file.endswith("/" + want_file) and name == want_name:
                key = f"{want_file}:{name}"
                counts[key] = counts.get(key, 0) + ncalls
    per_request = {k: round(v / total, 2) for k, v in sorted(counts.items())}
    out = {"requests": total, "errors": sat.errors, "rps": round(sat.done / sat.wall_s, 1)}
    print(json.dumps({**out, "per_request": per_request}))
    if args.prof_out:
        shutil.copyfile(prof, args.prof_out)
    if args.top:
        print(json.dumps(self_time_by_file(stats, args.top), indent=1))


def self_time_by_file(stats: pstats.Stats, top: int) -> dict[str, float]:
    """Share of all self time per source file (the last two path parts), largest `top` first."""
    by_file: dict[str, float] = {}
    for (file, _, _), (_, _, tottime, *_) in stats.stats.items():  # type: ignore[attr-defined]
        key = "/".join(Path(file).parts[-2:]) if file.startswith("/") else file
        by_file[key] = by_file.get(key, 0.0) + tottime
    whole = sum(by_file.values()) or 1.0
    ranked = sorted(by_file.items(), key=lambda kv: -kv[1])[:top]
    return {k: round(v / whole, 3) for k, v in ranked}


if __name__ == "__main__":
    main()
