"""Record a loaded local run for `splitserve sim validate`: start `splitserve up` with the router's
per-request log on, drive Poisson load through the official OpenAI client, stop, keep the log.

Usage:
    python tools/record_run.py OUT.jsonl --rate 2 --requests 60 --prompt 64:256 --output 8:32 \
        [--seed 0] [--profile-out DIR] -- <splitserve up options, e.g. --prefill 1 --decode 1>

Prompts are random token ids (so their length is exact), outputs are forced to their length with
`ignore_eos`. Each request is one non-streamed completion; the log (not the client) measures
TTFT / TPOT / latency, at the router.
"""

from __future__ import annotations

import argparse
import asyncio
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


async def drive(base_url: str, model: str, args: argparse.Namespace) -> tuple[int, int]:
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

    tasks = []
    for i, gap in enumerate(gaps):
        await asyncio.sleep(float(gap))
        tasks.append(asyncio.create_task(one(i)))
    await asyncio.gather(*tasks)
    await client.close()
    return ok, failed


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
    args = p.parse_args(argv[:cut])
    up_args = argv[cut + 1 :]
    run_dir = args.run_dir or args.out.with_suffix(".run")
    run_dir.mkdir(parents=True, exist_ok=True)
    args.out.unlink(missing_ok=True)
    ready = run_dir / "router.ready.json"
    ready.unlink(missing_ok=True)  # a previous run's file would point at a stopped router
    env = {**os.environ, "SPLITSERVE_REQUEST_LOG": str(args.out.resolve())}
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
        t0 = time.monotonic()
        ok, failed = asyncio.run(drive(base, args.model, args))
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
