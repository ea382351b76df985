"""`make bench-router`: the router's added latency, CPU and throughput, beside vllm-router's.

Machine layout (`tests.bench_router.layout`; needs 2+ cores): the router under test on the
router core(s), the load generator(s) on the load core(s), the zero-delay backends on the
backend core(s). On 2 cores: router on core 0, everything else on core 1. Each router is
measured against talking to its backend directly (the splitserve decode worker over gRPC;
vllm-router's fake decode backend over HTTP) with the same requests: streamed chat completions
of 16 tokens. `--scale 1 2 4` adds the scale-out figure (`router serve --processes N`, each
process pinned to its own router core, c = 32 per process); `--budget-s` caps the whole run.

Runs from a source tree without installing splitserve: `PYTHONPATH=src python3 -m
tests.bench_router.run ...` (every child is `sys.executable` with the inherited environment;
pinning is `os.sched_setaffinity` in the child, no `taskset`).

    python -m tests.bench_router.run --vllm-router PATH [--py-spy PATH] [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine, Iterable
from pathlib import Path
from typing import Any

import grpc

from splitserve._gen.v1 import common_pb2, worker_pb2, worker_pb2_grpc
from splitserve.cli.process import die_with_parent
from splitserve.router.tokenizer import TextTokenizer, default_tokenizer_dir
from tests.bench_router import loadgen, loadproc
from tests.bench_router.layout import Budget, Layout, backend_counts, format_cores, make_layout
from tests.bench_router.loadgen import Result, percentile

ROUTER_CORE = 0
LOAD_CORE = 1
"""The 2-core layout (router on 0, the rest on 1) that `ab`, `streams` and `syscalls` use."""
TOKENS = 16
RATES = (50, 100, 200, 400, 800)
_START_CPUS = frozenset(os.sched_getaffinity(0))
"""The cores this run may use (before it pins itself to a load core)."""
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


def terminate(proc: subprocess.Popen[bytes], timeout_s: float = 30) -> None:
    """SIGTERM `proc` and wait for it; SIGKILL after `timeout_s`."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


_LOGS: dict[int, Path] = {}
"""Each started process's log (pid -> path), for the messages of a start-up that failed (they
said "see logs" without saying where: the run's temporary directory was printed nowhere)."""


def _log_of(proc: subprocess.Popen[bytes] | None) -> str:
    return str(_LOGS.get(proc.pid, "its log")) if proc is not None else "its log"


class Procs:
    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.procs: list[subprocess.Popen[bytes]] = []
        self.named: dict[str, subprocess.Popen[bytes]] = {}

    def spawn(
        self,
        name: str,
        args: list[str],
        core: int | Iterable[int],
        env: dict[str, str] | None = None,
    ) -> subprocess.Popen[bytes]:
        """Start `args` pinned to `core` (one core or a set; `os.sched_setaffinity` in the
        child, inherited by everything it starts), output to `<name>.log`."""
        cores = {core} if isinstance(core, int) else set(core)

        def setup() -> None:
            os.sched_setaffinity(0, cores)
            die_with_parent()  # a bench killed outright (SIGKILL) left its children running

        with (self.logs / f"{name}.log").open("wb") as out:
            proc = subprocess.Popen(args, stdout=out, stderr=out, env=env, preexec_fn=setup)
        _LOGS[proc.pid] = self.logs / f"{name}.log"
        self.procs.append(proc)
        self.named[name] = proc
        return proc

    def pids(self, *prefixes: str) -> list[int]:
        """The live processes whose name starts with one of `prefixes`."""
        return [p.pid for n, p in self.named.items() if n.startswith(prefixes) and p.poll() is None]

    def names(self, *prefixes: str) -> list[str]:
        """The names of the live processes that start with one of `prefixes`."""
        return [n for n, p in self.named.items() if n.startswith(prefixes) and p.poll() is None]

    def log_tails(self, lines: int = 40) -> str:
        """The last `lines` lines of every log, for a report when something failed."""
        out = []
        for log in sorted(self.logs.glob("*.log")):
            tail = log.read_text(errors="replace").splitlines()[-lines:]
            out += [f"==> {log.name} <==", *tail, ""]
        return "\n".join(out)

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


def start_vllm_router(
    procs: Procs, binary: str, layout: Layout | None = None, backends: int = 1
) -> tuple[subprocess.Popen[bytes], int, int]:
    """vllm-router in P/D mode in front of `backends` fake OpenAI prefill / decode server
    pairs (on the backend cores), itself on the first router core, ready: (its process, its
    port, the first fake decode server's port)."""
    layout = layout or Layout((ROUTER_CORE,), (LOAD_CORE,), (LOAD_CORE,))
    pairs = start_fake_backends(procs, layout, backends)
    peer, peer_port = start_peer(procs, binary, pairs, layout.router[:1])
    return peer, peer_port, pairs[0][1]


