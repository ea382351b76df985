"""Chaos run of the local stack (issue 12 item 6): streaming requests while workers and a router
are killed, frozen and restarted; every stream checked token by token against a fault-free run.

Stack: `splitserve up --prefill 2 --decode 2` (simulated engines, `--on-exit restart`, a short
`--token-stall-timeout-s`) plus a second router replica over the same workers, started here. The
client spreads requests over both replicas, as a Service would, and moves a request that could
not start on one replica (UNAVAILABLE before its first chunk) to the other.

Two passes over the same requests (token-id prompts over the router's gRPC API, greedy, no seed):
1. fault-free: the reference;
2. with faults at fixed shares of the pass's duration: SIGKILL of a decode worker, SIGKILL of a
   prefill worker, SIGSTOP of a decode worker and of a prefill worker for `stop_s` each, then
   SIGTERM of one router replica (restarted by `up`).
Requests start on an open-loop schedule spread over `duration_s` (request i no earlier than
i * duration_s / requests, at most `concurrency` at once), so every fault happens under load.

Correctness of a stream (`check_stream`): its tokens equal the reference token for token, except
after a hand-over. The documented hand-over: when a decode worker fails or stalls mid-stream the
router re-runs prompt + tokens already sent with `Generate` on another worker (docs/reliability.md).
A real engine continues greedy output identically; the simulated engine draws tokens from a hash
of the prompt it is given, so after a hand-over at position k the continuation is
`SyntheticTokens.token(key(prompt + out[:k]), j)`. The check recomputes that continuation for
each hand-over point; a duplicated, lost or foreign token fails it, and so does a wrong length.

Run: `python -m tests.integration.chaos --requests 1000 --concurrency 24` (`make chaos`); the
CI-size run is `tests/integration/test_chaos.py`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import grpc

from splitserve._gen.v1 import common_pb2, router_pb2, router_pb2_grpc
from splitserve.policy.batching.tokens import SyntheticTokens

MAX_HANDOVERS = 4


@dataclass(frozen=True)
class ChaosConfig:
    requests: int = 1000
    concurrency: int = 24
    max_tokens: int = 64
    prompt_len: int = 48
    sim_time_scale: float = 2.0
    stall_s: float = 2.0
    """The router's `--token-stall-timeout-s`."""
    stop_s: float = 10.0
    """How long a SIGSTOP lasts."""
    duration_s: float = 90.0
    """Requests are spread over this long; faults fire at shares of it."""
    router_restart: bool = True
    run_dir: Path = Path("chaos-run")


@dataclass
class Outcome:
    index: int
    replica: int
    start_s: float
    end_s: float = 0.0
    tokens: list[int] = field(default_factory=list)
    finish: int = 0
    error: str = ""
    moved: bool = False
    """Could not start on its first replica and ran on the other."""


@dataclass
class Fault:
    name: str
    at_fraction: float
    """Share of `duration_s` after the pass starts."""
    at_s: float = 0.0
    end_s: float = 0.0
    recovered_s: float | None = None
    """From the fault (SIGKILL) or its end (SIGCONT, router SIGTERM) until the router(s) saw the
    whole pool ready again."""
    readmitted_s: float | None = None
    """SIGKILL: from the restarted worker writing its ready file (listening) until every router
    saw the whole pool ready again (gRPC reconnect + load stream)."""


# -- the stack ----------------------------------------------------------------------------------


@dataclass
class ChaosStack:
    up: subprocess.Popen[bytes]
    run_dir: Path
    routers: list[dict[str, Any]]
    extra_router: subprocess.Popen[bytes] | None
    tokens: SyntheticTokens

    def info(self, name: str) -> dict[str, Any]:
        return dict(json.loads((self.run_dir / f"{name}.ready.json").read_text()))

    def pid(self, name: str) -> int:
        return int(self.info(name)["pid"])

    def ready_endpoints(self, replica: int = 0) -> int:
        port = self.routers[replica]["port"]
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                text = r.read().decode()
        except OSError:
            return -1
        return int(
            sum(
                float(line.rsplit(" ", 1)[1])
                for line in text.splitlines()
                if line.startswith("splitserve_router_endpoints{") and 'state="ready"' in line
            )
        )


def _wait_file(path: Path, proc: subprocess.Popen[bytes], timeout_s: float, log: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-4000:] if log.exists() else ""
            raise RuntimeError(f"{path.name} did not appear (exit {proc.poll()}):\n{tail}")
        time.sleep(0.1)


