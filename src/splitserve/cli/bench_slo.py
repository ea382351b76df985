"""`make bench-slo`: the SLO router against the wave-1 router under a two-class overload.

Not a test: it measures and prints (and writes JSON). Method:

* a local stack (`splitserve up`: real processes) of 1 prefill + 1 decode simulated worker
  (llama-2-7b on A100, roofline, slowed by `--sim-time-scale`), and one router;
* two classes: `interactive` (30 %, non-sheddable, priority 10, tight TTFT) and `batch` (70 %,
  sheddable, loose TTFT); prompts 1024-2048 tokens, outputs 32-128 (`ignore_eos`), Poisson
  arrivals, the same seeded sequence for both routers at a given rate;
* (a) wave-1 router: least-loaded placement, no classes, every request dispatched at once
  (`admission: false`); (b) the SLO router: the classes, the `default` profile, admission on;
* client-side measurements: TTFT from sending to the first streamed token, TPOT = (end - first)
  / (tokens - 1); a request *meets* its SLO when both hold; shed = HTTP 429;
* (a) runs at increasing rates until its interactive attainment drops below the target (rate
  L); then (a) and (b) both run at 1.5 L. Reported per class: attainment (met / arrived),
  goodput (met per second), shed fraction.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from splitserve.cli.process import die_with_parent

CLASSES: dict[str, dict[str, Any]] = {
    "interactive": {"ttftMs": 2000, "tpotMs": 200, "priority": 10, "attainment": 0.9},
    "batch": {"ttftMs": 8000, "tpotMs": 1000, "sheddable": True, "attainment": 0.5},
}
SHARE = {"interactive": 0.3, "batch": 0.7}
FAILED = 599
UNFINISHED = 598
"""A request still running `--grace` seconds after the run's last arrival: cut, an error."""
"""The status of a request that failed after its status line: the connection broke, or the
stream ended in an error event (a 200 then; it was counted as meeting its SLO when its first
token came in time)."""


@dataclass(frozen=True)
class Arrival:
    t_s: float
    slo_class: str
    prompt_tokens: int
    max_tokens: int


@dataclass
class Outcome:
    slo_class: str
    status: int
    ttft_s: float | None = None
    tpot_s: float | None = None
    tokens: int = 0

    def met(self) -> bool:
        c = CLASSES[self.slo_class]
        return (
            self.status == 200
            and self.ttft_s is not None
            and self.ttft_s <= c["ttftMs"] / 1000
            and (self.tpot_s is None or self.tpot_s <= c["tpotMs"] / 1000)
        )


def arrivals(rate: float, duration_s: float, seed: int) -> list[Arrival]:
    rng = random.Random(seed)
    out: list[Arrival] = []
    t = 0.0
    while True:
        t += rng.expovariate(rate)
        if t > duration_s:
            return out
        cls = "interactive" if rng.random() < SHARE["interactive"] else "batch"
        out.append(Arrival(t, cls, rng.randint(1024, 2048), rng.randint(32, 128)))


class Stack:
    def __init__(self, slo: bool, time_scale: float, run_dir: Path) -> None:
        config: dict[str, Any] = {
            "router": {"placementProfile": "least-loaded", "admission": False}
        }
        if slo:
            config = {
                "sloClasses": [{"name": n, **c} for n, c in CLASSES.items()],
                "defaultSloClass": "batch",
                "router": {"placementProfile": "default"},
            }
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "slo.yaml").write_text(yaml.safe_dump(config))
        self.slo = slo
        self.run_dir = run_dir
        argv = [
            sys.executable, "-m", "splitserve", "up",
            "--prefill", "1", "--decode", "1", "--port", "0", "--grpc-port", "0",
            "--sim-time-scale", str(time_scale), "--max-model-len", "4096",
            "--slo-config", str(run_dir / "slo.yaml"),
            "--run-dir", str(run_dir / "up"), "--log-level", "WARNING",
        ]  # fmt: skip
        env = dict(os.environ, SPLITSERVE_CACHE_DIR=str(run_dir.parent / "cache"))
        self.log = (run_dir / "up.log").open("w")
        # `up` stops its workers and router when this process dies, even by SIGKILL (it was
        # left running with them when the bench was killed)
        self.proc = subprocess.Popen(
            argv, stdout=self.log, stderr=subprocess.STDOUT, env=env, preexec_fn=die_with_parent
        )

    def base_url(self, timeout_s: float = 600) -> str:
        ready = self.run_dir / "up" / "router.ready.json"
        deadline = time.monotonic() + timeout_s
        while not ready.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"splitserve up did not start (see {self.run_dir}/up.log)")
            time.sleep(0.2)
        info = json.loads(ready.read_text())
        return f"http://127.0.0.1:{info['port']}/v1"

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


