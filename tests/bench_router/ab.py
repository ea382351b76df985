"""Interleaved A/B of two splitserve router trees on the same workers, in the same run.

Both routers are pinned to core 0 (only one is loaded at a time), the zero-delay sim workers and
this load generator to core 1. Rounds alternate A / B (the order flips every round); each round
is a closed loop at concurrency 32 and reports the router's CPU time per request (from
`/proc/PID/stat`) and its throughput, plus the c=1 TTFT p50. Ratios within a run are what to
quote: on a shared machine the absolute figures move with the other tenants.

    python -m tests.bench_router.ab --a-src OLD/src [--rounds 4] [--py-spy PATH --spy-out F]

Without `--a-src` router B (this tree) is measured alone (`--a-src ''`: A is this tree too).
`--concurrency 1 8 32` measures each router at each closed-loop concurrency per round (default
32); a row gives the router's and the load core's busy share of the run's wall time, so a
saturated row says which core capped it. `--backend fake` runs `tests.bench_router.fake_worker`
instead of the zero-delay sim workers (`worker serve --sim-time-scale 0`): the same protocol at
a fraction of the load core's CPU, so the router's own c=32 saturation can be reached on 2 cores;
with `--own-workers`, `--a-backend` / `--b-backend` / `--c-backend` give one router its own kind
(the fairness check of docs/benchmarks.md "Fourteenth pass": the same router on sim and fake
workers in the same rounds).

`--backends N` shares N zero-delay decode workers and two thirds as many prefill ones (all on
the load core) instead of one pair: each router follows every worker's feeds, so the per-worker
cost is in each round's figure (docs/benchmarks.md "Sixteenth pass").

`--own-workers` gives each router its own pair of workers, run from its own tree (and with its
`--a-env` / `--b-env`), so a change on the worker side of the link is compared too; by default
both routers share one pair (from this tree).

`--c-src SRC` (with `--c-arg`, `--c-env`) adds a third router C to the same rounds (the order
flips each round; `''`: this tree), so one run compares B against two baselines.

`--b-arg FLAG` adds a flag to router B's command line (e.g. `--b-arg=--link --b-arg=stream`),
`--a-arg` to A's. `--b-env K=V` sets environment variables of router B only (e.g. a setting to
compare within one tree), `--a-env K=V` those of router A. `--b-processes 2` runs router B as
`router serve --processes 2` with its processes allowed on both cores (the 1 -> 2 process scaling,
with `--a-src` and `--b-src` the same tree); its rows then also give each process's share of B's CPU
time (how evenly SO_REUSEPORT spread the connections and their requests). On a 2-core machine the
second core also runs the load generator and the workers, so that speed-up is a lower bound of what
a free core gives.

`--a-python PATH` / `--b-python PATH` / `--c-python PATH` run that router with another
interpreter (e.g. a Python 3.12 venv's `bin/python` with this project installed: 3.11 against
3.12 on the same tree); the workers and this load generator stay on `sys.executable`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from splitserve.router.tokenizer import TextTokenizer, default_tokenizer_dir
from tests.bench_router import loadgen
from tests.bench_router.layout import Layout, backend_counts
from tests.bench_router.loadgen import percentile
from tests.bench_router.run import (
    BACKENDS,
    LOAD_CORE,
    ROUTER_CORE,
    Procs,
    _at_least,
    _cpu_s,
    _free_port,
    _router_args,
    _router_pythonpath,
    _wait_file,
    _wait_http,
    chat_body,
    prompt_of,
    start_vllm_router,
    start_workers,
    start_zero_delay_workers,
    worker_command,
)


def ignored_options(args: argparse.Namespace) -> str:
    """The first option given for a part this run does not have (each was ignored: a router's
    flags without its --X-src, --X-backend without --own-workers, ...), or ""."""
    for who, src in (("a", args.a_src), ("c", args.c_src)):
        for what in ("env", "arg", "python", "backend"):
            value = getattr(args, f"{who}_{what}")
            if value and src is None:
                return f"--{who}-{what}: router {who.upper()} runs only with --{who}-src"
    for who in "abc":
        if getattr(args, f"{who}_backend") and not args.own_workers:
            return f"--{who}-backend: acts with --own-workers (shared workers use --backend)"
    for who in "abc":
        for kv in getattr(args, f"{who}_env"):
            if "=" not in kv or not kv.partition("=")[0]:
                return f"--{who}-env: {kv!r} is not K=V"
    if args.spy_a and args.a_src is None:
        return "--spy-a: router A runs only with --a-src"
    if args.spy_a and not args.py_spy:
        return "--spy-a: acts with --py-spy"
    if args.low_count is not None and min(args.concurrency) >= 32:
        return "--low-count: acts on a --concurrency under 32"
    return ""


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.bench_router.ab")
    parser.add_argument(
        "--a-src",
        default=None,
        help="src/ directory of router A (before; '' this tree); omitted: router B alone",
    )
    parser.add_argument("--b-src", default=None, help="src/ of router B (default: this tree)")
    parser.add_argument("--a-env", action="append", default=[], help="K=V for router A only")
    parser.add_argument("--b-env", action="append", default=[], help="K=V for router B only")
    parser.add_argument("--a-arg", action="append", default=[], help="router A's extra flag")
    parser.add_argument("--b-arg", action="append", default=[], help="router B's extra flag")
    parser.add_argument(
        "--c-src",
        default=None,
        help="a third router C in the same rounds (its src/; '' this tree), e.g. another baseline",
    )
    parser.add_argument("--c-env", action="append", default=[], help="K=V for router C only")
    parser.add_argument("--c-arg", action="append", default=[], help="router C's extra flag")
    for who in "abc":
        parser.add_argument(
            f"--{who}-python",
            default=None,
            help=f"interpreter of router {who.upper()} (default: this one; workers stay on it)",
        )
    parser.add_argument(
        "--b-processes",
        type=_at_least(1),
        default=1,
        help="router B as `--processes N` on both cores",
    )
    parser.add_argument(
        "--own-workers",
        action="store_true",
        help="each router its own zero-delay workers, from its own tree (compares worker changes)",
    )
    parser.add_argument(
        "--backend",
        choices=BACKENDS,
        default="sim",
        help="the zero-delay workers: sim (`worker serve`) or fake (tests.bench_router.fake_worker)"
        " (with --own-workers, --a-backend / --b-backend / --c-backend set one router's)",
    )
    for who in "abc":
        parser.add_argument(f"--{who}-backend", choices=BACKENDS, default=None)
    parser.add_argument(
        "--concurrency",
        type=_at_least(1),
        nargs="+",
        default=[32],
        help="closed-loop concurrencies measured each round (the first c=1 TTFT run aside)",
    )
    parser.add_argument(
        "--backends",
        type=int,
        default=None,
        help="N zero-delay decode workers and two thirds as many prefill ones, shared by the "
        "routers, all on the load core (run.py's --backends; default: one of each). Not with "
        "--own-workers",
    )
    parser.add_argument("--rounds", type=_at_least(1), default=4)
    parser.add_argument("--count", type=_at_least(1), default=1500, help="requests per c=32 round")
    parser.add_argument(
        "--low-count",
        type=_at_least(1),
        default=None,
        help="requests per run at a --concurrency under 32 (default: --count)",
    )
    parser.add_argument("--prompt-tokens", type=_at_least(1), default=200)
    parser.add_argument(
        "--max-tokens", type=_at_least(1), default=16, help="streamed tokens per request"
    )
    parser.add_argument("--py-spy", default=None)
    parser.add_argument("--spy-out", default="out/ab-spy-b.txt")
    parser.add_argument("--spy-a", action="store_true", help="profile router A instead of B")
    parser.add_argument(
        "--vllm-router", default=None, help="also vllm-router (P/D over fake backends) as V"
    )
    args = parser.parse_args()
    unused = ignored_options(args)
    if unused:
        parser.error(unused)
    if args.backends is not None and args.own_workers:
        parser.error("--backends: only with shared workers (not with --own-workers)")
    if args.backends is not None and args.backends < 1:
        parser.error("--backends must be >= 1")
    os.sched_setaffinity(0, {LOAD_CORE})
    work = Path(tempfile.mkdtemp(prefix="bench-router-ab-"))
    cache = Path(os.environ.get("SPLITSERVE_CACHE_DIR", work / "cache"))
    tok_dir = default_tokenizer_dir(cache / "tokenizer")
    tokenizer = TextTokenizer.from_dir(tok_dir)
    procs = Procs(work)
    try:
        if args.own_workers:
            shared: list[str] = []
        elif args.backends is not None:
            one_core = Layout((ROUTER_CORE,), (LOAD_CORE,), (LOAD_CORE,))
            n_prefill, n_decode = backend_counts(one_core, args.backends)
            by_role = start_workers(procs, work, one_core, n_prefill, n_decode, args.backend)
            shared = by_role["prefill"] + by_role["decode"]
        else:
            shared = list(start_zero_delay_workers(procs, work, args.backend).values())
        routers: dict[str, tuple[int, int]] = {}
        backends: dict[str, str] = {}
        pythons: dict[str, str] = {}
        pids_of: dict[str, list[int]] = {}
        """Every process of a router (B with `--b-processes`: its children, not the supervisor)."""
        contenders = [("B", args.b_src, args.b_env, args.b_arg)]
        if args.a_src is not None:
            contenders.insert(0, ("A", args.a_src, args.a_env, args.a_arg))
        if args.c_src is not None:
            contenders.append(("C", args.c_src or None, args.c_env, args.c_arg))
        for name, src, extra, flags in contenders:
            env = dict(os.environ)
            if src:
                env["PYTHONPATH"] = _router_pythonpath(src)
            for kv in extra:
                k, _, v = kv.partition("=")
                env[k] = v
            backend = getattr(args, f"{name.lower()}_backend") or args.backend
            backends[name] = backend if args.own_workers else args.backend
            workers = shared or _own_workers(procs, work, name, env, backend)
            port = _free_port()
            more: list[str] = list(flags)
            ready = work / f"router-{name}.json"
            if name == "B" and args.b_processes > 1:
                more += ["--processes", str(args.b_processes), "--ready-file", str(ready)]
            command = _router_args(workers, tok_dir, port, *more)
            python = getattr(args, f"{name.lower()}_python")
            if python:
                command[0] = python
            pythons[name] = command[0]
            proc = procs.spawn(f"router-{name}", command, ROUTER_CORE, env)
            pids_of[name] = [proc.pid]
            if name == "B" and args.b_processes > 1:
                pids_of[name] = [int(p) for p in _wait_file(ready, proc)["pids"]]
                for pid in pids_of[name]:
                    os.sched_setaffinity(pid, {ROUTER_CORE, LOAD_CORE})
            _wait_http(port, "/ready")
            routers[name] = (port, pids_of[name][0])
        prompt = prompt_of(tokenizer, args.prompt_tokens)
        raw = {
            n: loadgen.request_bytes(
                port, "/v1/chat/completions", chat_body("bench", prompt, args.max_tokens)
            )
            for n, (port, _) in routers.items()
        }
        if args.vllm_router:
            peer, peer_port, _ = start_vllm_router(procs, args.vllm_router)
            routers["V"] = (peer_port, peer.pid)
            pids_of["V"] = [peer.pid]
            raw["V"] = loadgen.request_bytes(
                peer_port, "/v1/chat/completions", chat_body("m", prompt, args.max_tokens)
            )
        for n, (port, _) in routers.items():
            asyncio.run(loadgen.closed_loop(port, raw[n], 8, 300, 30))  # warm-up
        rows: dict[str, list[dict[str, Any]]] = {n: [] for n in routers}
        for r in range(args.rounds):
            order = tuple(routers) if r % 2 == 0 else tuple(reversed(routers))
            for n in order:
                port, pid = routers[n]
                one = asyncio.run(loadgen.closed_loop(port, raw[n], 1, 200, 30))
                spy = None
                if args.py_spy and r == 1 and n == ("A" if args.spy_a else "B"):
                    spy = subprocess.Popen(
                        [args.py_spy, "record", "-o", args.spy_out, "--pid", str(pid),
                         "--duration", "8", "-r", "200", "--nonblocking", "--format", "raw"],
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                    )  # fmt: skip
                for conc in args.concurrency:
                    ttft0 = _router_ttft(port) if n != "V" else None
                    cpu0 = [_cpu_s(p) for p in pids_of[n]]
                    wnames = (
                        procs.names(f"{n}-") if not shared else procs.names("prefill-", "decode-")
                    )
                    wpids = [procs.named[w].pid for w in wnames]
                    each_w0 = [_cpu_s(p) for p in wpids]
                    g0 = time.process_time()
                    count = args.count if conc >= 32 or args.low_count is None else args.low_count
                    sat = asyncio.run(loadgen.closed_loop(port, raw[n], conc, count, 30))
                    each = [_cpu_s(p) - c0 for p, c0 in zip(pids_of[n], cpu0, strict=True)]
                    cpu = sum(each)
                    # The load core's other tenants: the workers and this load generator (c=32
                    # is capped there with the sim workers; their CPU per request says how much
                    # of it a router's link costs).
                    each_w = [_cpu_s(p) - c0 for p, c0 in zip(wpids, each_w0, strict=True)]
                    wcpu = sum(each_w)
                    gcpu = time.process_time() - g0
                    ttft1 = _router_ttft(port) if ttft0 is not None else None
                    if spy is not None:
                        spy.wait(60)
                        spy = None
                    row = {
                        "round": r,
                        "router": n,
                        "c": conc,
                        "cpu_ms_per_req": round(cpu / max(1, sat.done) * 1e3, 3),
                        "rps": round(sat.done / sat.wall_s, 1),
                        "errors": sat.errors,
                        "ttft_p50_ms_c1": round(percentile(one.ttft_s, 50) * 1e3, 2),
                        "ttft_p99_ms_c1": round(percentile(one.ttft_s, 99) * 1e3, 2),
                        f"ttft_p50_ms_c{conc}": round(percentile(sat.ttft_s, 50) * 1e3, 2),
                        f"ttft_p99_ms_c{conc}": round(percentile(sat.ttft_s, 99) * 1e3, 2),
                        f"ttft_p90_ms_c{conc}": round(percentile(sat.ttft_s, 90) * 1e3, 2),
                        # the router's core and the load core, busy over the run (%): which one
                        # capped the throughput
                        "router_busy_pct": round(cpu / max(sat.wall_s, 1e-9) * 100, 1),
                        "load_core_busy_pct": round((wcpu + gcpu) / max(sat.wall_s, 1e-9) * 100, 1),
                        "worker_cpu_ms_per_req": round(wcpu / max(1, sat.done) * 1e3, 3),
                        "loadgen_cpu_ms_per_req": round(gcpu / max(1, sat.done) * 1e3, 3),
                        # each worker process apart (step 1 of the fourteenth pass: what the load
                        # core spends per request, and on what)
                        "worker_cpu_ms_per_req_each": {
                            w: round(c / max(1, sat.done) * 1e3, 3)
                            for w, c in zip(wnames, each_w, strict=True)
                        },
                        "load": round(os.getloadavg()[0], 1),
                    }
                    if ttft0 is not None and ttft1 is not None:
                        # Where the c=32 tail is: the share of requests over 25 / 50 ms as the
                        # client saw it and as the router did (its TTFT histogram: arrival to the
                        # first token leaving the dispatcher; its buckets are that coarse).
                        done = max(1, len(sat.ttft_s))
                        row["over_25_50ms_client"] = [
                            round(sum(t > lim for t in sat.ttft_s) / done, 4)
                            for lim in (0.025, 0.05)
                        ]
                        n_r = max(1.0, ttft1["count"] - ttft0["count"])
                        row["over_25_50ms_router"] = [
                            round(1 - (ttft1[le] - ttft0[le]) / n_r, 4) for le in ("0.025", "0.05")
                        ]
                        # loop-lag samples over 25 ms / samples (a stall shows when a sample
                        # falls in it)
                        lag_n = ttft1["lag_count"] - ttft0["lag_count"]
                        row["loop_lag_over_25ms"] = [
                            round(lag_n - (ttft1["lag_0.025"] - ttft0["lag_0.025"])),
                            round(lag_n),
                        ]
                    if len(each) > 1:
                        row["cpu_share"] = [round(c / max(cpu, 1e-9), 3) for c in each]
                    rows[n].append(row)
                    print(json.dumps(row), flush=True)
        for conc in args.concurrency:
            at = {n: [x for x in v if x["c"] == conc] for n, v in rows.items()}
            mean = {n: sum(x["cpu_ms_per_req"] for x in v) / len(v) for n, v in at.items()}
            cpus = {n: sorted(x["cpu_ms_per_req"] for x in v) for n, v in at.items()}
            print(
                json.dumps(
                    {
                        "c": conc,
                        "prompt_tokens": args.prompt_tokens,
                        "max_tokens": args.max_tokens,
                        "backend": backends,
                        "python": pythons,
                        "cpu_ms_mean": {n: round(m, 3) for n, m in mean.items()},
                        "cpu_ms_median": {n: round(_median(v), 3) for n, v in cpus.items()},
                        "cpu_ms_range": {n: [v[0], v[-1]] for n, v in cpus.items()},
                        "rps_mean": {
                            n: round(sum(x["rps"] for x in v) / len(v), 1) for n, v in at.items()
                        },
                        "router_busy_pct_mean": {
                            n: round(sum(x["router_busy_pct"] for x in v) / len(v), 1)
                            for n, v in at.items()
                        },
                        "cpu_ratio_b_over_a": (
                            round(mean["B"] / mean["A"], 3) if "A" in mean else None
                        ),
                        "cpu_ratio_b_over_v": (
                            round(mean["B"] / mean["V"], 2) if "V" in mean else None
                        ),
                        "cpu_ratio_b_over_c": (
                            round(mean["B"] / mean["C"], 3) if "C" in mean else None
                        ),
                        "rps_ratio_b_over_a": (
                            round(
                                sum(x["rps"] for x in at["B"]) / sum(x["rps"] for x in at["A"]), 3
                            )
                            if "A" in at
                            else None
                        ),
                    }
                ),
                flush=True,
            )
    finally:
        procs.stop()


def _median(values: list[float]) -> float:
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def _router_ttft(port: int) -> dict[str, float]:
    """The router's TTFT histogram, summed over its labels: the cumulative counts at 25 and
    50 ms and the total (`splitserve_router_ttft_seconds`, from its `/metrics`); and its
    event-loop lag samples (one every 0.25 s), at most 25 ms and in all."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out = {"0.025": 0.0, "0.05": 0.0, "count": 0.0, "lag_0.025": 0.0, "lag_count": 0.0}
    for line in text.splitlines():
        if line.startswith('splitserve_router_event_loop_lag_seconds_bucket{le="0.025"}'):
            out["lag_0.025"] = float(line.rsplit(" ", 1)[1])
        elif line.startswith("splitserve_router_event_loop_lag_seconds_count"):
            out["lag_count"] = float(line.rsplit(" ", 1)[1])
        if line.startswith("splitserve_router_ttft_seconds_bucket{"):
            for le in ("0.025", "0.05"):
                if f'le="{le}"' in line:
                    out[le] += float(line.rsplit(" ", 1)[1])
        elif line.startswith("splitserve_router_ttft_seconds_count{"):
            out["count"] += float(line.rsplit(" ", 1)[1])
    return out


def _own_workers(
    procs: Procs, work: Path, name: str, env: dict[str, str], backend: str = "sim"
) -> list[str]:
    """A zero-delay prefill and decode worker (`backend`) of router `name`, run with its
    environment (its tree's `PYTHONPATH`) on the load core: their addresses, prefill first."""
    addresses = []
    for role in ("prefill", "decode"):
        ready = work / f"{name}-{role}.json"
        proc = procs.spawn(f"{name}-{role}", worker_command(backend, role, ready), LOAD_CORE, env)
        addresses.append(str(_wait_file(ready, proc)["address"]))
    return addresses


if __name__ == "__main__":
    main()
