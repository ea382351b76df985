"""`make bench-kv KVBENCH_ARGS="--runs fresh ..."`: the first requests on fresh pairs (issue 21,
item 3), as a distribution.

One prefill worker stays up (its engine warmed once); the decode worker is started afresh for
every pair — a new process, so a new NIXL agent, handshake and UCX connection to the prefill
worker — `pairs` times in each variant, the variants interleaved pair by pair (the order
alternating) so that load from other processes on a shared machine hits both alike:

* `window`: `WarmKv` as the router sends it when a worker joins (handshake, connection and the
  warm-up READ of vLLM's null block, `nixl.WarmReads`), the prefill worker asked to progress
  NIXL meanwhile (`KvEndpointRequest.warm_up_ms`, `nixl.WarmupWindow`);
* `read`: the same without that window (`SPLITSERVE_KV_WARMUP_MS=0`: before it);
* `noread`: `read` with the warm-up READ off too (`SPLITSERVE_KV_WARM_READ=0`).

`variants` picks which (default `window` and `read`).

Each fresh decode worker first runs two Generate requests (the one-off costs of a process's
first forward passes, which are not the pair's), then gets `WarmKv`, then, after `settle_s`
(the warm-up READ is not waited for), `requests` P/D requests one at a time, each with its own
prompt of `length` tokens. Recorded per request: TTFT and the token-1 -> token-2 gap; the
report gives the first, second and last (by default the tenth) request's over the pairs:
median, min and max. With `--trace`, the decode workers' `kvtrace` milestones of the first and
the last request, per variant.
"""

from __future__ import annotations

import asyncio
import statistics
import time
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from splitserve.worker.vllm_adapter.kvbench import (
    Client,
    Timing,
    WorkerProc,
    cpu_seconds,
    idle_cpu,
    ms,
    prompt_of,
    start_worker,
    stop_worker,
)

IDLE_AFTER_S = 1.5
IDLE_S = 2.0
"""After the settling time, wait `IDLE_AFTER_S` more (past a 2 s warm-up window) and measure
both workers' idle CPU over `IDLE_S`."""

VARIANTS: Mapping[str, Mapping[str, str]] = {
    "window": {"SPLITSERVE_KV_WARM_READ": "1", "SPLITSERVE_KV_WARMUP_MS": ""},
    "read": {"SPLITSERVE_KV_WARM_READ": "1", "SPLITSERVE_KV_WARMUP_MS": "0"},
    "noread": {"SPLITSERVE_KV_WARM_READ": "0", "SPLITSERVE_KV_WARMUP_MS": "0"},
}
"""Variant -> environment of its decode workers."""
DEFAULT_VARIANTS = ("window", "read")


async def _pair_requests(
    p: WorkerProc,
    d: WorkerProc,
    tag: str,
    length: int,
    requests: int,
    max_tokens: int,
    settle_s: float,
    trace: Any,
    cpu: dict[str, float],
) -> list[Timing]:
    from splitserve._gen.v1 import worker_pb2, worker_pb2_grpc

    client = Client(trace)
    out: list[Timing] = []
    try:
        for n in (64, 300):  # the decode process's first forward passes: not the pair's cost
            await client.generate(d.address, f"warm-{tag}-{n}", prompt_of(n, seed=-n), max_tokens)
        stub = worker_pb2_grpc.WorkerKvStub(client.channel(d.address))
        t0, c0 = time.monotonic(), cpu_seconds(p.pid)
        warmed = await stub.WarmKv(worker_pb2.WarmKvRequest(peers=[p.address]), timeout=120)
        if warmed.failed:
            raise RuntimeError(f"WarmKv failed: {list(warmed.failed)}")
        await asyncio.sleep(settle_s)
        # The prefill worker's share of a core from WarmKv to the end of the settling time (its
        # warm-up window, if asked for, inside), then both workers' once any window is over.
        cpu["prefill_warm"] = (cpu_seconds(p.pid) - c0) / (time.monotonic() - t0)
        await asyncio.sleep(IDLE_AFTER_S)
        idle = idle_cpu([p, d], IDLE_S)
        cpu["prefill_idle"], cpu["decode_idle"] = idle[p.name], idle[d.name]
        for k in range(requests):
            prompt = prompt_of(length, seed=zlib.crc32(f"{tag}-{k}".encode()))
            out.append(await client.pd(p.address, d.address, f"{tag}-{k}", prompt, max_tokens))
    finally:
        await client.close()
    return out