@contextlib.contextmanager
def chaos_stack(cfg: ChaosConfig) -> Iterator[ChaosStack]:
    from splitserve.cli.up import default_tokenizer_path, tokenizer_vocab

    run_dir = cfg.run_dir.resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    for stale in run_dir.glob("*.ready.json"):
        stale.unlink()
    tokenizer = default_tokenizer_path()
    vocab, first, clean, _eos = tokenizer_vocab(tokenizer)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    up_log = run_dir / "up.out"
    argv = [
        *(sys.executable, "-m", "splitserve", "up", "--prefill", "2", "--decode", "2"),
        *("--port", "0", "--grpc-port", "0", "--sim-time-scale", str(cfg.sim_time_scale)),
        *("--sim-kv-blocks", "4096", "--token-stall-timeout-s", str(cfg.stall_s)),
        *("--on-exit", "restart", "--run-dir", str(run_dir), "--log-level", "WARNING"),
    ]
    with up_log.open("wb") as out:
        up = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
    extra: subprocess.Popen[bytes] | None = None
    try:
        _wait_file(run_dir / "router.ready.json", up, 240, up_log)
        routers = [json.loads((run_dir / "router.ready.json").read_text())]
        workers = [
            json.loads((run_dir / f"{n}.ready.json").read_text())["address"]
            for n in ("prefill-0", "prefill-1", "decode-0", "decode-1")
        ]
        if cfg.router_restart:
            ready = run_dir / "router-b.ready.json"
            log = run_dir / "router-b.log"
            rargv = [
                *(sys.executable, "-m", "splitserve", "router", "serve", "--port", "0"),
                *("--grpc-port", "0", "--model", "splitserve-sim", "--tokenizer", str(tokenizer)),
                *("--token-stall-timeout-s", str(cfg.stall_s), "--log-level", "WARNING"),
                *("--ready-file", str(ready)),
                *(a for w in workers for a in ("--worker", w)),
            ]
            with log.open("wb") as out:
                # The workers take only mTLS clients: the second router uses `up`'s router identity.
                router_env = {**env, "SPLITSERVE_TLS_DIR": str(run_dir / "pki" / "router")}
                extra = subprocess.Popen(
                    rargv, stdout=out, stderr=subprocess.STDOUT, env=router_env
                )
            _wait_file(ready, extra, 120, log)
            routers.append(json.loads(ready.read_text()))
        stack = ChaosStack(up, run_dir, routers, extra, SyntheticTokens(vocab, first, tuple(clean)))
        deadline = time.monotonic() + 60
        while any(stack.ready_endpoints(r) < 4 for r in range(len(routers))):
            if time.monotonic() > deadline:
                raise RuntimeError("the routers never saw all four workers ready")
            time.sleep(0.2)
        yield stack
    finally:
        for name in ("prefill-0", "prefill-1", "decode-0", "decode-1", "router"):
            with contextlib.suppress(OSError, ValueError):
                os.kill(int(json.loads((run_dir / f"{name}.ready.json").read_text())["pid"]),
                        signal.SIGCONT)  # fmt: skip
        for proc in (extra, up):
            if proc is None:
                continue
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _finish_name(value: int) -> str:
    return common_pb2.FinishReason.Name(common_pb2.FinishReason.ValueType(value))


# -- the client -----------------------------------------------------------------------------------


def prompts(cfg: ChaosConfig, tokens: SyntheticTokens) -> list[list[int]]:
    """Distinct token-id prompts drawn from the ids simulated engines emit (decodable text)."""
    out = []
    for i in range(cfg.requests):
        key = tokens.key([i], 7)
        out.append([tokens.token(key, j) for j in range(cfg.prompt_len)])
    return out


async def _one(
    stubs: Sequence[router_pb2_grpc.RouterStub], o: Outcome, prompt: list[int], cfg: ChaosConfig
) -> None:
    # ignore_eos: every stream runs to max_tokens, so the check below needs only the token
    # hash (a hand-over's prompt draws a new answer length as well as new tokens).
    request = router_pb2.RouterGenerateRequest(
        prompt_token_ids=router_pb2.TokenIds(ids=prompt),
        sampling=common_pb2.SamplingParams(
            max_tokens=cfg.max_tokens, temperature=0.0, ignore_eos=True
        ),
    )
    for attempt in range(2):
        replica = (o.replica + attempt) % len(stubs)
        got_any = False
        try:
            call = stubs[replica].Generate(request, timeout=120)
            async for chunk in call:
                got_any = True
                o.tokens.extend(chunk.token_ids)
                if chunk.finish_reason:
                    o.finish = chunk.finish_reason
            o.replica, o.moved = replica, attempt > 0
            if o.finish not in (common_pb2.FINISH_REASON_LENGTH, common_pb2.FINISH_REASON_STOP):
                # Ended by the router (shutdown, worker failure) rather than by the request.
                o.error = f"finish_reason {_finish_name(o.finish)}"
            return
        except grpc.aio.AioRpcError as err:
            retryable = err.code() == grpc.StatusCode.UNAVAILABLE and not got_any
            if not retryable or attempt == 1 or len(stubs) == 1:
                o.replica = replica
                o.error = f"{err.code().name}: {err.details()}"
                return
        finally:
            o.end_s = time.monotonic()


