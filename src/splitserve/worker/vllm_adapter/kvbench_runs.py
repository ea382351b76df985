"""The runs of `make bench-kv` (see `kvbench`): `python -m splitserve.worker.vllm_adapter.kvbench`.

Prints Markdown tables; `--json FILE` also writes the raw numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import functools
import itertools
import json
import math
import os
import platform
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from splitserve.worker.vllm_adapter.kvbench import (
    Client,
    MiB,
    RawNixl,
    ReadMethod,
    Timing,
    WorkerProc,
    anon_huge_kib,
    idle_cpu,
    med,
    ms,
    pct,
    prompt_of,
    scrape,
    workers,
    xfer_delta,
)

BENCH_MODEL: dict[str, Any] = {
    "num_layers": 8,
    "hidden_size": 512,
    "num_heads": 4,
    "num_kv_heads": 4,
    "intermediate_size": 1024,
    "max_position_embeddings": 4096,
}
"""About 22 M parameters, fp32: 32 KiB of KV per token (2 x 8 layers x 512 x 4 bytes)."""

DECODE_CPU = 1
"""The core of the single run's decode worker."""

PREFILL_CPU = 0
"""The core of the single run's prefill worker. The raw READs' target processes run here too:
they stand in for the prefill (the READ's source), and their polling loop (a wake-up every
millisecond) on the decode's core took 0.1–0.6 ms of it from each of vLLM's READs
(2026-11-27, `perf sched`), while the raw reader dodged it."""


