"""`make bench-router`: the router's added latency, CPU and throughput, beside vllm-router's.

Machine layout (needs 2+ cores): the router under test is pinned to core 0; the load generator
(this process), the backends and everything else to core 1. Each router is measured against
talking to its backend directly (the splitserve decode worker over gRPC; vllm-router's fake
decode backend over HTTP) with the same requests: streamed chat completions of 16 tokens.

    python -m tests.bench_router.run --vllm-router PATH [--py-spy PATH] [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import grpc

from splitserve._gen.v1 import common_pb2, worker_pb2, worker_pb2_grpc
from splitserve.router.tokenizer import TextTokenizer, default_tokenizer_dir
from tests.bench_router import loadgen
from tests.bench_router.loadgen import Result, percentile

ROUTER_CORE = 0
LOAD_CORE = 1
TOKENS = 16
RATES = (50, 100, 200, 400, 800)
SLO_ARGS = (
    "--slo-class", "interactive:ttftMs=1000,tpotMs=100,priority=10",
    "--slo-class", "batch:ttftMs=10000,tpotMs=500,sheddable=true",
    "--default-slo-class", "interactive",
)  # fmt: skip
"""SLO classes (and admission, on by default) as a service would run them: requests without
`x-slo-class` are `interactive`."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class Procs:
    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.procs: list[subprocess.Popen[bytes]] = []

    def spawn(
        self, name: str, args: list[str], core: int, env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        with (self.logs / f"{name}.log").open("wb") as out:
            proc = subprocess.Popen(
                ["taskset", "-c", str(core), *args], stdout=out, stderr=out, env=env
            )
        self.procs.append(proc)
        return proc

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


def start_vllm_router(procs: Procs, binary: str) -> tuple[subprocess.Popen[bytes], int, int]:
    """vllm-router in P/D mode in front of the fake OpenAI prefill / decode servers, ready:
    (its process, its port, the fake decode server's port)."""
    fake_p, fake_d, peer_port = _free_port(), _free_port(), _free_port()
    procs.spawn("fake-openai", [sys.executable, "-m", "tests.bench_router.fake_openai",
                                str(fake_p), str(fake_d)], LOAD_CORE)  # fmt: skip
    _wait_http(fake_d)
    peer = procs.spawn(
        "vllm-router",
        [binary, "--vllm-pd-disaggregation", "--prefill",
         f"http://127.0.0.1:{fake_p}", "--decode", f"http://127.0.0.1:{fake_d}",
         "--host", "127.0.0.1", "--port", str(peer_port), "--policy", "round_robin",
         "--log-level", "warning"],
        ROUTER_CORE,
    )  # fmt: skip
    _wait_http(peer_port)
    return peer, peer_port, fake_d


def _wait_file(path: Path, proc: subprocess.Popen[bytes], timeout_s: float = 120) -> Any:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"{path.name}: not ready (see the logs beside it)")
        time.sleep(0.1)
    return json.loads(path.read_text())


def start_zero_delay_workers(procs: Procs, work: Path) -> dict[str, str]:
    """A zero-delay simulated prefill and decode worker on the load core: role -> address."""
    workers = {}
    for role in ("prefill", "decode"):
        ready = work / f"{role}.json"
        p = procs.spawn(
            role,
            [sys.executable, "-m", "splitserve", "worker", "serve", "--role", role,
             "--sim-time-scale", "0", "--ready-file", str(ready)],
            LOAD_CORE,
        )  # fmt: skip
        workers[role] = _wait_file(ready, p)["address"]
    return workers


def _wait_http(port: int, path: str = "/health", timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
                s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
                if s.recv(64).startswith(b"HTTP/1.1 200"):
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"port {port} never answered {path}")


def chat_body(model: str, prompt: str) -> bytes:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": TOKENS,
        "stream": True,
        "ignore_eos": True,
    }
    return json.dumps(body).encode()


def prompt_of(tokenizer: TextTokenizer, num_tokens: int) -> str:
    words = "the router places each request on a prefill and a decode worker and streams it "
    text = ""
    while len(tokenizer.encode(text)) < num_tokens:
        text += words
    return text