def start_fake_backends(procs: Procs, layout: Layout, count: int) -> list[tuple[int, int]]:
    """`count` fake OpenAI processes, each serving a prefill and a decode port, one per backend
    core (round robin): [(prefill port, decode port)]."""
    pairs = []
    started = []
    for i in range(count):
        fake_p, fake_d = _free_port(), _free_port()
        started.append(procs.spawn(
            f"fake-openai-{i}",
            [sys.executable, "-m", "tests.bench_router.fake_openai", str(fake_p), str(fake_d)],
            layout.worker_core_of(i),
        ))  # fmt: skip
        pairs.append((fake_p, fake_d))
    for (_, fake_d), proc in zip(pairs, started, strict=True):
        _wait_http(fake_d, proc=proc)
    return pairs


def start_peer(
    procs: Procs,
    binary: str,
    pairs: list[tuple[int, int]],
    cores: Iterable[int],
    name: str = "vllm-router",
) -> tuple[subprocess.Popen[bytes], int]:
    """vllm-router in P/D mode (round robin) over the fake pairs, pinned to `cores` (it is
    multi-threaded: its runtime sizes itself to the cores it may use)."""
    cores = tuple(cores)
    port = _free_port()
    args = [binary, "--vllm-pd-disaggregation", "--host", "127.0.0.1", "--port", str(port),
            "--policy", "round_robin", "--log-level", "warning",
            # its own metrics port: two peers at once (1 core, N cores) must not collide
            "--prometheus-port", str(_free_port())]  # fmt: skip
    for fake_p, _ in pairs:
        args += ["--prefill", f"http://127.0.0.1:{fake_p}"]
    for _, fake_d in pairs:
        args += ["--decode", f"http://127.0.0.1:{fake_d}"]
    # its own venv's packages only: not the PYTHONPATH a source-tree run of this bench sets
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    peer = procs.spawn(f"{name}-cores-{format_cores(cores)}", args, cores, env)
    _wait_http(port, proc=peer)
    return peer, port


def _wait_file(path: Path, proc: subprocess.Popen[bytes], timeout_s: float = 120) -> Any:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if proc.poll() is not None:
            raise SystemExit(f"{path.name}: its process exited with {proc.returncode} "
                             f"(see {_log_of(proc)})")  # fmt: skip
        if time.monotonic() > deadline:
            raise SystemExit(f"{path.name}: not written in {timeout_s:g} s (see {_log_of(proc)})")
        time.sleep(0.1)
    return json.loads(path.read_text())


BACKENDS = ("sim", "fake")
"""The zero-delay workers a bench can run: `sim` (`worker serve --sim-time-scale 0`, the real
worker) or `fake` (`tests.bench_router.fake_worker`: the same protocol at a fraction of the load
core's CPU, for the router's c=32 saturation on 2 cores; docs/benchmarks.md "Fourteenth pass")."""


def worker_command(backend: str, role: str, ready: Path) -> list[str]:
    """The command line of one zero-delay `backend` worker of `role`."""
    if backend == "sim":
        return [sys.executable, "-m", "splitserve", "worker", "serve", "--role", role,
                "--sim-time-scale", "0", "--ready-file", str(ready)]  # fmt: skip
    if backend == "fake":
        return [sys.executable, "-m", "tests.bench_router.fake_worker", "--role", role,
                "--ready-file", str(ready)]  # fmt: skip
    raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")


def start_zero_delay_workers(procs: Procs, work: Path, backend: str = "sim") -> dict[str, str]:
    """A zero-delay prefill and decode worker (`backend`) on the load core: role -> address."""
    layout = Layout((ROUTER_CORE,), (LOAD_CORE,), (LOAD_CORE,))
    both = start_workers(procs, work, layout, 1, 1, backend)
    return {role: addresses[0] for role, addresses in both.items()}


def start_workers(
    procs: Procs, work: Path, layout: Layout, prefill: int, decode: int, backend: str = "sim"
) -> dict[str, list[str]]:
    """`prefill` zero-delay prefill workers and `decode` decode workers (`backend`: `sim` or
    `fake`), one per backend core (round robin, prefill first): role -> addresses."""
    started: list[tuple[str, Path, subprocess.Popen[bytes]]] = []
    roles = [("prefill", i) for i in range(prefill)] + [("decode", i) for i in range(decode)]
    for k, (role, i) in enumerate(roles):
        ready = work / f"{role}-{i}.json"
        p = procs.spawn(
            f"{role}-{i}", worker_command(backend, role, ready), layout.worker_core_of(k)
        )
        started.append((role, ready, p))
    workers: dict[str, list[str]] = {"prefill": [], "decode": []}
    for role, ready, p in started:
        workers[role].append(_wait_file(ready, p)["address"])
    return workers


def _wait_http(
    port: int,
    path: str = "/health",
    timeout_s: float = 120,
    proc: subprocess.Popen[bytes] | None = None,
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise SystemExit(
                f"port {port}: its process exited with {proc.returncode} (see {_log_of(proc)})"
            )
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
                s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
                if s.recv(64).startswith(b"HTTP/1.1 200"):
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"port {port} never answered {path} (see {_log_of(proc)})")