def bytes_per_token(model_dir: str) -> int:
    """KV bytes per token of a Hugging Face Llama-style model directory in fp32 (the bench's)."""
    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    heads = int(cfg["num_attention_heads"])
    head_dim = int(cfg.get("head_dim") or cfg["hidden_size"] // heads)
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    return 2 * int(cfg["num_hidden_layers"]) * kv_heads * head_dim * 4


def bench_model(path: Path) -> str:
    from splitserve.worker.vllm_adapter.tiny_model import TinyModelSpec, write_tiny_model

    if not (path / "config.json").exists():
        write_tiny_model(path, TinyModelSpec(**BENCH_MODEL))
    return str(path)


def decode_kv_bytes(env: dict[str, str]) -> int:
    """The decode worker's KV cache size in bytes: `VLLM_CPU_KVCACHE_SPACE` (GiB) as
    `start_worker` sets it (`local_cpu_env`, then the run's `env` on top)."""
    from splitserve.worker.vllm_adapter.engine import local_cpu_env

    gib = {**os.environ, **local_cpu_env(), **env}["VLLM_CPU_KVCACHE_SPACE"]
    return int(float(gib) * (1 << 30))


def engine_args(max_model_len: int) -> list[str]:
    return ["--max-model-len", str(max_model_len), "--max-num-batched-tokens", str(max_model_len)]


# -- single requests ----------------------------------------------------------------------------


def _read_into(out: list[Any], raw: RawNixl, nbytes: int, method: ReadMethod) -> None:
    out.extend(raw.read(nbytes, 2, method))


def kv_regions(model_dir: str) -> int:
    """Regions of vLLM's CPU KV cache that a READ's descriptors spread over: one per layer, a
    block's K and V side by side in it (vLLM 0.32 asked `make_prepped_xfer` for 128
    descriptors for the bench model's 16-block prompts: 8 layers x 16, `kvtrace`'s
    `prepped_descs`)."""
    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    return int(cfg["num_hidden_layers"])


def read_like_vllm(nbytes: int, blocks: Sequence[Sequence[int]], regions: int) -> ReadMethod:
    """The raw READ of `nbytes` that vLLM's NixlConnector makes for a request whose prefill
    holds `blocks` (the handle's block ids per group): one descriptor per block and region,
    contiguous runs of blocks mergeable as NIXL merges vLLM's. Blocks unknown: one per region.
    An approximation: the decode side's blocks are taken as contiguous as the prefill's."""
    ids = sorted(b for g in blocks for b in g)
    n = len(ids) or 1
    runs = 1 + sum(1 for a, b in itertools.pairwise(ids) if b != a + 1)
    return ReadMethod(pieces=n * regions, regions=regions, prepped=True, notify=True, runs=runs)


async def _single(
    p: WorkerProc,
    d: WorkerProc,
    lengths: Sequence[int],
    repeat: int,
    max_tokens: int,
    warm: bool,
    raw: RawNixl | None,
    raw_core: RawNixl | None = None,
    trace: Any = None,
    regions: int = 1,
    at_handoff: bool = False,
    mux: bool = False,
    early_decode: bool = False,
) -> dict[str, list[Timing]]:
    """P/D and control (Generate on D beside an idle P), interleaved per request."""
    client = Client(trace, mux=mux, early_decode=early_decode)
    out: dict[str, list[Timing]] = {"pd": [], "control": [], "first": []}
    moved: dict[int, tuple[int, ReadMethod]] = {}
    try:
        # Each engine's first forward passes pay one-off costs: pay them before measuring, so
        # that the first P/D request shows what is the pair's own (its NIXL set-up) only.
        await _warm_engines(client, p, d, max_tokens)
        if warm:  # what the router does when the workers join (`WorkerKv.WarmKv`)
            from splitserve._gen.v1 import worker_pb2, worker_pb2_grpc

            stub = worker_pb2_grpc.WorkerKvStub(client.channel(d.address))
            warmed = await stub.WarmKv(worker_pb2.WarmKvRequest(peers=[p.address]), timeout=120)
            if warmed.failed:
                raise RuntimeError(f"WarmKv failed: {list(warmed.failed)}")
        for rep in range(repeat + 1):  # round 0 warms every path up: not counted
            for n in lengths:
                # Every request its own prompt: no prefix-cache hit on either worker.
                prompt = prompt_of(n, seed=1000 * rep + n)
                # Raw reads on the decode's core just before and just after: the same moment's
                # load (the machine is shared), so the ratio compares like with like.
                last = moved.get(n)  # what this length moved last round (vLLM's blocks)
                core_before = (
                    raw_core.read_s(last[0], 2, last[1]) if raw_core is not None and last else []
                )
                before = scrape(d)
                handoff: list[tuple[float, float, int, float]] = []
                hook = None
                if at_handoff and raw_core is not None and last:
                    hook = functools.partial(_read_into, handoff, raw_core, *last)

                t = await client.pd(p.address, d.address, f"pd-{rep}-{n}", prompt, max_tokens, hook)
                t.raw_handoff_s = [x[1] for x in handoff]
                t.raw_handoff_cpu_s = [x[3] for x in handoff]
                _, nbytes, secs = xfer_delta(before, scrape(d))
                t.kv_bytes, t.xfer_s = nbytes, secs
                if raw is not None and nbytes:  # the same bytes, raw, right after, both ways
                    like = read_like_vllm(int(nbytes), t.kv_blocks, regions)
                    moved[n] = (int(nbytes), like)
                    t.raw_s = raw.read_s(int(nbytes), 3)
                    # Into the reader's warm buffer and into its cold ring, one by one.
                    cold = dataclasses.replace(like, cold=True)
                    got, got_cold = [], []
                    for _ in range(3):
                        got += raw.read(int(nbytes), 1, like)
                        if raw.cold_bytes:
                            got_cold += raw.read(int(nbytes), 1, cold)
                    t.raw_vllm_s = [tel for _, tel, _, _ in got]
                    t.raw_vllm_cpu_s = [cpu for _, _, _, cpu in got]
                    t.raw_cold_s = [tel for _, tel, _, _ in got_cold]
                    t.raw_cold_cpu_s = [cpu for _, _, _, cpu in got_cold]
                    t.raw_cold_age_s = raw.cold_ages() if raw.cold_bytes else []
                    if raw_core is not None:
                        t.raw_core_s = [*core_before, *raw_core.read_s(int(nbytes), 2, like)]
                other = prompt_of(n, seed=1000 * rep + n + 500)
                c = await client.generate(d.address, f"ctl-{rep}-{n}", other, max_tokens)
                c.mode = "control"
                if rep:
                    out["pd"].append(t)
                    out["control"].append(c)
                elif n == lengths[0]:
                    out["first"].append(t)  # the first request on this pair
    finally:
        await client.close()
    return out


WARM_LENGTHS = (64, 300)
"""Prompt lengths of the engines' warm-up requests (`_warm_engines`): the engines' context must
hold them whatever `--lengths` says."""


async def _warm_engines(client: Client, p: WorkerProc, d: WorkerProc, max_tokens: int) -> None:
    from splitserve._gen.v1 import worker_pb2

    for n in WARM_LENGTHS:
        await client.generate(d.address, f"warm-d-{n}", prompt_of(n, seed=-n), max_tokens)
        out = await client.stub(p.address).Prefill(
            worker_pb2.PrefillRequest(
                request_id=f"warm-p-{n}",
                prompt_token_ids=prompt_of(n, seed=-2 * n),
                sampling=client.sampling(max_tokens),
            )
        )
        await client.stub(p.address).Cancel(worker_pb2.CancelRequest(request_id=out.request_id))


async def _agg(
    d: WorkerProc, lengths: Sequence[int], repeat: int, max_tokens: int, mux: bool = False
) -> list[Timing]:
    client = Client(mux=mux)
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
    engine: str = "vllm",
    warm: bool = True,
    trace: bool = False,
    at_handoff: bool = False,
    mux: bool = False,
    early_decode: bool = False,
    cold_bytes: int = 0,
) -> dict[str, Any]:
    """`cold_bytes`: the raw reader's cold destination (`RawNixl`; 0: none). `trace`: the
    decode worker and the client write `kvtrace` events (P/D requests), and the result has
    each one's milestones under "trace". `mux`: every call a sub-request of one
    `Multiplex` stream per worker, as the router sends them (`Client.mux`); `early_decode`: with
    it, each Decode sent before its Prefill, its KV after (`Client.early_decode`)."""
    from splitserve.worker.vllm_adapter import kvtrace

    trace_file = run_dir / "kvtrace.jsonl"
    if trace:
        trace_file.unlink(missing_ok=True)
        env = {**env, kvtrace.TRACE_ENV: str(trace_file)}
    args = engine_args(max(*lengths, *WARM_LENGTHS) + max_tokens + 16) if engine == "vllm" else []
    kw: dict[str, Any] = {"env": env, "engine_args": args, "engine": engine}
    res: dict[str, Any] = {}
    pair = [("prefill", "prefill", PREFILL_CPU), ("decode", "decode", DECODE_CPU)]
    with workers(run_dir, model, pair, **kw) as (p, d):
        time.sleep(2.0)
        res["idle_cpu"] = idle_cpu([p, d], idle_s)
        warm_it = warm and engine == "vllm"
        kv_max = (max(lengths) + 128) * bytes_per_token(model) if engine == "vllm" else 0
        # Raw buffers in the page size the workers' KV caches are in (local_cpu_env).
        huge = env.get("THP_MEM_ALLOC_ENABLE", "1") != "0"
        # Every raw READ on the decode's core, where vLLM's engine thread makes its READ (the
        # copy runs in the caller of `transfer()`), beside the same neighbours; until
        # 2026-11-27 13:00 item 4's reader ran on any core and so dodged them.
        raw, raw_core = None, None
        if kv_max:
            raw = RawNixl(
                kv_max,
                cpu=DECODE_CPU,
                target_cpu=PREFILL_CPU,
                huge_pages=huge,
                cold_bytes=cold_bytes,
            )
            raw_core = RawNixl(kv_max, cpu=DECODE_CPU, target_cpu=PREFILL_CPU, huge_pages=huge)
        tracer = kvtrace.KvTrace(trace_file) if trace else None
        regions = kv_regions(model) if engine == "vllm" else 1
        try:
            timings = asyncio.run(
                _single(
                    p,
                    d,
                    lengths,
                    repeat,
                    max_tokens,
                    warm_it,
                    raw,
                    raw_core,
                    tracer,
                    regions,
                    at_handoff,
                    mux,
                    early_decode,
                )
            )
            # Page size of each side's KV cache: a cma READ's speed depends on it.
            res["huge_kib"] = {w.name: anon_huge_kib(w.pid) for w in (p, d)}
            if raw is not None:
                res["huge_kib"]["raw reader, target"] = raw.huge_kib
                res["raw_thp_short"] = raw.thp_short() if huge else None
        finally:
            if tracer is not None:
                tracer.close()
            for r in (raw, raw_core):
                if r is not None:
                    r.close()
        res["idle_cpu_after"] = idle_cpu([p, d], idle_s)
    with workers(run_dir, model, [("decode", "mixed", 1)], **kw) as (d,):
        timings["agg"] = asyncio.run(_agg(d, lengths, repeat, max_tokens, mux))
    res["timings"] = timings
    res["regions"] = kv_regions(model) if engine == "vllm" else 1
    res["cold_bytes"] = cold_bytes if engine == "vllm" else 0
    res["warm"] = warm and engine == "vllm"
    if trace:
        events = kvtrace.load(trace_file)
        res["trace"] = {
            rid: kvtrace.milestones(ev) for rid, ev in events.items() if rid.startswith("pd-")
        }
        res["transfer_cpu"] = {
            rid: kvtrace.cpu_seconds(ev) for rid, ev in events.items() if rid.startswith("pd-")
        }
        res["xfer_marks"] = {
            rid: {k: v for k in XFER_MARKS if (v := kvtrace.value(ev, k)) is not None}
            for rid, ev in events.items()
            if rid.startswith("pd-")
        }
    return res