async def _grpc_direct(address: str, ids: list[int], count: int) -> Result:
    """TTFT and E2E of Generate straight to a worker (the baseline for splitserve)."""
    result = Result()
    async with grpc.aio.insecure_channel(address) as channel:
        stub = worker_pb2_grpc.WorkerStub(channel)
        start_all = time.perf_counter()
        for i in range(count):
            req = worker_pb2.GenerateRequest(
                request_id=f"direct-{i}",
                prompt_token_ids=ids,
                sampling=common_pb2.SamplingParams(max_tokens=TOKENS, ignore_eos=True),
            )
            start = time.perf_counter()
            first = None
            async for _ in stub.Generate(req):
                if first is None:
                    first = time.perf_counter()
            assert first is not None
            result.ttft_s.append(first - start)
            result.e2e_s.append(time.perf_counter() - start)
        result.wall_s = time.perf_counter() - start_all
    return result


Runner = Callable[[], Coroutine[Any, Any, Result]]


def measure(
    name: str,
    port: int,
    pid: int,
    raw: bytes,
    direct: Runner,
    py_spy: str | None,
    out_dir: Path,
    rates: tuple[int, ...] = RATES,
    flame_format: str = "flamegraph",
) -> dict[str, Any]:
    """Every figure for one router: c=1 TTFT, saturated throughput and CPU, Poisson rates."""
    run = asyncio.run
    run(loadgen.closed_loop(port, raw, 4, 200, 30))  # warm-up
    base = run(direct())
    one = run(loadgen.closed_loop(port, raw, 1, 400, 60))
    cpu0 = _cpu_s(pid)
    spy = None
    if py_spy is not None:
        suffix = "svg" if flame_format == "flamegraph" else "txt"
        svg = out_dir / f"flame-{name}.{suffix}"
        spy = subprocess.Popen(
            [py_spy, "record", "-o", str(svg), "--pid", str(pid), "--duration", "8", "-r", "200",
             "--nonblocking", "--format", flame_format],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
    sat = run(loadgen.closed_loop(port, raw, 32, 4000, 30))
    cpu = _cpu_s(pid) - cpu0
    if spy is not None:
        spy.wait(60)
    by_rate = {}
    for rate in rates:
        r = run(loadgen.open_loop(port, raw, rate, int(rate * 6), 15))
        by_rate[rate] = (percentile(r.ttft_s, 99), r.errors, r.done)
    base_p50 = percentile(base.ttft_s, 50)
    base_p99 = percentile(base.ttft_s, 99)
    ok_rates = [r for r, (p99, err, _) in by_rate.items() if err == 0 and p99 - base_p99 <= 0.010]
    return {
        "name": name,
        "added_p50_ms": (percentile(one.ttft_s, 50) - base_p50) * 1e3,
        "added_p99_ms": (percentile(one.ttft_s, 99) - base_p99) * 1e3,
        "direct_p50_ms": base_p50 * 1e3,
        "cpu_ms_per_req": cpu / max(1, sat.done) * 1e3,
        "sat_rps": sat.done / sat.wall_s,
        "sat_errors": sat.errors,
        "sat_statuses": sat.statuses,
        "rss_mb": _rss_mb(pid),
        "best_rate": max(ok_rates, default=0),
        "rates": {r: round((p99 - base_p99) * 1e3, 2) for r, (p99, _, _) in by_rate.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--vllm-router", default=None, help="vllm-router executable (peer)")
    parser.add_argument("--py-spy", default=None)
    parser.add_argument("--out", default="out/bench-router.md")
    parser.add_argument("--prompt-tokens", type=int, nargs="*", default=[200, 1024])
    parser.add_argument(
        "--rates", type=int, nargs="*", default=list(RATES), help="Poisson rates (none: skip)"
    )
    parser.add_argument(
        "--scaling",
        action="store_true",
        help="also run `router serve --processes 2` on both cores: the 1 -> 2 core figure",
    )
    parser.add_argument(
        "--slow-streams",
        type=int,
        default=10000,
        help="concurrent slow streams held open on one router process for its RSS (0: skip)",
    )
    parser.add_argument(
        "--flame-format", default="flamegraph", help="py-spy output format (flamegraph, raw)"
    )
    parser.add_argument(
        "--router-src",
        default=None,
        help="run the splitserve router from this src/ directory (e.g. an older tree from "
        "`git archive`) to compare before / after; the workers stay this tree's",
    )
    args = parser.parse_args()
    if (os.cpu_count() or 1) < 2:
        raise SystemExit("bench-router needs 2 cores (router on one, load on the other)")
    os.sched_setaffinity(0, {LOAD_CORE})
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench-router-"))
    cache = Path(os.environ.get("SPLITSERVE_CACHE_DIR", work / "cache"))
    tok_dir = default_tokenizer_dir(cache / "tokenizer")
    tokenizer = TextTokenizer.from_dir(tok_dir)
    py = sys.executable
    procs = Procs(work)
    rows: list[dict[str, Any]] = []
    try:
        # splitserve: zero-delay sim prefill + decode workers, the router on its own core.
        workers = start_zero_delay_workers(procs, work)
        http_port = _free_port()
        router_env = None
        if args.router_src:
            router_env = {**os.environ, "PYTHONPATH": str(Path(args.router_src).resolve())}
        router = procs.spawn(
            "router",
            [py, "-m", "splitserve", "router", "serve", "--worker", workers["prefill"],
             "--worker", workers["decode"], "--model", "bench", "--tokenizer", str(tok_dir),
             "--port", str(http_port), "--grpc-port", "0", "--log-level", "WARNING", *SLO_ARGS],
            ROUTER_CORE,
            router_env,
        )  # fmt: skip
        _wait_http(http_port, "/ready")
        peer_port = fake_d = 0
        peer = None
        if args.vllm_router:
            peer, peer_port, fake_d = start_vllm_router(procs, args.vllm_router)
        for num_tokens in args.prompt_tokens:
            prompt = prompt_of(tokenizer, num_tokens)
            ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}])
            ours_raw = loadgen.request_bytes(http_port, "/v1/chat/completions",
                                             chat_body("bench", prompt))  # fmt: skip

            def direct_grpc(ids: list[int] = ids) -> Coroutine[Any, Any, Result]:
                return _grpc_direct(workers["decode"], ids, 400)

            row = measure(f"splitserve-{num_tokens}", http_port, router.pid, ours_raw,
                          direct_grpc, args.py_spy, out.parent, tuple(args.rates),
                          args.flame_format)  # fmt: skip
            row["prompt_tokens"] = num_tokens
            rows.append(row)
            print(json.dumps(row), flush=True)
            if peer is not None:
                body = chat_body("m", prompt)
                peer_raw = loadgen.request_bytes(peer_port, "/v1/chat/completions", body)
                direct_raw = loadgen.request_bytes(fake_d, "/v1/chat/completions", body)

                def direct_http(raw: bytes = direct_raw) -> Coroutine[Any, Any, Result]:
                    return loadgen.closed_loop(fake_d, raw, 1, 400, 60)

                row = measure(f"vllm-router-{num_tokens}", peer_port, peer.pid, peer_raw,
                              direct_http, None, out.parent, tuple(args.rates))  # fmt: skip
                row["prompt_tokens"] = num_tokens
                rows.append(row)
                print(json.dumps(row), flush=True)
        extra: dict[str, Any] = {}
        if args.scaling and rows:
            prompt = prompt_of(tokenizer, args.prompt_tokens[0])
            extra["scaling"] = scaling(procs, work, workers, tok_dir, prompt, rows[0])
            print(json.dumps(extra["scaling"]), flush=True)
        if args.slow_streams:
            extra["slow_streams"] = slow_streams(procs, work, tok_dir, args.slow_streams)
            print(json.dumps(extra["slow_streams"]), flush=True)
    finally:
        procs.stop()
    out.write_text(report(rows, extra))
    print(out.read_text())