def chat_body(model: str, prompt: str, max_tokens: int = TOKENS) -> bytes:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
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
    load_cores: tuple[int, ...] = (LOAD_CORE,),
    backend_pids: tuple[int, ...] = (),
    sat_count: int = 4000,
    sat_s: float = 30,
) -> dict[str, Any]:
    """Every figure for one router: c=1 TTFT, saturated throughput and CPU, Poisson rates.

    The saturation run (c=32) comes from one load generator process per load core
    (`loadproc`); the busiest backend's and the load generators' CPU use over it are recorded
    so a bottleneck outside the router shows."""
    run = asyncio.run
    run(loadgen.closed_loop(port, raw, 4, 200, 30))  # warm-up
    base = run(direct())
    one = run(loadgen.closed_loop(port, raw, 1, 400, 60))
    cpu0 = _cpu_s(pid)
    spy = None
    if py_spy is not None:
        suffix = {"flamegraph": "svg", "speedscope": "json", "chrometrace": "json"}.get(
            flame_format, "txt"
        )
        svg = out_dir / f"flame-{name}.{suffix}"
        spy = subprocess.Popen(
            [py_spy, "record", "-o", str(svg), "--pid", str(pid), "--duration", "8", "-r", "200",
             "--nonblocking", "--format", flame_format],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
    back0 = {p: _cpu_s(p) for p in backend_pids}
    sat = loadproc.closed_loop(port, raw, 32, sat_count, sat_s, load_cores)
    cpu = _cpu_s(pid) - cpu0
    busiest = max((_cpu_s(p) - c for p, c in back0.items()), default=0.0)
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
        "sat_load_cpu_pct": _pct(sat.cpu_s / max(1, len(load_cores[:32])), sat.wall_s),
        "sat_busiest_backend_cpu_pct": _pct(busiest, sat.wall_s),
        "router_cpu_pct": _pct(cpu, sat.wall_s),
        "rss_mb": _rss_mb(pid),
        "best_rate": max(ok_rates, default=0),
        "rates": {r: round((p99 - base_p99) * 1e3, 2) for r, (p99, _, _) in by_rate.items()},
    }


def _pct(cpu_s: float, wall_s: float) -> float:
    """CPU time over a wall time, in % of one core."""
    return round(100 * cpu_s / max(wall_s, 1e-9), 1)