async def one(client: httpx.AsyncClient, base: str, a: Arrival, slo: bool) -> Outcome:
    body = {
        "model": "splitserve-sim",
        "prompt": [100 + (i % 50) for i in range(a.prompt_tokens)],
        "max_tokens": a.max_tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    headers = {"x-slo-class": a.slo_class} if slo else {}
    sent = time.monotonic()
    first = last = None
    n = 0
    try:
        async with client.stream("POST", f"{base}/completions", json=body, headers=headers) as r:
            if r.status_code != 200:
                await r.aread()
                return Outcome(a.slo_class, r.status_code)
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if event.get("error"):
                    return Outcome(a.slo_class, FAILED)
                if event.get("usage"):
                    n = int(event["usage"]["completion_tokens"])
                if not event.get("choices"):
                    continue
                now = time.monotonic()
                if first is None:
                    first = now
                last = now
    except httpx.HTTPError:
        return Outcome(a.slo_class, FAILED)
    ttft = None if first is None else first - sent
    tpot = None if first is None or last is None or n < 2 else (last - first) / (n - 1)
    return Outcome(a.slo_class, 200, ttft, tpot, n)


async def drive(base: str, seq: list[Arrival], slo: bool, grace_s: float = 120.0) -> list[Outcome]:
    """Send `seq` at its arrival times; the outcomes in its order. Bounded: what still runs
    `grace_s` after the last arrival is cut and counted `UNFINISHED`."""
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=1000)
    async with httpx.AsyncClient(timeout=300, limits=limits) as client:
        for i in range(4):  # warm-up (connections, first calls, the latency model), not counted
            await one(client, base, Arrival(0.0, "batch", 1024 + 256 * i, 16), slo)
        start = time.monotonic()
        tasks = []
        for a in seq:
            delay = start + a.t_s - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(client, base, a, slo)))
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=grace_s)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        return [
            t.result() if not t.cancelled() else Outcome(a.slo_class, UNFINISHED)
            for t, a in zip(tasks, seq, strict=True)
        ]


def summarize(outs: list[Outcome], duration_s: float) -> dict[str, dict[str, float | None]]:
    """Per class; `attainment` and `shed_fraction` are None when none of the class arrived (it
    read 0 %: a run too short for any arrival "dropped below the target")."""
    table: dict[str, dict[str, float | None]] = {}
    for cls in CLASSES:
        mine = [o for o in outs if o.slo_class == cls]
        n = len(mine) or 1
        met = sum(o.met() for o in mine)
        table[cls] = {
            "arrived": len(mine),
            "attainment": met / n if mine else None,
            "goodput_rps": met / duration_s,
            "shed_fraction": sum(o.status == 429 for o in mine) / n if mine else None,
            "errors": sum(o.status not in (200, 429) for o in mine),
        }
    return table


def run(slo: bool, rate: float, args: argparse.Namespace, tag: str) -> dict[str, Any]:
    seq = arrivals(rate, args.duration, args.seed)
    stack = Stack(slo, args.time_scale, Path(args.work) / tag)
    try:
        base = stack.base_url()
        outs = asyncio.run(drive(base, seq, slo, args.grace))
    finally:
        stack.stop()
    (stack.run_dir / "outcomes.json").write_text(
        json.dumps([{**asdict(o), "met": o.met()} for o in outs])
    )
    result = {
        "router": "slo" if slo else "wave-1",
        "rate_rps": rate,
        "classes": summarize(outs, args.duration),
    }
    print(json.dumps(result), flush=True)
    return result