def run_fresh(
    run_dir: Path,
    model: str,
    *,
    pairs: int,
    length: int,
    requests: int,
    max_tokens: int,
    env: Mapping[str, str],
    engine_args: Sequence[str],
    settle_s: float = 1.0,
    trace: bool = False,
    decode_cpu: int = 1,
    variants: Sequence[str] = DEFAULT_VARIANTS,
) -> dict[str, Any]:
    """The runs described in the module doc. Returns {"timings": {variant: [[Timing per
    request] per pair]}, "shape": ..., "trace": {rid: milestones}} (trace only with `trace`)."""
    from splitserve.worker.vllm_adapter import kvtrace

    if pairs < 1 or requests < 2:
        raise ValueError("fresh pairs need pairs >= 1 and requests >= 2")
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown or not variants:
        raise ValueError(f"fresh variants must be some of {list(VARIANTS)}, got {list(variants)}")
    trace_file = run_dir / "kvtrace-fresh.jsonl"
    base = dict(env)
    if trace:
        trace_file.unlink(missing_ok=True)
        base[kvtrace.TRACE_ENV] = str(trace_file)
    kw: dict[str, Any] = {"engine_args": list(engine_args)}
    timings: dict[str, list[list[Timing]]] = {v: [] for v in variants}
    cpus: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
    starts: list[float] = []
    p = start_worker(run_dir, "prefill", "prefill", model, 0, env=base, **kw)
    tracer = kvtrace.KvTrace(trace_file) if trace else None
    try:
        _warm_prefill(p, max_tokens)
        for i in range(pairs):
            order = list(variants) if i % 2 == 0 else list(variants)[::-1]
            for variant in order:
                denv = {**base, **VARIANTS[variant]}
                t0 = time.monotonic()
                d = start_worker(run_dir, f"decode-{variant}-{i}", "decode", model, decode_cpu,
                                 env=denv, **kw)  # fmt: skip
                starts.append(time.monotonic() - t0)
                cpu: dict[str, float] = {}
                try:
                    got = asyncio.run(
                        _pair_requests(
                            p, d, f"{variant}-{i}", length, requests, max_tokens, settle_s, tracer,
                            cpu,
                        )
                    )  # fmt: skip
                finally:
                    stop_worker(d)
                timings[variant].append(got)
                cpus[variant].append(cpu)
    finally:
        if tracer is not None:
            tracer.close()
        stop_worker(p)
    res: dict[str, Any] = {
        "timings": timings,
        "cpu": cpus,
        "shape": {
            "pairs": pairs,
            "length": length,
            "requests": requests,
            "max_tokens": max_tokens,
            "settle_s": settle_s,
            "decode_start_s": starts,
            "variants": list(variants),
        },
    }
    if trace:
        events = kvtrace.load(trace_file)
        res["trace"] = {
            rid: kvtrace.milestones(ev)
            for rid, ev in events.items()
            if rid.split("-", 1)[0] in variants
        }
    return res


def _warm_prefill(p: WorkerProc, max_tokens: int) -> None:
    async def go() -> None:
        from splitserve._gen.v1 import worker_pb2

        client = Client()
        try:
            for n in (64, 300):
                out = await client.stub(p.address).Prefill(
                    worker_pb2.PrefillRequest(
                        request_id=f"warm-p-{n}",
                        prompt_token_ids=prompt_of(n, seed=-2 * n),
                        sampling=client.sampling(max_tokens),
                    )
                )
                await client.stub(p.address).Cancel(
                    worker_pb2.CancelRequest(request_id=out.request_id)
                )
        finally:
            await client.close()

    asyncio.run(go())