async def run_pass(
    stack: ChaosStack,
    cfg: ChaosConfig,
    all_prompts: list[list[int]],
    faults: list[Fault] | None = None,
) -> tuple[list[Outcome], float]:
    """Every prompt at `cfg.concurrency`; faults fire as the share of finished requests grows."""
    channels = [grpc.aio.insecure_channel(f"127.0.0.1:{r['grpc_port']}") for r in stack.routers]
    stubs = [router_pb2_grpc.RouterStub(ch) for ch in channels]
    outcomes: list[Outcome | None] = [None] * len(all_prompts)
    slots = asyncio.Semaphore(cfg.concurrency)
    start = time.monotonic()
    gap_s = cfg.duration_s / max(1, len(all_prompts))

    async def request(i: int) -> None:
        await asyncio.sleep(max(0.0, start + i * gap_s - time.monotonic()))
        async with slots:
            o = Outcome(i, i % len(stubs), time.monotonic())
            outcomes[i] = o
            await _one(stubs, o, all_prompts[i], cfg)

    injector = asyncio.create_task(_inject(stack, cfg, faults or [], start))
    await asyncio.gather(*(request(i) for i in range(len(all_prompts))))
    elapsed = time.monotonic() - start
    await injector
    for ch in channels:
        await ch.close()
    return [o for o in outcomes if o is not None], elapsed


async def _inject(stack: ChaosStack, cfg: ChaosConfig, faults: list[Fault], start: float) -> None:
    for fault in faults:
        await asyncio.sleep(max(0.0, start + fault.at_fraction * cfg.duration_s - time.monotonic()))
        await _apply(stack, cfg, fault)


async def _wait_recovered(
    stack: ChaosStack, since_s: float, timeout_s: float = 120
) -> float | None:
    while time.monotonic() - since_s < timeout_s:
        if all(stack.ready_endpoints(r) == 4 for r in range(len(stack.routers))):
            return time.monotonic() - since_s
        await asyncio.sleep(0.05)
    return None


async def _apply(stack: ChaosStack, cfg: ChaosConfig, fault: Fault) -> None:
    kind, _, target = fault.name.partition(" ")
    fault.at_s = time.monotonic()
    if kind == "SIGKILL":
        old = stack.pid(target)
        os.kill(old, signal.SIGKILL)
        fault.end_s = time.monotonic()
        deadline = fault.at_s + 120  # restarted by `up` (a new pid), then re-admitted
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, ValueError, KeyError):
                if stack.pid(target) != old:
                    break
            await asyncio.sleep(0.05)
        fault.recovered_s = await _wait_recovered(stack, fault.at_s)
        if fault.recovered_s is not None:
            ready_at = (stack.run_dir / f"{target}.ready.json").stat().st_mtime
            fault.readmitted_s = max(0.0, time.time() - ready_at)
    elif kind == "SIGSTOP":
        pid = stack.pid(target)
        os.kill(pid, signal.SIGSTOP)
        await asyncio.sleep(cfg.stop_s)
        os.kill(pid, signal.SIGCONT)
        fault.end_s = time.monotonic()
        fault.recovered_s = await _wait_recovered(stack, fault.end_s)
    elif kind == "SIGTERM":  # a router replica: `up` restarts it on the same ports
        old = stack.pid(target)
        os.kill(old, signal.SIGTERM)
        fault.end_s = time.monotonic()
        deadline = fault.at_s + 120
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, ValueError, KeyError):
                if stack.pid(target) != old and stack.ready_endpoints(0) == 4:
                    fault.recovered_s = time.monotonic() - fault.at_s
                    break
            await asyncio.sleep(0.05)
    else:
        raise ValueError(f"unknown fault {fault.name!r}")


def default_faults(cfg: ChaosConfig) -> list[Fault]:
    faults = [
        Fault("SIGKILL decode-0", 0.10),
        Fault("SIGKILL prefill-0", 0.25),
        Fault("SIGSTOP decode-1", 0.40),
        Fault("SIGSTOP prefill-1", 0.60),
    ]
    if cfg.router_restart:
        faults.append(Fault("SIGTERM router", 0.85))
    return faults


# -- the check ------------------------------------------------------------------------------------