def _router_args(workers: list[str], tok_dir: Path, port: int, *more: str) -> list[str]:
    args = [sys.executable, "-m", "splitserve", "router", "serve", "--model", "bench",
            "--tokenizer", str(tok_dir), "--port", str(port), "--grpc-port", "0",
            "--log-level", "WARNING", *SLO_ARGS, *more]  # fmt: skip
    for w in workers:
        args += ["--worker", w]
    return args


def scaling(
    procs: Procs,
    work: Path,
    workers: dict[str, str],
    tok_dir: Path,
    prompt: str,
    one_process: dict[str, Any],
) -> dict[str, Any]:
    """`--processes 2` on cores 0 and 1 against the one-process router's figure on core 0.

    On a 2-core machine the second core also runs the load generator and the workers, so this
    is a lower bound on what a second free core would give.
    """
    port = _free_port()
    ready = work / "router2.json"
    sup = procs.spawn(
        "router-2proc",
        _router_args(list(workers.values()), tok_dir, port, "--processes", "2",
                     "--ready-file", str(ready)),
        ROUTER_CORE,
    )  # fmt: skip
    info = _wait_file(ready, sup)
    pids = [int(p) for p in info["pids"]]
    for pid in pids:
        os.sched_setaffinity(pid, {ROUTER_CORE, LOAD_CORE})
    _wait_http(port, "/ready")
    raw = loadgen.request_bytes(port, "/v1/chat/completions", chat_body("bench", prompt))
    asyncio.run(loadgen.closed_loop(port, raw, 8, 200, 30))  # warm-up
    cpu0 = sum(_cpu_s(p) for p in pids)
    sat = asyncio.run(loadgen.closed_loop(port, raw, 32, 4000, 30))
    cpu = sum(_cpu_s(p) for p in pids) - cpu0
    sup.send_signal(signal.SIGTERM)
    sup.wait(60)
    rps = sat.done / sat.wall_s
    return {
        "rps_1": one_process["sat_rps"],
        "rps_2": rps,
        "speedup": rps / max(one_process["sat_rps"], 1e-9),
        "cpu_ms_per_req_2": cpu / max(1, sat.done) * 1e3,
        "errors_2": sat.errors,
    }