XFER_MARKS = (
    "tel_xfer",
    "tel_post",
    "tel_descs",
    "xfer_checks",
    "prepped_descs",
    "local_runs",
    "remote_runs",
    "prepared_input",
)
"""`kvtrace` marks of each traced READ that `xfer_rows` reports (counts and durations)."""


def xfer_rows(res: dict[str, Any], lengths: Sequence[int]) -> list[str]:
    """With `--trace`, item 4 (a): what vLLM's transfer time is made of, medians per length.
    NIXL's xferDuration runs from the post's start to the `check_xfer_state` that finds the
    READ done; vLLM checks once per engine step (`get_finished`), the raw reader in a tight
    loop, so a READ done inside `transfer()` but seen only at vLLM's next check counts the
    wait in vLLM's time. Also (b): the descriptors vLLM asked for, in how many runs of
    consecutive ids on the decode (local) and prefill (remote) side, and how many NIXL posted
    after merging."""
    trace: dict[str, dict[str, float]] = res.get("trace") or {}
    marks: dict[str, dict[str, float]] = res.get("xfer_marks") or {}
    out = [
        "| prompt | vLLM xferDuration ms | postDuration ms | transfer() wall ms "
        "| transfer() return -> vLLM's check sees DONE ms | checks that saw it in progress "
        "| descriptors asked / posted | runs: decode side / prefill side |",
        "|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for n in lengths:
        got: dict[str, list[float]] = {}
        for rid, m in marks.items():
            _, rep, length = rid.split("-")
            t = trace.get(rid, {})
            if not int(rep) or int(length) != n or "tel_xfer" not in m:
                continue
            for k, v in m.items():
                got.setdefault(k, []).append(v)
            if "transfer" in t and "transferred" in t:
                got.setdefault("wall", []).append(t["transferred"] - t["transfer"])
            if "transferred" in t and "xfer_seen" in t:
                got.setdefault("seen", []).append(t["xfer_seen"] - t["transferred"])
        if not got:
            continue

        def cell(
            k: str, scale: float = 1000.0, fmt: str = ".1f", got: dict[str, list[float]] = got
        ) -> str:
            return format(med(got[k]) * scale, fmt) if got.get(k) else ""

        out.append(
            f"| {n} | {cell('tel_xfer')} | {cell('tel_post')} | {cell('wall')} "
            f"| {cell('seen', fmt='.2f')} | {cell('xfer_checks', 1, '.0f')} "
            f"| {cell('prepped_descs', 1, '.0f')} / {cell('tel_descs', 1, '.0f')} "
            f"| {cell('local_runs', 1, '.0f')} / {cell('remote_runs', 1, '.0f')} |"
        )
    return out if len(out) > 2 else []


def transfer_cpu_rows(res: dict[str, Any], lengths: Sequence[int]) -> list[str]:
    """With `--trace`: vLLM's `transfer()` call (wall and the engine thread's CPU seconds in it)
    against the raw vLLM-like READs' (the same two), medians per prompt length. With `cma` the
    copy is that CPU time; wall time above it is the thread waiting for its core."""
    trace: dict[str, dict[str, float]] = res.get("trace") or {}
    cpu: dict[str, float | None] = res.get("transfer_cpu") or {}
    if not cpu:
        return []
    pd: list[Timing] = res["timings"]["pd"]
    out = [
        "| prompt | vLLM transfer() wall ms | vLLM its CPU ms | raw READ ms (xferDuration) "
        "| raw its CPU ms | vLLM / raw, CPU | raw at the hand-off, on D's core: ms / CPU ms |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for n in lengths:
        walls, cpus = [], []
        for rid, m in trace.items():
            _, rep, length = rid.split("-")
            c = cpu.get(rid)
            if int(rep) and int(length) == n and c is not None and "transfer" in m:
                walls.append(m["transferred"] - m["transfer"])
                cpus.append(c)
        rows = [x for x in pd if x.prompt_tokens == n and x.raw_vllm_cpu_s]
        raw_cpu = med([c for x in rows for c in x.raw_vllm_cpu_s])
        raw_wall = med([s for x in rows for s in x.raw_vllm_s])
        hand = [x for x in pd if x.prompt_tokens == n and x.raw_handoff_s]
        hand_cell = (
            f"{ms(med([s for x in hand for s in x.raw_handoff_s]))} / "
            f"{ms(med([c for x in hand for c in x.raw_handoff_cpu_s]))}"
            if hand
            else ""
        )
        if walls:
            out.append(
                f"| {n} | {ms(med(walls))} | {ms(med(cpus))} | {ms(raw_wall)} | {ms(raw_cpu)} "
                f"| {100 * med(cpus) / raw_cpu:.0f} % | {hand_cell} |"
            )
    return out if len(out) > 2 else []


def report_trace(res: dict[str, Any], lengths: Sequence[int]) -> str:
    """Median milestone-to-milestone intervals of the P/D requests per prompt length, and the
    first request on the pair against the later ones of its length."""
    from splitserve.worker.vllm_adapter import kvtrace

    trace: dict[str, dict[str, float]] = res.get("trace") or {}
    if not trace:
        return ""

    def rows_of(n: int, first: bool) -> list[dict[str, float]]:
        # pd-{rep}-{n}: rep 0 warms every path up (its first length is the pair's first request)
        out = []
        for rid, m in trace.items():
            _, rep, length = rid.split("-")
            if int(length) == n and (int(rep) == 0) == first:
                out.append(m)
        return out

    cols = [(f"{n}", rows_of(n, False)) for n in lengths]
    cols.append((f"{lengths[0]} first on the pair", rows_of(lengths[0], True)))
    lines = kvtrace.breakdown_rows(cols)
    totals = []
    steps = []
    for _, rows in cols:
        whole = [r["token2"] - r["token1"] for r in rows if "token1" in r and "token2" in r]
        totals.append(f"{1000 * med(whole):.2f}" if whole else "")
        counted = [r["steps"] for r in rows if "steps" in r]
        steps.append(f"{med(counted):.0f}" if counted else "")
    lines.append("| **token1 -> token2** | " + " | ".join(totals) + " |")
    lines.append("| engine steps while traced | " + " | ".join(steps) + " |")
    lines.append("")
    lines.append(
        "Milestones: "
        + "; ".join(f"`{n}` {kvtrace.describe(n)}" for n, _ in kvtrace.MILESTONES)
        + ". Each cell is the median over the requests that have both milestones."
    )
    return "\n".join(lines)


def cold_rows(res: dict[str, Any], lengths: Sequence[int]) -> list[str]:
    """Item 4's comparison both ways: vLLM's READ time against the raw vLLM-like READs of the
    same bytes into the reader's warm buffer and into its cold ring (`RawNixl(cold_bytes=...)`),
    made alternately right after each P/D request. The ratios are raw time / vLLM time (vLLM's
    bandwidth as a share of the raw READ's), of the medians, and per request against its own
    cold READs."""
    pd: list[Timing] = res["timings"]["pd"]
    out = [
        "| prompt | KV MiB | vLLM NIXL xfer ms | raw READ into warm memory ms "
        "| raw READ into cold memory ms | vLLM / raw warm | vLLM / raw cold "
        "| vLLM / raw cold, per request |",
        "|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for n in lengths:
        rows = [x for x in pd if x.prompt_tokens == n and x.xfer_s and x.raw_cold_s]
        if not rows:
            continue
        xf = med([x.xfer_s for x in rows])
        warm = med([s for x in rows for s in x.raw_vllm_s])
        cold = med([s for x in rows for s in x.raw_cold_s])
        per = [med(x.raw_cold_s) / x.xfer_s for x in rows]
        out.append(
            f"| {n} | {med([x.kv_bytes for x in rows]) / MiB:.1f} | {ms(xf)} | {ms(warm)} "
            f"| {ms(cold)} | {100 * warm / xf:.0f} % | {100 * cold / xf:.0f} % "
            f"| {100 * min(per):.0f}–{100 * max(per):.0f} % ({len(per)} requests) |"
        )
    if len(out) == 2:
        return []
    ages = [a for x in pd for a in x.raw_cold_age_s]
    age = (
        f" The cold READs' slots had last been written a median {med(ages):.0f} s before "
        f"({min(ages):.0f}–{max(ages):.0f} s)."
        if ages
        else ""
    )
    out.append("")
    out.append(
        f"Both raw READs: the same reader process and source, vLLM's descriptors, NIXL's "
        f"xferDuration; warm: into the reader's own small buffer, which every READ rewrites; "
        f"cold: into a {res.get('cold_bytes', 0) / MiB:.0f} MiB destination (the decode "
        f"worker's KV cache size) in {res.get('regions', 1)} regions, each READ into the block "
        f"slots written longest ago (a ring, as vLLM's block pool hands out the least recently "
        f"used blocks). Three of each per P/D request, alternating warm / cold.{age}"
    )
    return out


def report_single(res: dict[str, Any], lengths: Sequence[int]) -> str:
    t: dict[str, list[Timing]] = res["timings"]
    lines = [
        "| prompt | mode | TTFT ms | token-1 -> token-2 ms | KV MiB | NIXL xfer ms "
        "| raw NIXL ms, 1 descriptor | raw NIXL ms, vLLM's descriptors "
        "| vLLM / raw GB/s (raw time / vLLM time; vLLM's descriptors) "
        "| raw on D's core ms | raw core / vLLM |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---|---:|---|",
    ]
    for n in lengths:
        for mode in ("agg", "control", "pd"):
            rows = [x for x in t[mode] if x.prompt_tokens == n]
            if not rows:
                continue
            kv = med([x.kv_bytes for x in rows])
            xf = med([x.xfer_s for x in rows])
            raw_cell = bw = core_cell = core_ratio = ""
            core = [x for x in rows if x.raw_core_s and x.xfer_s]
            if mode == "pd" and core:
                core_cell = ms(med([s for x in core for s in x.raw_core_s]))
                # Per request: its own raw reads (just before and after) / its transfer.
                ratios = [med(x.raw_core_s) / x.xfer_s for x in core]
                core_ratio = (
                    f"{100 * med(ratios):.0f} % (per request {min(ratios) * 100:.0f}"
                    f"–{max(ratios) * 100:.0f} %)"
                )
            if mode == "pd" and kv:
                r = med([s for x in rows for s in x.raw_s])
                raw_cell = f"{ms(r)} (best {ms(min(s for x in rows for s in x.raw_s))})"
                like = [s for x in rows for s in x.raw_vllm_s]
                rv = med(like) if like else r
                if like:
                    raw_cell += f" | {ms(rv)} (best {ms(min(like))})"
                else:
                    raw_cell += " | "
                best_x = min(x.xfer_s for x in rows)
                best_r = min(like or [s for x in rows for s in x.raw_s])
                bw = (
                    f"{kv / xf / 1e9:.2f} / {kv / rv / 1e9:.2f} ({100 * rv / xf:.0f} %); best "
                    f"{kv / best_x / 1e9:.2f} / {kv / best_r / 1e9:.2f} "
                    f"({100 * best_r / best_x:.0f} %)"
                )
            lines.append(
                f"| {n} | {mode} | {ms(med([x.ttft_s for x in rows]))} "
                f"| {ms(med([x.token2_s for x in rows]))} "
                f"| {kv / MiB:.1f} | {ms(xf)} (best {ms(min(x.xfer_s for x in rows))}) "
                f"| {raw_cell} | {bw} | {core_cell} | {core_ratio} |"
                if mode == "pd"
                else f"| {n} | {mode} | {ms(med([x.ttft_s for x in rows]))} "
                f"| {ms(med([x.token2_s for x in rows]))} | | | | | | | |"
            )
    first = t.get("first", [])
    later = [x for x in t["pd"] if first and x.prompt_tokens == first[0].prompt_tokens]
    if first and later:
        f = first[0]
        lines.append("")
        lines.append(
            f"First P/D request on the pair ({f.prompt_tokens} tokens, "
            f"{'after WarmKv' if res.get('warm') else 'cold'}): TTFT {ms(f.ttft_s)} ms, "
            f"token-1 -> token-2 {ms(f.token2_s)} ms; later ones (median): TTFT "
            f"{ms(med([x.ttft_s for x in later]))} ms, token-1 -> token-2 "
            f"{ms(med([x.token2_s for x in later]))} ms."
        )
    pd = [x for x in t["pd"] if x.kv_blocks]
    if pd:
        method = read_like_vllm(int(pd[-1].kv_bytes), pd[-1].kv_blocks, res.get("regions", 1))
        lines.append("")
        lines.append(
            "Every time is NIXL's own xferDuration (vLLM's `nixl_xfer_time`; raw: the reader's "
            "telemetry), between two processes on this host (UCX's transport as configured: "
            f"UCX_TLS={os.environ.get('UCX_TLS', 'unset')}). Raw READs right after each P/D "
            "request, between buffers in the same page size as the workers' KV caches: as one "
            "descriptor, and as vLLM reads (last request: "
            f"{method.describe()}). The ratio uses the latter."
        )
    cold_lines = cold_rows(res, lengths)
    if cold_lines:
        lines.append("")
        lines.append("Item 4, vLLM against a raw READ into warm and into cold memory:")
        lines.append("")
        lines.extend(cold_lines)
    cpu_lines = transfer_cpu_rows(res, lengths)
    if cpu_lines:
        lines.append("")
        lines.extend(cpu_lines)
    xfer_lines = xfer_rows(res, lengths)
    if xfer_lines:
        lines.append("")
        lines.append("vLLM's READ as its engine sees it (`--trace`, medians):")
        lines.append("")
        lines.extend(xfer_lines)
    short = res.get("raw_thp_short")
    if short:
        lines.append("")
        lines.append(
            f"**The raw READs' buffers are not all in huge pages** ({short}), while the "
            "workers' KV caches are: a raw READ in 4 KiB pages costs 1.7–2.3x, so this run's "
            "ratios overstate vLLM against the raw READ."
        )
    huge = res.get("huge_kib")
    if huge:
        lines.append("")
        lines.append(
            "AnonHugePages (kB) after the run: " + ", ".join(f"{k} {v}" for k, v in huge.items())
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


# -- interference ---------------------------------------------------------------------------


async def _stream_loop(
    client: Client,
    route: Any,
    name: str,
    prompt_len: int,
    max_tokens: int,
    stop: asyncio.Event,
    gaps: list[float],
) -> None:
    """One steady decoding client: request after request, recording inter-token gaps."""
    i = 0
    while not stop.is_set():
        prompt = prompt_of(prompt_len, seed=hash((name, i)) & 0xFFFF)
        t = await route(client, f"{name}-{i}", prompt, max_tokens)
        times = t.token_times_s
        gaps.extend(b - a for a, b in itertools.pairwise(times[1:]))
        i += 1


async def _interference(
    routes: list[Any],
    streams: int,
    long_len: int,
    long_every_s: float,
    duration_s: float,
    short_len: int,
    stream_tokens: int,
) -> dict[str, Any]:
    client = Client()
    stop = asyncio.Event()
    gaps: list[float] = []
    longs: list[Timing] = []
    try:
        tasks = [
            asyncio.create_task(
                _stream_loop(
                    client, routes[k % len(routes)], f"s{k}", short_len, stream_tokens, stop, gaps
                )
            )
            for k in range(streams)
        ]
        await asyncio.sleep(2.0)  # steady state before the long prompts
        del gaps[:]
        t_end = time.monotonic() + duration_s
        k = 0
        long_tasks = []
        while time.monotonic() < t_end:
            route = routes[k % len(routes)]
            prompt = prompt_of(long_len, seed=90_000 + k)
            long_tasks.append(asyncio.create_task(route(client, f"long-{k}", prompt, 2)))
            k += 1
            await asyncio.sleep(long_every_s)
        stop.set()
        longs = list(await asyncio.gather(*long_tasks))
        await asyncio.gather(*tasks)
    finally:
        await client.close()
    return {
        "tpot_p50_s": pct(gaps, 50),
        "tpot_p90_s": pct(gaps, 90),
        "tpot_p99_s": pct(gaps, 99),
        "tpot_max_s": max(gaps) if gaps else float("nan"),
        "num_gaps": len(gaps),
        "long_prompts": len(longs),
        "long_ttft_p50_s": med([t.ttft_s for t in longs]),
    }


def _pd_route(p: WorkerProc, d: WorkerProc) -> Any:
    async def route(client: Client, rid: str, prompt: list[int], max_tokens: int) -> Timing:
        return await client.pd(p.address, d.address, rid, prompt, max_tokens)

    return route


def _agg_route(w: WorkerProc) -> Any:
    async def route(client: Client, rid: str, prompt: list[int], max_tokens: int) -> Timing:
        return await client.generate(w.address, rid, prompt, max_tokens)

    return route


def run_interference(
    run_dir: Path,
    model: str,
    env: dict[str, str],
    engine: str,
    *,
    streams: int,
    long_len: int,
    long_every_s: float,
    duration_s: float,
    short_len: int = 32,
    stream_tokens: int = 64,
    extra_args: Sequence[str] = (),
) -> dict[str, Any]:
    """Two workers either way, one core each: P/D (prefill + decode) or aggregated (two mixed
    workers, streams and long prompts split between them)."""
    args = [*engine_args(long_len + stream_tokens + 16), *extra_args] if engine == "vllm" else []
    kw: dict[str, Any] = {"env": env, "engine_args": args, "engine": engine}
    res: dict[str, Any] = {}
    shape: dict[str, Any] = {
        "streams": streams,
        "long_len": long_len,
        "long_every_s": long_every_s,
        "duration_s": duration_s,
        "short_len": short_len,
        "stream_tokens": stream_tokens,
    }
    with workers(run_dir, model, [("prefill", "prefill", 0), ("decode", "decode", 1)], **kw) as (
        p,
        d,
    ):
        res["pd"] = asyncio.run(_interference([_pd_route(p, d)], **shape))
    with workers(run_dir, model, [("mixed0", "mixed", 0), ("mixed1", "mixed", 1)], **kw) as (
        a,
        b,
    ):
        res["agg"] = asyncio.run(_interference([_agg_route(a), _agg_route(b)], **shape))
    res["shape"] = shape
    return res


def report_interference(res: dict[str, Any]) -> str:
    sh = res["shape"]
    lines = [
        f"{sh['streams']} steady streams ({sh['short_len']}-token prompts, {sh['stream_tokens']} "
        f"tokens each, back to back) while a {sh['long_len']}-token prompt arrives every "
        f"{sh['long_every_s']} s for {sh['duration_s']} s; two workers, one core each.",
        "",
        "| mode | decode TPOT p50 ms | p90 ms | p99 ms | max ms | gaps | long prompts "
        "| long-prompt TTFT p50 ms |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for mode, label in (("agg", "aggregated (2 mixed)"), ("pd", "P/D (1 prefill + 1 decode)")):
        r = res[mode]
        lines.append(
            f"| {label} | {ms(r['tpot_p50_s'])} | {ms(r['tpot_p90_s'])} | {ms(r['tpot_p99_s'])} "
            f"| {ms(r['tpot_max_s'])} | {r['num_gaps']} | {r['long_prompts']} "
            f"| {ms(r['long_ttft_p50_s'])} |"
        )
    return "\n".join(lines)


# -- entry --------------------------------------------------------------------------------------


def _at_least(low: int) -> Callable[[str], int]:
    """An argparse type: an integer >= `low` (argparse names the flag in its error, exit 2)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be {low} or more, got {value}")
        return value

    return parse


def _seconds(positive: bool) -> Callable[[str], float]:
    """An argparse type: a finite float > 0 (`positive`) or >= 0."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not math.isfinite(value) or value < 0 or (positive and value == 0):
            raise argparse.ArgumentTypeError(
                f"must be {'more than 0' if positive else '0 or more'}, got {text}"
            )
        return value

    return parse


def _lengths(text: str) -> list[int]:
    """An argparse type: comma-separated prompt lengths, each an integer >= 1."""
    out = []
    for part in text.split(","):
        try:
            n = int(part)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"comma-separated integers expected, got {part!r} in {text!r}"
            ) from None
        if n < 1:
            raise argparse.ArgumentTypeError(f"each length must be 1 or more, got {n}")
        out.append(n)
    return out


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="kvbench", description=__doc__)
    ap.add_argument("--runs", default="single,interference,sim")
    ap.add_argument("--lengths", type=_lengths, default=[128, 512, 2048])
    ap.add_argument("--repeat", type=_at_least(1), default=5)
    ap.add_argument("--max-tokens", type=_at_least(1), default=8)
    ap.add_argument("--idle-s", type=_seconds(positive=False), default=5.0)
    ap.add_argument("--model", default="", help="model dir (default: the bench model, generated)")
    ap.add_argument("--sim-shape", default="tiny", help="core.perf shape for the sim runs")
    ap.add_argument("--progress-thread", action="store_true", help="NIXL progress thread on")
    ap.add_argument("--cold", action="store_true", help="no WarmKv before the first request")
    ap.add_argument(
        "--no-huge-pages",
        action="store_true",
        help="vLLM's KV cache in 4 KiB pages (THP_MEM_ALLOC_ENABLE=0), for comparison",
    )
    ap.add_argument(
        "--pull-in-step",
        action="store_true",
        help="decode KV pulled in the step that yields token 2 (SPLITSERVE_KV_PULL_IN_STEP=1)",
    )
    ap.add_argument(
        "--async-pull",
        action="store_true",
        help="vLLM's async KV load (SPLITSERVE_KV_PULL_IN_STEP=0; the engine's default)",
    )
    ap.add_argument(
        "--trace",
        action="store_true",
        help="time each P/D decode's token 1 -> token 2 milestones (SPLITSERVE_KV_TRACE)",
    )
    ap.add_argument(
        "--fresh-pairs",
        type=_at_least(1),
        default=3,
        help="the fresh run: decode workers started per variant",
    )
    ap.add_argument(
        "--fresh-variants",
        default="window,read",
        help="the fresh run's variants, comma-separated: window (the default WarmKv), read "
        "(no prefill-side warm-up window), noread (no warm-up READ either)",
    )
    ap.add_argument(
        "--fresh-requests", type=_at_least(1), default=10, help="P/D requests per fresh pair"
    )
    ap.add_argument(
        "--fresh-length",
        type=_at_least(0),
        default=0,
        help="their prompt length (default: the first of --lengths)",
    )
    ap.add_argument(
        "--raw-at-handoff",
        action="store_true",
        help="also READ raw on the decode worker's core between each Prefill answer and its "
        "Decode call (the moment vLLM's READ runs in); delays the Decode call by that READ",
    )
    ap.add_argument(
        "--mux",
        action="store_true",
        help="the single run's calls as sub-requests of one Multiplex stream per worker, as the "
        "router sends them (default: a gRPC call each; a Decode then pays a call's set-up)",
    )
    ap.add_argument(
        "--early-decode",
        action="store_true",
        help="with --mux: each P/D Decode sent before its Prefill (kv_follows), the first token "
        "and KV handle after it answers (MuxOp.decode_kv)",
    )
    ap.add_argument(
        "--raw-cold-mib",
        type=_at_least(-1),
        default=-1,
        help="the raw reader's cold destination in MiB, READ into least recently written "
        "first beside the warm READs (default -1: the decode worker's KV cache size, "
        "VLLM_CPU_KVCACHE_SPACE; 0: no cold READs)",
    )
    ap.add_argument("--streams", type=_at_least(1), default=4)
    ap.add_argument("--long-len", type=_at_least(1), default=2048)
    ap.add_argument("--long-every-s", type=_seconds(positive=True), default=3.0)
    ap.add_argument("--duration-s", type=_seconds(positive=True), default=30.0)
    ap.add_argument("--json", default="", help="also write the raw numbers here")
    args = ap.parse_args(argv)
    lengths: list[int] = args.lengths
    if args.pull_in_step and args.async_pull:
        ap.error("--pull-in-step and --async-pull exclude each other")
    if args.early_decode and not args.mux:
        ap.error("--early-decode needs --mux (kv_follows is for Multiplex sub-requests)")
    runs = set(args.runs.split(","))
    unknown = runs - {"single", "interference", "sim", "fresh"}
    if unknown:
        ap.error(f"--runs: unknown runs {sorted(unknown)} (single, interference, sim, fresh)")
    variants = [v for v in args.fresh_variants.split(",") if v]
    from splitserve.worker.vllm_adapter.kvbench_fresh import VARIANTS

    if not variants or set(variants) - set(VARIANTS):
        ap.error(
            f"--fresh-variants: some of {list(VARIANTS)} expected, got {args.fresh_variants!r}"
        )
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "splitserve"
    model = args.model or bench_model(cache / "kvbench-model")
    env = {"SPLITSERVE_NIXL_PROGRESS_THREAD": "1"} if args.progress_thread else {}
    if args.no_huge_pages:
        env["THP_MEM_ALLOC_ENABLE"] = "0"
    env["SPLITSERVE_KV_PULL_IN_STEP"] = "1" if args.pull_in_step else "0"
    cold_bytes = args.raw_cold_mib * MiB if args.raw_cold_mib >= 0 else decode_kv_bytes(env)
    load = os.getloadavg()
    print(f"# bench-kv ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})\n")
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, load average at start "
        f"{load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} (1 / 5 / 15 min); model {model}; "
        f"NIXL progress thread {'on' if args.progress_thread else 'off'}; KV cache in "
        f"{'4 KiB pages' if args.no_huge_pages else 'transparent huge pages'}; decode KV "
        f"{'pulled in-step' if args.pull_in_step else 'pulled async'}; calls "
        f"{'multiplexed (one stream per worker)' if args.mux else 'one gRPC call each'}"
        f"{'; Decode sent before the Prefill, its KV after' if args.early_decode else ''}\n"
    )
    results: dict[str, Any] = {}
    interference = {
        "streams": args.streams,
        "long_len": args.long_len,
        "long_every_s": args.long_every_s,
        "duration_s": args.duration_s,
    }
    with tempfile.TemporaryDirectory(prefix="kvbench-") as tmp:
        run_dir = Path(tmp)
        if "single" in runs:
            res = run_single(
                run_dir,
                model,
                lengths,
                args.repeat,
                args.max_tokens,
                env,
                args.idle_s,
                warm=not args.cold,
                trace=args.trace,
                at_handoff=args.raw_at_handoff,
                mux=args.mux,
                early_decode=args.early_decode,
                cold_bytes=cold_bytes,
            )
            print("## vLLM, one request at a time\n")
            print(report_single(res, lengths))
            print()
            if args.trace:
                print("## Where token 1 -> token 2 goes (P/D, decode worker traced)\n")
                print(report_trace(res, lengths))
                print()
            results["single"] = _jsonable(res)
        if "fresh" in runs:
            from splitserve.worker.vllm_adapter import kvbench_fresh

            n = args.fresh_length or lengths[0]
            res = kvbench_fresh.run_fresh(
                run_dir,
                model,
                pairs=args.fresh_pairs,
                length=n,
                requests=args.fresh_requests,
                max_tokens=args.max_tokens,
                env=env,
                engine_args=engine_args(n + args.max_tokens + 300),
                trace=args.trace,
                variants=variants,
            )
            print("## vLLM, the first requests on fresh pairs (item 3)\n")
            print(kvbench_fresh.report_fresh(res))
            print()
            results["fresh"] = _jsonable(res)
        if "interference" in runs:
            res = run_interference(run_dir, model, env, "vllm", **interference)
            print("## vLLM, decodes while long prompts arrive\n")
            print(report_interference(res))
            print()
            results["interference"] = _jsonable(res)
        if "sim" in runs:
            res = run_single(
                run_dir,
                args.sim_shape,
                lengths,
                args.repeat,
                args.max_tokens,
                {},
                args.idle_s,
                engine="sim",
            )
            print(f"## Simulated engine ({args.sim_shape} on cpu-2core), one request at a time\n")
            print(report_sim(res, lengths, results.get("single")))
            print()
            results["sim_single"] = _jsonable(res)
            res = run_interference(run_dir, args.sim_shape, {}, "sim", **interference)
            print("## Simulated engine, decodes while long prompts arrive\n")
            print(report_interference(res))
            print()
            results["sim_interference"] = _jsonable(res)
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


def report_sim(res: dict[str, Any], lengths: Sequence[int], real: dict[str, Any] | None) -> str:
    """The sim engine's P/D vs aggregated, and its KV model (`kv_transfer_s`) against the NIXL
    transfers measured in the vLLM run of the same invocation (same byte counts)."""
    from splitserve.core.perf import HARDWARE, MODELS, RooflineModel

    t: dict[str, list[Timing]] = res["timings"]
    lines = [
        "| prompt | mode | TTFT ms | token-1 -> token-2 ms | KV MiB (handle) |",
        "|---:|---|---:|---:|---:|",
    ]
    for n in lengths:
        for mode in ("agg", "pd"):
            rows = [x for x in t[mode] if x.prompt_tokens == n]
            if rows:
                kv = med([x.handle_bytes for x in rows]) / MiB if mode == "pd" else float("nan")
                lines.append(
                    f"| {n} | {mode} | {ms(med([x.ttft_s for x in rows]))} "
                    f"| {ms(med([x.token2_s for x in rows]))} | "
                    + (f"{kv:.2f} |" if mode == "pd" else " |")
                )
    if real:
        model = RooflineModel(MODELS["tiny"], HARDWARE["cpu-2core"])
        lines += [
            "",
            "The simulator's KV model (cpu-2core: link latency + bytes / link bandwidth) for the "
            "bytes vLLM moved above:",
            "",
            "| prompt | KV MiB | vLLM NIXL xfer ms (measured) | sim kv_transfer_s ms "
            "| raw NIXL ms |",
            "|---:|---:|---:|---:|---:|",
        ]
        for n in lengths:
            measured = [x for x in real["timings"]["pd"] if x["prompt_tokens"] == n]
            if not measured:
                continue
            kv = med([x["kv_bytes"] for x in measured])
            raw = [s for x in measured for s in x["raw_s"]]
            lines.append(
                f"| {n} | {kv / MiB:.1f} | {ms(med([x['xfer_s'] for x in measured]))} "
                f"| {ms(model.kv_transfer_s(int(kv)))} | {ms(med(raw)) if raw else ''} |"
            )
    return "\n".join(lines)


def _jsonable(x: Any) -> Any:
    if isinstance(x, Timing):
        return {k: getattr(x, k) for k in x.__slots__}
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_jsonable(v) for v in x]
    return x


__all__ = ["main", "pct"]