def _at_least(low: float, kind: Callable[[str], float] = int, above: bool = False) -> Any:
    """An argparse type: a finite `kind` >= `low` (> `low` with `above`). A rate of 0 or below,
    a prompt of no tokens or a negative stream count ran as nothing (a row of nan, a skipped
    part), a saturation of 0 s divided by zero, nan skipped every part."""

    def convert(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not math.isfinite(value) or value < low or (above and value == low):
            raise argparse.ArgumentTypeError(f"{text!r} is not {'>' if above else '>='} {low:g}")
        return value

    return convert


FLAME_FORMATS = ("flamegraph", "raw", "speedscope", "chrometrace")
"""py-spy's `--format` values this bench writes a file for (another made py-spy exit at once,
unseen: its output goes nowhere, and the report had no flame graph)."""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.bench_router.run")
    parser.add_argument("--vllm-router", default=None, help="vllm-router executable (peer)")
    parser.add_argument("--py-spy", default=None)
    parser.add_argument("--out", default="out/bench-router.md")
    parser.add_argument(
        "--json", default=None, help="every figure as JSON (default: --out with .json)"
    )
    parser.add_argument("--prompt-tokens", type=_at_least(1), nargs="*", default=[200, 1024])
    parser.add_argument(
        "--rates",
        type=_at_least(1),
        nargs="*",
        default=list(RATES),
        help="Poisson rates (none: skip)",
    )
    parser.add_argument(
        "--scaling",
        action="store_true",
        help="also measure `router serve --processes 2` (the same as --scale 1 2)",
    )
    parser.add_argument(
        "--scale",
        type=int,
        nargs="*",
        default=None,
        help="router process counts for the scale-out figure, e.g. 1 2 4 (each process pinned "
        "to its own router core; c = 32 per process)",
    )
    parser.add_argument(
        "--scale-only",
        action="store_true",
        help="only the scale-out figure (no per-router rows, no peer rows; the first "
        "--prompt-tokens value is the prompt)",
    )
    parser.add_argument("--router-cores", default=None, help="e.g. 0-3 (default: automatic)")
    parser.add_argument("--load-cores", default=None, help="e.g. 4-7 (default: automatic)")
    parser.add_argument("--worker-cores", default=None, help="e.g. 8-15 (default: automatic)")
    parser.add_argument(
        "--backends",
        type=int,
        default=None,
        help="zero-delay decode workers (and two thirds as many prefill workers); default: "
        "one worker per backend core, 40 %% of them prefill. The peer gets one fake OpenAI "
        "prefill / decode pair per backend core",
    )
    parser.add_argument(
        "--sat-s",
        type=_at_least(0, float, above=True),
        default=None,
        help="length of each scale-out saturation run (default 10; with --scale or --scaling)",
    )
    parser.add_argument(
        "--peer-scaling",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="with --scale and --vllm-router: vllm-router's saturated req/s pinned to 1 core "
        "and to as many cores as the largest --scale",
    )
    parser.add_argument(
        "--budget-s",
        type=_at_least(0, float, above=True),
        default=None,
        help="wall-clock cap for the whole run: parts that would not fit are skipped (in this "
        "order of priority: the first prompt's splitserve row, the scale-out figure, the peer's "
        "row, the peer's scaling, the other prompts, the slow streams) and the report says so",
    )
    parser.add_argument(
        "--slow-streams",
        type=_at_least(0),
        default=10000,
        help="concurrent slow streams held open on one router process for its RSS (0: skip)",
    )
    parser.add_argument(
        "--flame-format",
        default=None,
        choices=FLAME_FORMATS,
        help="py-spy output format (default flamegraph; with --py-spy)",
    )
    parser.add_argument(
        "--router-src",
        default=None,
        help="run the splitserve router from this src/ directory (e.g. an older tree from "
        "`git archive`) to compare before / after; the workers stay this tree's",
    )
    parser.add_argument(
        "--logs", default=None, help="write the tail of every process's log here at the end"
    )
    args = parser.parse_args(argv)
    scale = sorted(set(args.scale or ([1, 2] if args.scaling else [])))
    if any(n < 1 for n in scale):
        parser.error("--scale: process counts must be >= 1")
    # options that act on a part not asked for were ignored (--scale-only measured nothing)
    if args.scale_only and not scale:
        parser.error("--scale-only: give the process counts with --scale (or --scaling)")
    if args.sat_s is not None and not scale:
        parser.error("--sat-s: acts on the scale-out figure; give --scale (or --scaling)")
    if args.flame_format is not None and not args.py_spy:
        parser.error("--flame-format: acts on the flame graphs; give --py-spy")
    args.sat_s = 10.0 if args.sat_s is None else args.sat_s
    args.flame_format = args.flame_format or "flamegraph"
    try:
        layout = make_layout(
            sorted(_START_CPUS), max(scale, default=1),
            args.router_cores, args.load_cores, args.worker_cores,
        )  # fmt: skip
    except ValueError as err:
        parser.error(str(err))
    budget = Budget(args.budget_s, time.monotonic)
    for n in [n for n in scale if not layout.fits(n)]:
        scale.remove(n)
        budget.skipped.append(f"scale-out, {n} router processes (only {len(layout.router)} "
                              f"router cores in the automatic layout)")  # fmt: skip
    if args.vllm_router and not os.access(args.vllm_router, os.X_OK):
        budget.skipped.append(f"vllm-router (no executable at {args.vllm_router})")
        args.vllm_router = None
    if args.py_spy and not os.access(args.py_spy, os.X_OK):
        budget.skipped.append(f"py-spy flame graphs (no executable at {args.py_spy})")
        args.py_spy = None
    try:
        n_prefill, n_decode = backend_counts(layout, args.backends)
    except ValueError as err:
        parser.error(str(err))
    _absolute_pythonpath()
    # an outer `timeout` (SIGTERM) still stops every process started here (the finally below)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    os.sched_setaffinity(0, {layout.load[0]})
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    json_out = Path(args.json) if args.json else out.with_suffix(".json")
    work = Path(tempfile.mkdtemp(prefix="bench-router-"))
    cache = Path(os.environ.get("SPLITSERVE_CACHE_DIR", work / "cache"))
    tok_dir = default_tokenizer_dir(cache / "tokenizer")
    tokenizer = TextTokenizer.from_dir(tok_dir)
    py = sys.executable
    procs = Procs(work)
    rows: list[dict[str, Any]] = []
    extra: dict[str, Any] = {
        "layout": _layout_json(layout, n_prefill, n_decode, scale),
        "skipped": budget.skipped,
        "budget_s": args.budget_s,
    }

    def save(part: str | None = None) -> None:
        extra["elapsed_s"] = round(budget.clock() - budget.start_s, 1)
        if part is not None:  # when each part ended, s from the start (for sizing --budget-s)
            extra.setdefault("timeline", {})[part] = extra["elapsed_s"]
        out.write_text(report(rows, extra))
        json_out.write_text(json.dumps({"machine": machine(), "rows": rows, **extra}, indent=1))

    try:
        # splitserve: zero-delay sim prefill + decode workers, the router on its own core.
        workers = start_workers(procs, work, layout, n_prefill, n_decode)
        save("workers up")
        all_workers = workers["prefill"] + workers["decode"]
        http_port = _free_port()
        router_env = None
        if args.router_src:
            router_env = {**os.environ, "PYTHONPATH": _router_pythonpath(args.router_src)}

        def start_rows_router() -> subprocess.Popen[bytes]:
            proc = procs.spawn(
                "router",
                [py, "-m", "splitserve", "router", "serve", "--model", "bench",
                 "--tokenizer", str(tok_dir), "--port", str(http_port), "--grpc-port", "0",
                 "--log-level", "WARNING", *SLO_ARGS,
                 *(a for w in all_workers for a in ("--worker", w))],
                layout.router[0],
                router_env,
            )  # fmt: skip
            _wait_http(http_port, "/ready", proc=proc)
            return proc

        router = start_rows_router() if not args.scale_only else None
        peer_port = fake_d = 0
        peer = None
        pairs: list[tuple[int, int]] = []
        if args.vllm_router and not args.scale_only:
            pairs = start_fake_backends(procs, layout, len(layout.worker))
            fake_d = pairs[0][1]
            peer, peer_port = start_peer(procs, args.vllm_router, pairs, layout.router[:1])
        # s: a first guess, then what the last row of each router took (x 1.5 for a longer
        # prompt: the 1,024-token rows took ~1.5-2x the 200-token ones on the 2-core machine)
        row_est, peer_est = 90.0, 45.0
        for k, num_tokens in enumerate(args.prompt_tokens):
            prompt = prompt_of(tokenizer, num_tokens)
            ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}])
            ours_raw = loadgen.request_bytes(http_port, "/v1/chat/completions",
                                             chat_body("bench", prompt))  # fmt: skip

            def direct_grpc(ids: list[int] = ids) -> Coroutine[Any, Any, Result]:
                return _grpc_direct(workers["decode"][0], ids, 400)

            if router is not None and router.poll() is not None and not args.scale_only:
                router = start_rows_router()  # stopped for the scale-out
            if not args.scale_only and budget.allows(
                f"splitserve row, {num_tokens}-token prompt", row_est
            ):
                assert router is not None
                t0 = budget.clock()
                row = measure(f"splitserve-{num_tokens}", http_port, router.pid, ours_raw,
                              direct_grpc, args.py_spy, out.parent,
                              flame_format=args.flame_format,
                              backend_pids=tuple(procs.pids("prefill-", "decode-")),
                              rates=tuple(args.rates), load_cores=layout.load)  # fmt: skip
                row_est = 1.5 * max(20.0, budget.clock() - t0)
                row["prompt_tokens"] = num_tokens
                rows.append(row)
                print(json.dumps(row), flush=True)
                save(f"splitserve-{num_tokens}")
            if k == 0 and scale:
                if router is not None:
                    # The rows' router follows every worker's step feed even with no request
                    # through it: left running on router core 0 during the scale-out it took
                    # 25-43 % of that core from the process pinned there (16-core machine), so
                    # it stops for the scale-out and starts again for the rows after it.
                    terminate(router)
                extra["scaling"] = scaling(procs, work, all_workers, tok_dir, prompt, layout,
                                           scale, args.sat_s, budget, router_env)  # fmt: skip
                print(json.dumps(extra["scaling"]), flush=True)
                save("scaling")
            if peer is not None:
                body = chat_body("m", prompt)
                peer_raw = loadgen.request_bytes(peer_port, "/v1/chat/completions", body)
                direct_raw = loadgen.request_bytes(fake_d, "/v1/chat/completions", body)

                def direct_http(raw: bytes = direct_raw) -> Coroutine[Any, Any, Result]:
                    return loadgen.closed_loop(fake_d, raw, 1, 400, 60)

                if budget.allows(f"vllm-router row, {num_tokens}-token prompt", peer_est):
                    t0 = budget.clock()
                    row = measure(f"vllm-router-{num_tokens}", peer_port, peer.pid, peer_raw,
                                  direct_http, None, out.parent,
                                  backend_pids=tuple(procs.pids("fake-openai-")),
                                  rates=tuple(args.rates), load_cores=layout.load)  # fmt: skip
                    peer_est = 1.5 * max(15.0, budget.clock() - t0)
                    row["prompt_tokens"] = num_tokens
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                    save(f"vllm-router-{num_tokens}")
                if k == 0 and scale and args.peer_scaling:
                    extra["peer_scaling"] = peer_scaling(
                        procs,
                        args.vllm_router,
                        pairs,
                        body,
                        layout,
                        max(scale),
                        args.sat_s,
                        budget,
                    )
                    print(json.dumps(extra["peer_scaling"]), flush=True)
                    save("peer_scaling")
        if args.slow_streams and budget.allows(f"{args.slow_streams} slow streams", 150):
            extra["slow_streams"] = slow_streams(procs, work, tok_dir, args.slow_streams)
            print(json.dumps(extra["slow_streams"]), flush=True)
            save("slow_streams")
    except BaseException as err:
        extra["failed"] = f"{type(err).__name__}: {err}"
        raise
    finally:
        procs.stop()
        if args.logs:
            Path(args.logs).write_text(procs.log_tails())
        save()
    print(out.read_text())