def _positive(text: str) -> float:
    """An argparse type: a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number > 0")
    return value


def _rates(text: str) -> list[float]:
    """An argparse type: comma-separated rates > 0 (a negative one looped forever drawing
    arrivals, 0 was a ZeroDivisionError, a word a traceback)."""
    try:
        return [_positive(r.strip()) for r in text.split(",")]
    except argparse.ArgumentTypeError as err:
        raise argparse.ArgumentTypeError(f"{text!r}: {err}" if "," in text else str(err)) from None


def find_knee(
    rates: list[float], run_at: Callable[[float], dict[str, Any]], duration_s: float
) -> tuple[float, list[dict[str, Any]]]:
    """Run the wave-1 router at each rate until its interactive attainment drops below the
    target: (that rate, the runs). A run in which no interactive request arrived stops the
    sweep with a message (it read 0 % and was taken for the knee)."""
    target = CLASSES["interactive"]["attainment"]
    sweep = []
    for rate in rates:
        r = run_at(rate)
        sweep.append(r)
        attainment = r["classes"]["interactive"]["attainment"]
        if attainment is None:
            raise SystemExit(
                f"no interactive request arrived at {rate:g} req/s in {duration_s:g} s of "
                "arrivals: raise --duration or --rates"
            )
        if attainment < target:
            return rate, sweep
    raise SystemExit("the wave-1 router never dropped below the target: raise --rates")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m splitserve.cli.bench_slo", description=__doc__.split("\n")[0]
    )
    p.add_argument(
        "--rates",
        type=_rates,
        default=[0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0],
        help="wave-1 sweep, requests/s, comma-separated",
    )
    p.add_argument("--duration", type=_positive, default=60.0, help="seconds of arrivals per run")
    p.add_argument("--time-scale", type=_positive, default=4.0, help="sim engine slow-down")
    p.add_argument(
        "--grace",
        type=_positive,
        default=120.0,
        help="seconds a run waits after its last arrival; what still runs is cut (an error)",
    )
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", default="build/bench-slo.json")
    p.add_argument("--work", default=None, help="run directories (default: a new temporary one)")
    args = p.parse_args(argv)
    if args.work is None:  # made at parse time before, so every --help left one behind
        args.work = tempfile.mkdtemp(prefix="bench-slo-")
    target = CLASSES["interactive"]["attainment"]
    knee, sweep = find_knee(
        args.rates, lambda rate: run(False, rate, args, f"wave1-{rate}"), args.duration
    )
    over = 1.5 * knee
    a = run(False, over, args, "wave1-over")
    b = run(True, over, args, "slo-over")
    report = {
        "machine": f"{os.cpu_count()} CPUs (shared), simulated llama-2-7b on a100-80g, "
        f"time scale {args.time_scale}",
        "duration_s": args.duration,
        "knee_rps": knee,
        "sweep": sweep,
        "overload": {"rate_rps": over, "wave1": a, "slo": b},
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(
        f"\nwave-1 interactive attainment drops below {target:.0%} at {knee} req/s; at "
        f"{over:g} req/s (1.5x):"
    )
    print(f"{'class':<12} {'router':<7} {'attain':>7} {'goodput/s':>10} {'shed':>6}")
    for cls in CLASSES:
        for name, r in (("wave-1", a), ("slo", b)):
            c = r["classes"][cls]
            print(
                f"{cls:<12} {name:<7} {_pct(c['attainment']):>7} {c['goodput_rps']:>10.2f} "
                f"{_pct(c['shed_fraction']):>6}"
            )
    # the run directory was printed nowhere: a default one (a new temporary directory) held
    # the outcomes the docs point to and could not be found
    print(f"(written to {args.out}; each request's outcome: {args.work}/*/outcomes.json)")


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


if __name__ == "__main__":
    # a plain `kill` stops the stack too (the finally in `run`; `up` was left running)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    main()
