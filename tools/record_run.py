"""Record a loaded local run for `splitserve sim validate`: start `splitserve up` with the router's
per-request log on, drive Poisson load through the official OpenAI client, stop, keep the log.

Usage:
    python tools/record_run.py OUT.jsonl --rate 2 --requests 60 --prompt 64:256 --output 8:32 \
        [--seed 0] [--profile-out DIR] [--steps-out DIR] -- <splitserve up options, e.g.
        --prefill 1 --decode 1>

Prompts are random token ids (so their length is exact), outputs are forced to their length with
`ignore_eos`. Each request is one non-streamed completion; the log (not the client) measures
TTFT / TPOT / latency, at the router.

`--steps-out DIR` watches every worker's `WatchSteps` stream during the load and writes
`DIR/<worker>.steps.csv` (`core.perf.samples.STEP_COLUMNS`: each step the worker ran, its start
on the worker's monotonic clock, which is the router log's clock on one machine, its duration
and its exact batch shape), for `splitserve sim validate --run-steps DIR`. It also has every
worker write `DIR/kv_pulls.jsonl` (`splitserve.worker.kv_pull_log`: per P/D request, when its
Decode reached the decode worker and its KV pull's start and end), which the replay charges per
request as the hand-off (`--run-handoff`).
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
from pathlib import Path

import numpy as np
from openai import AsyncOpenAI


def _range(text: str) -> tuple[int, int]:
    lo, _, hi = text.partition(":")
    return int(lo), int(hi or lo)


async def watch_steps(name: str, address: str, stop: asyncio.Event) -> list[str]:
    """Every step `name` runs until `stop` is set (plus a moment for the last samples), as the
    lines of the steps CSV."""
    import grpc

    from splitserve._gen.v1 import worker_pb2, worker_pb2_grpc
    from splitserve.core.perf.samples import steps_csv
    from splitserve.security import tls
    from splitserve.worker.server import step_from_pb

    rows = []
    dropped = 0
    async with tls.aio_channel(address) as channel:
        stub = worker_pb2_grpc.WorkerStub(channel)
        call = stub.WatchSteps(worker_pb2.WatchStepsRequest(max_buffer=1 << 16))
        await asyncio.wait_for(call.initial_metadata(), timeout=30.0)  # subscribed from here

        async def read() -> None:
            nonlocal dropped
            async for pb in call:
                s = step_from_pb(pb)
                rows.append((s.index, s.start_s, s.duration_s, s.batch))
                dropped = pb.dropped

        reader = asyncio.create_task(read())
        await stop.wait()
        await asyncio.sleep(1.0)
        call.cancel()
        with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
            await reader
    print(f"{name}: {len(rows)} steps ({dropped} dropped)")
    return steps_csv(rows)


async def drive(
    base_url: str,
    model: str,
    args: argparse.Namespace,
    workers: dict[str, str] | None = None,
) -> tuple[int, int, dict[str, list[str]]]:
    rng = np.random.default_rng(args.seed)
    gaps = rng.exponential(1.0 / args.rate, args.requests)
    plo, phi = _range(args.prompt)
    olo, ohi = _range(args.output)
    client = AsyncOpenAI(base_url=base_url, api_key="none", max_retries=0, timeout=600)
    ok = failed = 0

    async def one(i: int) -> None:
        nonlocal ok, failed
        n = int(rng.integers(plo, phi + 1))
        out = int(rng.integers(olo, ohi + 1))
        prompt = [int(t) for t in rng.integers(args.min_token_id, args.max_token_id, n)]
        try:
            await client.completions.create(
                model=model,
                prompt=prompt,
                max_tokens=out,
                temperature=0.0,
                extra_body={"ignore_eos": True},
            )
            ok += 1
        except Exception as err:
            failed += 1
            print(f"request {i} failed: {err}", file=sys.stderr)

    stop = asyncio.Event()
    watchers = {
        name: asyncio.create_task(watch_steps(name, address, stop))
        for name, address in (workers or {}).items()
    }
    if watchers:  # subscribed before the first request
        await asyncio.sleep(1.0)
    tasks = []
    for i, gap in enumerate(gaps):
        await asyncio.sleep(float(gap))
        tasks.append(asyncio.create_task(one(i)))
    await asyncio.gather(*tasks)
    stop.set()
    steps = {name: await task for name, task in watchers.items()}
    await client.close()
    return ok, failed, steps


def main() -> None:
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    p = argparse.ArgumentParser()
    p.add_argument("out", type=Path)
    p.add_argument("--rate", type=float, required=True)
    p.add_argument("--requests", type=int, default=60)
    p.add_argument("--prompt", default="64:256")
    p.add_argument("--output", default="8:32")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--min-token-id", type=int, default=300)
    p.add_argument("--max-token-id", type=int, default=1000)
    p.add_argument("--model", default="splitserve-sim")
    p.add_argument("--run-dir", type=Path, default=None)
    p.add_argument(
        "--profile-out",
        type=Path,
        default=None,
        help="After the load, run `splitserve profile` on the first worker into this directory.",
    )
    p.add_argument("--profile-args", default="", help="Extra `splitserve profile` options.")
    p.add_argument(
        "--speed-probe",
        type=Path,
        default=None,
        help="Run tools/speed_probe.py beside the load and the profile, writing the machine's "
        "speed here (with the profile's window as the reference) for `sim validate "
        "--speed-trace`.",
    )
    p.add_argument(
        "--steps-out",
        type=Path,
        default=None,
        help="Write every worker's steps during the load (WatchSteps) to DIR/<worker>.steps.csv "
        "for `sim validate --run-steps DIR`.",
    )
    args = p.parse_args(argv[:cut])
    up_args = argv[cut + 1 :]
    run_dir = args.run_dir or args.out.with_suffix(".run")
    run_dir.mkdir(parents=True, exist_ok=True)
    args.out.unlink(missing_ok=True)
    ready = run_dir / "router.ready.json"
    ready.unlink(missing_ok=True)  # a previous run's file would point at a stopped router
    env = {**os.environ, "SPLITSERVE_REQUEST_LOG": str(args.out.resolve())}
    if args.steps_out is not None:  # the decode workers' per-request hand-off (P/D)
        args.steps_out.mkdir(parents=True, exist_ok=True)
        pulls = (args.steps_out / "kv_pulls.jsonl").resolve()
        pulls.unlink(missing_ok=True)
        env["SPLITSERVE_KV_PULL_LOG"] = str(pulls)
    cmd = [sys.executable, "-m", "splitserve", "up", "--run-dir", str(run_dir), "--port", "0"]
    cmd += up_args
    log = (run_dir / "up.out").open("w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    probe = None
    window: tuple[float, float] | None = None
    try:
        deadline = time.monotonic() + 600
        while not ready.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"splitserve up did not come up; see {run_dir}/up.out")
            time.sleep(0.5)
        time.sleep(1.0)
        info = json.loads(ready.read_text())
        base = f"http://{info['host']}:{info['port']}/v1"
        if args.speed_probe is not None:
            script = Path(__file__).with_name("speed_probe.py")
            probe = subprocess.Popen([sys.executable, str(script), str(args.speed_probe)])
        workers: dict[str, str] = {}
        if args.steps_out is not None:
            args.steps_out.mkdir(parents=True, exist_ok=True)
            for path in sorted(run_dir.glob("*.ready.json")):
                name = path.name.removesuffix(".ready.json")
                if name.split("-")[0] in ("prefill", "decode", "mixed"):
                    workers[name] = json.loads(path.read_text())["address"]
            admin = run_dir / "pki" / "admin"
            if admin.is_dir():
                from splitserve.security import tls

                tls.configure(admin)
        t0 = time.monotonic()
        ok, failed, steps = asyncio.run(drive(base, args.model, args, workers))
        for name, lines in steps.items():
            (args.steps_out / f"{name}.steps.csv").write_text("\n".join(lines) + "\n")
        print(f"{ok} ok, {failed} failed in {time.monotonic() - t0:.1f} s -> {args.out}")
        if args.profile_out is not None:
            worker = sorted(run_dir.glob("*-0.ready.json"))[0]
            address = json.loads(worker.read_text())["address"]
            prof = [sys.executable, "-m", "splitserve", "profile", "--worker", address]
            admin = run_dir / "pki" / "admin"  # `up` issues internal TLS (docs/security.md)
            if admin.is_dir():
                prof += ["--tls-dir", str(admin)]
            prof += ["--out", str(args.profile_out), *args.profile_args.split()]
            start = time.monotonic()
            subprocess.run(prof, check=True)
            window = (start, time.monotonic())
    finally:
        if probe is not None:
            probe.send_signal(signal.SIGINT)
            probe.wait(10)
            if window is not None:
                with args.speed_probe.open("a") as f:
                    ref = {"reference_start_s": window[0], "reference_end_s": window[1]}
                    f.write(json.dumps(ref) + "\n")
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


if __name__ == "__main__":
    main()