def _router_pythonpath(router_src: str) -> str:
    """`--router-src`'s tree first, then the inherited `PYTHONPATH` less this tree's `src/`
    (a source-tree run keeps its dependencies there: dropping them broke the older router)."""
    own = (Path(__file__).resolve().parents[2] / "src").resolve()
    rest = [e for e in os.environ.get("PYTHONPATH", "").split(os.pathsep) if e]
    kept = [e for e in rest if Path(e).resolve() != own]
    return os.pathsep.join([str(Path(router_src).resolve()), *kept])


def _absolute_pythonpath() -> None:
    """`PYTHONPATH=src` (a run from a source tree) as absolute paths, so every child (they all
    inherit this environment) imports the same tree whatever its working directory."""
    entries = [e for e in os.environ.get("PYTHONPATH", "").split(os.pathsep) if e]
    if entries:
        os.environ["PYTHONPATH"] = os.pathsep.join(str(Path(e).resolve()) for e in entries)


def _layout_json(layout: Layout, prefill: int, decode: int, scale: list[int]) -> dict[str, Any]:
    return {
        "router_cores": format_cores(layout.router),
        "load_cores": format_cores(layout.load),
        "worker_cores": format_cores(layout.worker),
        "automatic": layout.auto,
        "overlaps": layout.overlaps,
        "prefill_workers": prefill,
        "decode_workers": decode,
        "scale": scale,
        "text": layout.describe(),
    }


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    model = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    load = os.getloadavg()
    siblings = {}
    for cpu in range(os.cpu_count() or 1):
        with contextlib.suppress(OSError):
            topo = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list")
            siblings[cpu] = topo.read_text().strip()
    return {
        "cpu_model": model,
        "thread_siblings": siblings,
        "cores": os.cpu_count(),
        "usable_cores": len(_START_CPUS),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "load_average": [round(x, 2) for x in load],
    }