def check_stream(
    out: Sequence[int], ref: Sequence[int], prompt: Sequence[int], tokens: SyntheticTokens
) -> tuple[bool, list[int]]:
    """Whether `out` is `ref` with at most `MAX_HANDOVERS` documented hand-overs; their points.

    At the first token that differs from the current expectation, the hand-over point is searched
    backwards (a continuation may agree with the old expectation for a token or two by chance).
    """
    if len(out) != len(ref):
        return False, []
    expected, base = list(ref), 0
    handovers: list[int] = []
    k = 0
    while k < len(out):
        if out[k] == expected[k - base]:
            k += 1
            continue
        if len(handovers) == MAX_HANDOVERS:
            return False, handovers
        for j in range(k, base, -1):  # a hand-over at j: Generate(prompt + out[:j]), index 0..
            key = tokens.key([*prompt, *out[:j]], None)
            cont = [tokens.token(key, i) for i in range(len(out) - j)]
            if list(out[j : k + 1]) == cont[: k + 1 - j]:
                expected, base = cont, j
                handovers.append(j)
                break
        else:
            return False, handovers
        k += 1
    return True, handovers


def summarize(
    cfg: ChaosConfig,
    stack: ChaosStack,
    all_prompts: list[list[int]],
    reference: list[Outcome],
    faulted: list[Outcome],
    faults: list[Fault],
    elapsed: tuple[float, float],
) -> dict[str, Any]:
    router_fault = next((f for f in faults if f.name.startswith("SIGTERM")), None)
    failed_worker: list[dict[str, Any]] = []
    failed_router: list[dict[str, Any]] = []
    corrupted: list[dict[str, Any]] = []
    handovers = moved = 0
    ref_failed = [o.index for o in reference if o.error]
    for o in faulted:
        if o.error:
            on_router = (
                router_fault is not None
                and o.replica == 0
                and o.start_s <= router_fault.end_s
                and o.end_s >= router_fault.at_s
            )
            (failed_router if on_router else failed_worker).append(
                {"index": o.index, "error": o.error}
            )
            continue
        moved += o.moved
        ok, points = check_stream(o.tokens, reference[o.index].tokens, all_prompts[o.index],
                                  stack.tokens)  # fmt: skip
        handovers += bool(points)
        if not ok:
            corrupted.append(
                {
                    "index": o.index,
                    "handovers": points,
                    "tokens": len(o.tokens),
                    "reference_tokens": len(reference[o.index].tokens),
                    "finish": _finish_name(o.finish),
                    "replica": o.replica,
                }
            )
    return {
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(cfg).items()},
        "reference_failed": ref_failed,
        "elapsed_s": {"fault_free": round(elapsed[0], 1), "faulted": round(elapsed[1], 1)},
        "requests": len(faulted),
        "failed_worker_faults": failed_worker,
        "failed_router_restart": failed_router,
        "failed_router_restart_pct": round(100 * len(failed_router) / max(1, len(faulted)), 3),
        "corrupted": corrupted,
        "streams_with_handover": handovers,
        "moved_to_other_replica": moved,
        "faults": [
            {
                "fault": f.name,
                "at_s": round(f.at_s - min(o.start_s for o in faulted), 1),
                "in_flight_at_fault": sum(o.start_s <= f.at_s <= o.end_s for o in faulted),
                "recovered_s": None if f.recovered_s is None else round(f.recovered_s, 2),
                "readmitted_after_ready_s": (
                    None if f.readmitted_s is None else round(f.readmitted_s, 2)
                ),
            }
            for f in faults
        ],
    }


async def run_chaos(cfg: ChaosConfig) -> dict[str, Any]:
    with chaos_stack(cfg) as stack:
        all_prompts = prompts(cfg, stack.tokens)
        reference, t_ref = await run_pass(stack, cfg, all_prompts)
        faults = default_faults(cfg)
        faulted, t_fault = await run_pass(stack, cfg, all_prompts, faults)
        return summarize(cfg, stack, all_prompts, reference, faulted, faults, (t_ref, t_fault))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=24)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--stop-s", type=float, default=10.0)
    parser.add_argument("--duration-s", type=float, default=90.0)
    parser.add_argument("--sim-time-scale", type=float, default=2.0)
    parser.add_argument("--no-router-restart", action="store_true")
    parser.add_argument("--run-dir", type=Path, default=Path("chaos-run"))
    parser.add_argument("--report", type=Path, default=None, help="Write the JSON report here.")
    args = parser.parse_args(argv)
    cfg = ChaosConfig(
        requests=args.requests,
        concurrency=args.concurrency,
        max_tokens=args.max_tokens,
        stop_s=args.stop_s,
        duration_s=args.duration_s,
        sim_time_scale=args.sim_time_scale,
        router_restart=not args.no_router_restart,
        run_dir=args.run_dir,
    )
    report = asyncio.run(run_chaos(cfg))
    text = json.dumps(report, indent=2)
    print(text)
    if args.report is not None:
        args.report.write_text(text + "\n")
    ok = (
        not report["failed_worker_faults"]
        and not report["corrupted"]
        and not report["reference_failed"]
        and report["failed_router_restart_pct"] <= 0.5
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