def ordinal(n: int) -> str:
    """1st, 2nd, 3rd, 4th, ... 11th, 12th, 13th, ... 21st."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def spread(values: Sequence[float]) -> str:
    """`median (min–max)` in ms; `n/a` for none."""
    if not values:
        return "n/a"
    return f"{ms(statistics.median(values))} ({ms(min(values))}–{ms(max(values))})"


def pct(values: Sequence[float]) -> str:
    """Fractions of a core as `median (min–max)` in %; `n/a` for none."""
    if not values:
        return "n/a"
    med, lo, hi = (100 * x for x in (statistics.median(values), min(values), max(values)))
    return f"{med:.1f} ({lo:.1f}–{hi:.1f})"


def summary(timings: Mapping[str, Sequence[Sequence[Any]]]) -> list[dict[str, Any]]:
    """Per variant and request position (first, second, last): the TTFT and token-1 ->
    token-2 gap of that request over the pairs. Works on `Timing`s or their JSON dicts."""

    def get(t: Any, key: str) -> float:
        return float(t[key] if isinstance(t, Mapping) else getattr(t, key))

    rows = []
    for variant, per_pair in timings.items():
        if not per_pair:
            continue
        last = min(len(reqs) for reqs in per_pair)
        for k in sorted({0, 1, last - 1}):
            label = ordinal(k + 1)
            at = [reqs[k] for reqs in per_pair]
            rows.append(
                {
                    "variant": variant,
                    "request": label,
                    "pairs": len(at),
                    "ttft_s": [get(t, "ttft_s") for t in at],
                    "gap_s": [get(t, "token2_s") for t in at],
                }
            )
        later = [t for reqs in per_pair for t in reqs[1:last]]
        rows.append(
            {
                "variant": variant,
                "request": f"2nd–{ordinal(last)}, pooled",
                "pairs": len(per_pair),
                "ttft_s": [get(t, "ttft_s") for t in later],
                "gap_s": [get(t, "token2_s") for t in later],
            }
        )
    return rows


def report_fresh(res: Mapping[str, Any]) -> str:
    sh = res["shape"]
    lines = [
        f"{sh['pairs']} fresh decode workers per variant (variants interleaved), each paired "
        f"with the same prefill worker: {sh['requests']} P/D requests of {sh['length']} tokens "
        f"one at a time, {sh['settle_s']:g} s after `WarmKv`. Decode worker start: "
        f"{spread(sh['decode_start_s'])} ms.",
        "",
        "| variant | request | pairs | TTFT ms median (min–max) | token-1 -> token-2 ms median "
        "(min–max) |",
        "|---|---|---:|---:|---:|",
    ]
    for row in summary(res["timings"]):
        lines.append(
            f"| {row['variant']} | {row['request']} | {row['pairs']} | {spread(row['ttft_s'])} "
            f"| {spread(row['gap_s'])} |"
        )
    cpu = res.get("cpu")
    if cpu:
        lines += [
            "",
            "Share of a core, % median (min–max) over the pairs: the prefill worker from WarmKv "
            f"to {sh['settle_s']:g} s later; then each worker idle over {IDLE_S:g} s, "
            f"{IDLE_AFTER_S:g} s after that.",
            "",
            "| variant | prefill, warm-up | prefill idle | decode idle |",
            "|---|---:|---:|---:|",
        ]
        for variant, per_pair in cpu.items():
            cells = [
                pct([c[k] for c in per_pair if k in c])
                for k in ("prefill_warm", "prefill_idle", "decode_idle")
            ]
            lines.append(f"| {variant} | " + " | ".join(cells) + " |")
    trace = res.get("trace")
    if trace:
        variants = sh.get("variants") or list(res["timings"])
        lines += ["", report_fresh_trace(trace, int(sh["requests"]), variants)]
    return "\n".join(lines)


def report_fresh_trace(
    trace: Mapping[str, Mapping[str, float]],
    requests: int,
    variants: Sequence[str] = DEFAULT_VARIANTS,
) -> str:
    """Median milestone intervals of the first and the last request per variant."""
    from splitserve.worker.vllm_adapter import kvtrace

    cols: list[tuple[str, list[Mapping[str, float]]]] = []
    for variant in variants:
        for label, k in (("1st", 0), (ordinal(requests), requests - 1)):
            rows = [
                m
                for rid, m in trace.items()
                if rid.startswith(f"{variant}-") and rid.rsplit("-", 1)[1] == str(k)
            ]
            cols.append((f"{variant} {label}", rows))
    lines = kvtrace.breakdown_rows(cols)
    whole = []
    for _, rows in cols:
        gaps = [r["token2"] - r["token1"] for r in rows if "token1" in r and "token2" in r]
        whole.append(f"{1000 * statistics.median(gaps):.2f}" if gaps else "")
    lines.append("| **token1 -> token2** | " + " | ".join(whole) + " |")
    return "\n".join(lines)


__all__ = ["VARIANTS", "ordinal", "report_fresh", "run_fresh", "spread", "summary"]