def _router_args(workers: list[str], tok_dir: Path, port: int, *more: str) -> list[str]:
    args = [sys.executable, "-m", "splitserve", "router", "serve", "--model", "bench",
            "--tokenizer", str(tok_dir), "--port", str(port), "--grpc-port", "0",
            "--log-level", "WARNING", *SLO_ARGS, *more]  # fmt: skip
    for w in workers:
        args += ["--worker", w]
    return args


def pin_threads(pid: int, cores: set[int]) -> None:
    """Pin every thread of `pid` (a router child's gRPC threads started before this, too; the
    threads it starts later inherit from its main thread)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(ProcessLookupError):
            os.sched_setaffinity(int(task.name), cores)


def thread_cores(pid: int) -> str:
    """The cores any thread of `pid` may run on (what the pinning achieved)."""
    cores: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(ProcessLookupError):
            cores |= os.sched_getaffinity(int(task.name))
    return format_cores(cores)


def scaling(
    procs: Procs,
    work: Path,
    workers: list[str],
    tok_dir: Path,
    prompt: str,
    layout: Layout,
    counts: list[int],
    sat_s: float,
    budget: Budget,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The scale-out figure: for each N of `counts`, `router serve --processes N` (N = 1: one
    plain process; with `env`, e.g. `--router-src`'s tree, which it ignored before), process i
    pinned to router core i, saturated by c = 32 x N closed-loop clients (one load generator
    process per load core) for `sat_s` seconds. Per N: req/s, its ratio to N = 1, router CPU
    per request, each process's share of the router CPU (balance), and the busiest backend's
    and the load generators' CPU use (a bottleneck outside the router shows there). When the
    router's cores are shared (`layout.overlaps`, e.g. on 2 cores) the figure is a lower bound
    on what free cores would give."""
    runs: list[dict[str, Any]] = []
    for n in counts:
        if not budget.allows(f"scale-out, {n} router process(es)", sat_s + 20):
            continue
        runs.append(_scale_run(procs, work, workers, tok_dir, prompt, layout, n, sat_s, env))
        print(json.dumps(runs[-1]), flush=True)
    base = next((r["rps"] for r in runs if r["processes"] == 1), None)
    for r in runs:
        r["ratio"] = round(r["rps"] / base, 2) if base else None
    return {"concurrency_per_process": 32, "sat_s": sat_s, "pinning": "one core per process",
            "runs": runs}  # fmt: skip


