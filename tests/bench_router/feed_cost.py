"""What following the workers' feeds costs a router process that serves nothing (issue 17).

    python -m tests.bench_router.feed_cost [--old-src DIR] [--rounds 2] [--seconds 12]
                                           [--py-spy PATH] [--out-dir DIR]

Two zero-delay simulated workers (prefill + decode) and the load generator on core 1; router A
on core 0 carries a closed loop (c=32, 200-token prompts, 16 streamed tokens); idle routers
connected to the same workers (this tree's, and with `--old-src` one running an older `src/`)
serve nothing. Per round and router: CPU seconds from /proc/<pid>/stat over the loaded window,
divided by the requests A finished in it. With `--old-src` the loaded router alternates
between the old and the new tree (interleaved rounds). With `--py-spy` the first idle router of
each kind is profiled (raw folded stacks) for the first round.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from splitserve.router.tokenizer import TextTokenizer, default_tokenizer_dir
from tests.bench_router import loadgen
from tests.bench_router.run import (
    LOAD_CORE,
    ROUTER_CORE,
    Procs,
    _cpu_s,
    _free_port,
    _router_args,
    _router_pythonpath,
    _wait_http,
    chat_body,
    prompt_of,
    start_zero_delay_workers,
)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--old-src", default=None, help="an older src/ for the 'before' routers")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=12.0)
    parser.add_argument("--py-spy", default=None)
    parser.add_argument("--out-dir", default="out/feed-cost")
    args = parser.parse_args()
    os.sched_setaffinity(0, {LOAD_CORE})
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="feed-cost-"))
    cache = Path(os.environ.get("SPLITSERVE_CACHE_DIR", work / "cache"))
    tok_dir = default_tokenizer_dir(cache / "tokenizer")
    tokenizer = TextTokenizer.from_dir(tok_dir)
    procs = Procs(work)
    kinds = {"new": None} if args.old_src is None else {"old": args.old_src, "new": None}
    try:
        workers = list(start_zero_delay_workers(procs, work).values())
        loaded: dict[str, tuple[int, int]] = {}
        idle: dict[str, int] = {}
        for kind, src in kinds.items():
            env = None if src is None else {**os.environ, "PYTHONPATH": _router_pythonpath(src)}
            port = _free_port()
            a = procs.spawn(f"a-{kind}", _router_args(workers, tok_dir, port), ROUTER_CORE, env)
            loaded[kind] = (a.pid, port)
            b_port = _free_port()
            b = procs.spawn(f"b-{kind}", _router_args(workers, tok_dir, b_port), LOAD_CORE, env)
            idle[kind] = b.pid
            _wait_http(port, "/ready")
            _wait_http(b_port, "/ready")
        prompt = prompt_of(tokenizer, 200)
        body = chat_body("bench", prompt)
        rows: list[dict[str, Any]] = []
        for rnd in range(args.rounds):
            for kind, (a_pid, port) in loaded.items():
                raw = loadgen.request_bytes(port, "/v1/chat/completions", body)
                asyncio.run(loadgen.closed_loop(port, raw, 8, 100, 20))  # warm-up
                pids = {f"A-{kind}": a_pid, **{f"B-{k}": p for k, p in idle.items()}}
                spies = []
                if args.py_spy and rnd == 0 and kind == "new":
                    for k, p in idle.items():
                        spies.append(subprocess.Popen(
                            [args.py_spy, "record", "-o", str(out_dir / f"idle-{k}.txt"),
                             "--pid", str(p), "--duration", str(int(args.seconds) - 2),
                             "-r", "200", "--nonblocking", "--format", "raw"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                        ))  # fmt: skip
                cpu0 = {n: _cpu_s(p) for n, p in pids.items()}
                load0 = os.getloadavg()[0]
                t0 = time.monotonic()
                res = asyncio.run(loadgen.closed_loop(port, raw, 32, 10**6, args.seconds))
                wall = time.monotonic() - t0
                cpu = {n: _cpu_s(p) - cpu0[n] for n, p in pids.items()}
                for s in spies:
                    s.wait(60)
                row = {
                    "round": rnd,
                    "loaded": kind,
                    "requests": res.done,
                    "errors": res.errors,
                    "req_per_s": round(res.done / wall, 1),
                    "loadavg_1m": round(load0, 2),
                    **{f"{n}_ms_per_req": round(1000 * c / max(1, res.done), 3)
                       for n, c in cpu.items()},
                    **{f"{n}_core_pct": round(100 * c / wall, 1) for n, c in cpu.items()},
                }  # fmt: skip
                rows.append(row)
                print(json.dumps(row), flush=True)
        (out_dir / "feed-cost.json").write_text(json.dumps(rows, indent=1))
    finally:
        procs.stop()


if __name__ == "__main__":
    main()
