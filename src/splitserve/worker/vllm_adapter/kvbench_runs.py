"""The runs of `make bench-kv` (see `kvbench`): `python -m splitserve.worker.vllm_adapter.kvbench`.

Prints Markdown tables; `--json FILE` also writes the raw numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from splitserve.worker.vllm_adapter.kvbench import (
    Client,
    MiB,
    Timing,
    WorkerProc,
    idle_cpu,
    med,
    ms,
    pct,
    prompt_of,
    raw_nixl_read_s,
    scrape,
    workers,
    xfer_delta,
)

BENCH_MODEL = {
    "num_layers": 8,
    "hidden_size": 512,
    "num_heads": 4,
    "num_kv_heads": 4,
    "intermediate_size": 1024,
    "max_position_embeddings": 4096,
}
"""About 22 M parameters, fp32: 32 KiB of KV per token (2 x 8 layers x 512 x 4 bytes)."""


def bench_model(path: Path) -> str:
    from splitserve.worker.vllm_adapter.tiny_model import TinyModelSpec, write_tiny_model

    if not (path / "config.json").exists():
        write_tiny_model(path, TinyModelSpec(**BENCH_MODEL))  # type: ignore[arg-type]
    return str(path)


def engine_args(max_model_len: int) -> list[str]:
    return ["--max-model-len", str(max_model_len), "--max-num-batched-tokens", str(max_model_len)]


# -- single requests ----------------------------------------------------------------------------


async def _single(
    p: WorkerProc, d: WorkerProc, lengths: Sequence[int], repeat: int, max_tokens: int
) -> dict[str, list[Timing]]:
    """P/D and control (Generate on D beside an idle P), interleaved per request."""
    client = Client()
    out: dict[str, list[Timing]] = {"pd": [], "control": []}
    try:
        for rep in range(repeat + 1):  # round 0 warms every path up: not counted
            for n in lengths:
                # Every request its own prompt: no prefix-cache hit on either worker.
                prompt = prompt_of(n, seed=1000 * rep + n)
                before = scrape(d)
                t = await client.pd(p.address, d.address, f"pd-{rep}-{n}", prompt, max_tokens)
                _, nbytes, secs = xfer_delta(before, scrape(d))
                t.kv_bytes, t.xfer_s = nbytes, secs
                other = prompt_of(n, seed=1000 * rep + n + 500)
                c = await client.generate(d.address, f"ctl-{rep}-{n}", other, max_tokens)
                c.mode = "control"
                if rep:
                    out["pd"].append(t)
                    out["control"].append(c)
    finally:
        await client.close()
    return out


async def _agg(d: WorkerProc, lengths: Sequence[int], repeat: int, max_tokens: int) -> list[Timing]:
    client = Client()
    out = []
    try:
        for rep in range(repeat + 1):
            for n in lengths:
                prompt = prompt_of(n, seed=1000 * rep + n + 700)
                t = await client.generate(d.address, f"agg-{rep}-{n}", prompt, max_tokens)
                if rep:
                    out.append(t)
    finally:
        await client.close()
    return out


def run_single(
    run_dir: Path,
    model: str,
    lengths: Sequence[int],
    repeat: int,
    max_tokens: int,
    env: dict[str, str],
    idle_s: float,
) -> dict[str, Any]:
    args = engine_args(max(lengths) + max_tokens + 16)
    res: dict[str, Any] = {}
    with workers(
        run_dir,
        model,
        [("prefill", "prefill", 0), ("decode", "decode", 1)],
        env=env,
        engine_args=args,
    ) as (p, d):
        time.sleep(2.0)
        res["idle_cpu"] = idle_cpu([p, d], idle_s)
        timings = asyncio.run(_single(p, d, lengths, repeat, max_tokens))
        res["idle_cpu_after"] = idle_cpu([p, d], idle_s)
    with workers(run_dir, model, [("decode", "mixed", 1)], env=env, engine_args=args) as (d,):
        timings["agg"] = asyncio.run(_agg(d, lengths, repeat, max_tokens))
    res["timings"] = timings
    raw: dict[int, list[float]] = {}
    for t in timings["pd"]:
        nbytes = int(t.kv_bytes)
        if nbytes and nbytes not in raw:
            raw[nbytes] = raw_nixl_read_s(nbytes, repeat=max(3, repeat))
    res["raw"] = raw
    return res


def report_single(res: dict[str, Any], lengths: Sequence[int]) -> str:
    t: dict[str, list[Timing]] = res["timings"]
    lines = [
        "| prompt | mode | TTFT ms | token-1 -> token-2 ms | KV MiB | NIXL xfer ms | raw NIXL ms "
        "| xfer / raw GB/s |",
        "|---:|---|---:|---:|---:|---:|---:|---|",
    ]
    for n in lengths:
        for mode in ("agg", "control", "pd"):
            rows = [x for x in t[mode] if x.prompt_tokens == n]
            if not rows:
                continue
            kv = med([x.kv_bytes for x in rows])
            xf = med([x.xfer_s for x in rows])
            raw_cell = bw = ""
            if mode == "pd" and kv:
                raw: list[float] = res["raw"].get(int(kv)) or []
                r = med(raw)
                raw_cell = ms(r)
                bw = f"{kv / xf / 1e9:.2f} / {kv / r / 1e9:.2f} ({100 * r / xf:.0f} %)"
            lines.append(
                f"| {n} | {mode} | {ms(med([x.ttft_s for x in rows]))} "
                f"| {ms(med([x.token2_s for x in rows]))} "
                f"| {kv / MiB:.1f} | {ms(xf) if xf else ''} | {raw_cell} | {bw} |"
                if mode == "pd"
                else f"| {n} | {mode} | {ms(med([x.ttft_s for x in rows]))} "
                f"| {ms(med([x.token2_s for x in rows]))} | | | | |"
            )
    idle = res["idle_cpu"]
    after = res["idle_cpu_after"]
    lines.append("")
    lines.append(
        "Idle CPU per worker (share of one core): "
        + ", ".join(
            f"{k} {100 * v:.1f} % (after the run {100 * after[k]:.1f} %)" for k, v in idle.items()
        )
    )
    return "\n".join(lines)


# -- entry --------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="kvbench", description=__doc__)
    ap.add_argument("--runs", default="single,interference,sim")
    ap.add_argument("--lengths", default="128,512,2048")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--idle-s", type=float, default=5.0)
    ap.add_argument("--model", default="", help="model dir (default: the bench model, generated)")
    ap.add_argument("--progress-thread", action="store_true", help="NIXL progress thread on")
    ap.add_argument("--json", default="", help="also write the raw numbers here")
    args = ap.parse_args(argv)
    lengths = [int(x) for x in args.lengths.split(",")]
    runs = set(args.runs.split(","))
    unknown = runs - {"single", "interference", "sim"}
    if unknown:
        raise SystemExit(f"unknown runs: {sorted(unknown)}")
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "splitserve"
    model = args.model or bench_model(cache / "kvbench-model")
    env = {"SPLITSERVE_NIXL_PROGRESS_THREAD": "1"} if args.progress_thread else {}
    print(f"# bench-kv ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})\n")
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, "
        f"load average {os.getloadavg()[0]:.2f}; model {model}; NIXL progress thread "
        f"{'on' if args.progress_thread else 'off'}\n"
    )
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="kvbench-") as tmp:
        run_dir = Path(tmp)
        if "single" in runs:
            res = run_single(
                run_dir, model, lengths, args.repeat, args.max_tokens, env, args.idle_s
            )
            print("## One request at a time\n")
            print(report_single(res, lengths))
            print()
            results["single"] = _jsonable(res)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


def _jsonable(x: Any) -> Any:
    if isinstance(x, Timing):
        return {k: getattr(x, k) for k in x.__slots__}
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_jsonable(v) for v in x]
    return x


__all__ = ["main", "pct"]