def _scale_run(
    procs: Procs,
    work: Path,
    workers: list[str],
    tok_dir: Path,
    prompt: str,
    layout: Layout,
    n: int,
    sat_s: float,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    port = _free_port()
    ready = work / f"router-{n}proc.json"
    more = ["--processes", str(n), "--ready-file", str(ready)] if n > 1 else []
    cores = layout.router[:n]
    sup = procs.spawn(f"router-{n}proc", _router_args(workers, tok_dir, port, *more), cores, env)
    try:
        pids = [sup.pid]
        if n > 1:
            pids = [int(p) for p in _wait_file(ready, sup)["pids"]]
        for i, pid in enumerate(pids):
            pin_threads(pid, {layout.router_core_of(i)})
        _wait_http(port, "/ready", proc=sup)
        affinity = [thread_cores(p) for p in pids]
        raw = loadgen.request_bytes(port, "/v1/chat/completions", chat_body("bench", prompt))
        asyncio.run(loadgen.closed_loop(port, raw, 8 * n, 200 * n, 30))  # warm-up
        back = procs.pids("prefill-", "decode-")
        cpu0 = {p: _cpu_s(p) for p in pids + back}
        sat = loadproc.closed_loop(port, raw, 32 * n, 10**9, sat_s, layout.load)
        used = {p: _cpu_s(p) - c for p, c in cpu0.items()}
    finally:
        terminate(sup, 60)
    router_cpu = sum(used[p] for p in pids)
    n_load = min(len(layout.load), 32 * n)
    return {
        "processes": n,
        "cores": format_cores(cores),
        "thread_affinity": affinity,
        "concurrency": 32 * n,
        "rps": round(sat.done / sat.wall_s, 1),
        "done": sat.done,
        "errors": sat.errors,
        "statuses": sat.statuses,
        "ttft_p50_ms": round(percentile(sat.ttft_s, 50) * 1e3, 2),
        "cpu_ms_per_req": round(router_cpu / max(1, sat.done) * 1e3, 3),
        "router_cpu_pct": [_pct(used[p], sat.wall_s) for p in pids],
        "cpu_shares": [round(used[p] / max(router_cpu, 1e-9), 3) for p in pids],
        "busiest_backend_cpu_pct": max((_pct(used[p], sat.wall_s) for p in back), default=0.0),
        "backend_cpu_pct": {
            role: [_pct(used[p], sat.wall_s) for p in procs.pids(f"{role}-") if p in used]
            for role in ("prefill", "decode")
        },
        "backend_cpu_ms_per_req": {
            role: round(
                sum(used.get(p, 0.0) for p in procs.pids(f"{role}-")) / max(1, sat.done) * 1e3, 3
            )
            for role in ("prefill", "decode")
        },
        "load_cpu_pct": _pct(sat.cpu_s / n_load, sat.wall_s),
    }


def peer_scaling(
    procs: Procs,
    binary: str,
    pairs: list[tuple[int, int]],
    body: bytes,
    layout: Layout,
    n_max: int,
    sat_s: float,
    budget: Budget,
) -> dict[str, Any]:
    """vllm-router's saturated req/s pinned to 1 core (c = 32) and to `n_max` router cores
    (c = 32 x n_max; it is multi-threaded), over the same fake backends and load generators."""
    runs = []
    for n in sorted({1, n_max}):
        if not budget.allows(f"vllm-router scaling, {n} core(s)", sat_s + 10):
            continue
        peer, port = start_peer(procs, binary, pairs, layout.router[:n], "vllm-router-scale")
        try:
            raw = loadgen.request_bytes(port, "/v1/chat/completions", body)
            asyncio.run(loadgen.closed_loop(port, raw, 8 * n, 200 * n, 30))  # warm-up
            back = procs.pids("fake-openai-")
            cpu0 = {p: _cpu_s(p) for p in [peer.pid, *back]}
            sat = loadproc.closed_loop(port, raw, 32 * n, 10**9, sat_s, layout.load)
            used = {p: _cpu_s(p) - c for p, c in cpu0.items()}
        finally:
            terminate(peer)
        runs.append({
            "cores": format_cores(layout.router[:n]),
            "n_cores": n,
            "concurrency": 32 * n,
            "rps": round(sat.done / sat.wall_s, 1),
            "errors": sat.errors,
            "cpu_ms_per_req": round(used[peer.pid] / max(1, sat.done) * 1e3, 3),
            "router_cpu_pct": _pct(used[peer.pid], sat.wall_s),
            "busiest_backend_cpu_pct": max((_pct(used[p], sat.wall_s) for p in back),
                                           default=0.0),
            "load_cpu_pct": _pct(sat.cpu_s / min(len(layout.load), 32 * n), sat.wall_s),
        })  # fmt: skip
        print(json.dumps(runs[-1]), flush=True)
    return {"runs": runs}


def slow_streams(procs: Procs, work: Path, tok_dir: Path, count: int) -> dict[str, Any]:
    """RSS of one router process holding `count` slow streams open at once
    (`tests.bench_router.streams`: a timer-wheel bench backend, a protocol-level client)."""
    from tests.bench_router import streams

    return streams.run(procs, work, tok_dir, count)


def report(rows: list[dict[str, Any]], extra: dict[str, Any] | None = None) -> str:
    extra = extra or {}
    m = machine()
    lay = extra.get("layout")
    where = (
        lay["text"] + f"; zero-delay sim workers: {lay['prefill_workers']} prefill, "
        f"{lay['decode_workers']} decode, one process per backend core (round robin)"
        if lay
        else f"router on core {ROUTER_CORE}, load generator and backends on core {LOAD_CORE}"
    )
    load = m["load_average"]
    lines = [
        f"machine: {m['cpu_model']}, {m['cores']} cores ({m['usable_cores']} usable), "
        f"{platform.machine()}, Python {m['python']}, load average "
        f"{load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}; {where}",
        "",
        "| router | prompt | added TTFT p50 / p99 (ms, c=1) | CPU / request (ms) | req/s at c=32 "
        "| errors | highest Poisson rate with added p99 <= 10 ms | RSS (MB) "
        "| load gen. / busiest backend CPU at c=32 (% of a core) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['name']} | {r['prompt_tokens']} | {r['added_p50_ms']:.2f} / "
            f"{r['added_p99_ms']:.2f} | {r['cpu_ms_per_req']:.2f} | {r['sat_rps']:.0f} | "
            f"{r['sat_errors']} | {r['best_rate']} | {r['rss_mb']:.0f} | "
            f"{r.get('sat_load_cpu_pct', '-')} / {r.get('sat_busiest_backend_cpu_pct', '-')} |"
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
    lines += scaling_lines(extra)
    if "slow_streams" in extra:
        from tests.bench_router import streams

        lines += ["", *streams.report_lines(extra["slow_streams"])]
    if extra.get("skipped"):
        lines += [
            "",
            f"Skipped (to stay within --budget-s {extra.get('budget_s')}, or no cores for them):",
            "",
        ]
        lines += [f"- {part}" for part in extra["skipped"]]
    if "failed" in extra:
        lines += ["", f"Stopped early by {extra['failed']} (the figures above are complete)."]
    if "elapsed_s" in extra:
        lines += ["", f"Run time: {extra['elapsed_s']} s."]
    return "\n".join(lines) + "\n"


def scaling_lines(extra: dict[str, Any]) -> list[str]:
    """The scale-out table (ours, then vllm-router's) with the ratios to one process."""
    lines: list[str] = []
    sc = extra.get("scaling")
    if sc and sc["runs"]:
        lay = extra.get("layout", {})
        lines += [
            "",
            f"Scale-out: `router serve --processes N`, process i pinned to router core i "
            f"(cores {lay.get('router_cores', '?')}), c = {sc['concurrency_per_process']} x N "
            f"closed-loop clients from load core(s) {lay.get('load_cores', '?')}, "
            f"{sc['sat_s']:.0f} s each"
            + (" (the router's cores are shared: a lower bound)" if lay.get("overlaps") else ""),
            "",
            "| processes | cores of each process's threads | c | req/s | ratio to 1 "
            "| CPU / request (ms) | CPU per process "
            "(% of a core) | CPU shares | errors | busiest backend / load gen. CPU (%) |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in sc["runs"]:
            lines.append(
                f"| {r['processes']} | {' / '.join(r.get('thread_affinity', [r['cores']]))} | "
                f"{r['concurrency']} | {r['rps']:.0f} | "
                f"{r['ratio'] if r['ratio'] is not None else '-'} | {r['cpu_ms_per_req']:.2f} | "
                f"{' / '.join(str(x) for x in r['router_cpu_pct'])} | "
                f"{' / '.join(f'{x:.2f}' for x in r['cpu_shares'])} | {r['errors']} | "
                f"{r['busiest_backend_cpu_pct']} / {r['load_cpu_pct']} |"
            )
        ratios = [f"{r['processes']}/1 = {r['ratio']}" for r in sc["runs"]
                  if r["processes"] > 1 and r["ratio"] is not None]  # fmt: skip
        if ratios:
            lines += ["", "ratios: " + ", ".join(ratios)]
        lines += ["", "Placement across the backends (each worker's CPU, % of a core):", ""]
        for r in sc["runs"]:
            per = r.get("backend_cpu_pct", {})
            lines.append(f"- {r['processes']} process(es): prefill {per.get('prefill')}, "
                         f"decode {per.get('decode')}")  # fmt: skip
    ps = extra.get("peer_scaling")
    if ps and ps["runs"]:
        lines += [
            "",
            "vllm-router (one multi-threaded process) on 1 and on N router cores:",
            "",
            "| cores | c | req/s | CPU / request (ms) | CPU (% of a core) | errors "
            "| busiest backend / load gen. CPU (%) |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in ps["runs"]:
            lines.append(
                f"| {r['cores']} | {r['concurrency']} | {r['rps']:.0f} | "
                f"{r['cpu_ms_per_req']:.3f} | {r['router_cpu_pct']} | {r['errors']} | "
                f"{r['busiest_backend_cpu_pct']} / {r['load_cpu_pct']} |"
            )
    return lines


if __name__ == "__main__":
    main()