def slow_streams(procs: Procs, work: Path, tok_dir: Path, count: int) -> dict[str, Any]:
    """RSS of one router process holding `count` slow streams open at once
    (`tests.bench_router.streams`: a timer-wheel bench backend, a protocol-level client)."""
    from tests.bench_router import streams

    return streams.run(procs, work, tok_dir, count)


def report(rows: list[dict[str, Any]], extra: dict[str, Any] | None = None) -> str:
    load = os.getloadavg()
    lines = [
        f"machine: {platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}, "
        f"load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}; router on core "
        f"{ROUTER_CORE}, load generator and backends on core {LOAD_CORE}",
        "",
        "| router | prompt | added TTFT p50 / p99 (ms, c=1) | CPU / request (ms) | req/s at c=32 "
        "| errors | highest Poisson rate with added p99 <= 10 ms | RSS (MB) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['name']} | {r['prompt_tokens']} | {r['added_p50_ms']:.2f} / "
            f"{r['added_p99_ms']:.2f} | {r['cpu_ms_per_req']:.2f} | {r['sat_rps']:.0f} | "
            f"{r['sat_errors']} | {r['best_rate']} | {r['rss_mb']:.0f} |"
        )
    by = {(r["name"].split("-")[0], r["prompt_tokens"]): r for r in rows}
    lines += ["", "| prompt | ours / vllm-router: added p50 | CPU per request | req/s |",
              "|---|---|---|---|"]  # fmt: skip
    for (name, tokens), ours in by.items():
        peer = by.get(("vllm", tokens))
        if name != "splitserve" or peer is None:
            continue
        lines.append(
            f"| {tokens} | {ours['added_p50_ms'] / max(peer['added_p50_ms'], 1e-3):.1f}x | "
            f"{ours['cpu_ms_per_req'] / max(peer['cpu_ms_per_req'], 1e-3):.1f}x | "
            f"{ours['sat_rps'] / max(peer['sat_rps'], 1e-3):.2f}x |"
        )
    lines += ["", "Poisson sweeps (added p99 ms by offered rate):", ""]
    lines += [f"- {r['name']}: {r['rates']}" for r in rows]
    extra = extra or {}
    if "scaling" in extra:
        sc = extra["scaling"]
        lines += ["", f"--processes 2 on cores 0+1 (core 1 shared with the load): "
                  f"{sc['rps_2']:.0f} req/s vs {sc['rps_1']:.0f} on one process, "
                  f"{sc['speedup']:.2f}x; CPU / request {sc['cpu_ms_per_req_2']:.2f} ms; "
                  f"errors {sc['errors_2']}"]  # fmt: skip
    if "slow_streams" in extra:
        from tests.bench_router import streams

        lines += ["", *streams.report_lines(extra["slow_streams"])]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
