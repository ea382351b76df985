"""Which side makes vLLM's KV READ slow: raw NIXL READs out of / into vLLM-like memory.

Usage (the vLLM venv, under the heavy-run lock; one pair = a fresh prefill and decode worker):

    OMP_NUM_THREADS=1 .venv-vllm/bin/python tools/nixl_vllm_sides.py [--pairs 3] [--rounds 4]

Why: vLLM's hand-off READ of 64 MiB takes 1-4x the CPU a raw READ of the same bytes takes
(docs/benchmarks.md, "Transfer efficiency re-examined"), and nothing in the READ's method explains
it. This splits source from destination. Per pair (real `worker serve --engine vllm` processes,
prefill on core 0, decode on core 1, as `make bench-kv`) and round: one P/D request of
`--length` tokens (vLLM's own READ: its `nixl_xfer_time` from the decode worker's metrics), then,
interleaved, raw READs of the same blocks in vLLM's layout by two reader processes on the decode
core, each with a 1 GiB destination:

* `plain`: an anonymous mapping madvised into transparent huge pages (the bench's raw reader);
* `torch`: `torch.zeros(..., dtype=int8)` with `THP_MEM_ALLOC_ENABLE=1`, how vLLM 0.32 allocates
  its CPU KV cache (`vllm.v1.worker.utils.allocate_kv_cache`: one backing tensor);

each reading from three sources, in this order:

* `target`: a plain process holding a 1 GiB anonymous THP mapping (the bench's raw target);
* `prefill`: the prefill worker's own registered KV cache (its agent and layout fetched over
  vLLM's NIXL side channel, as the decode worker's connector does), the blocks the request just
  handed off;
* `decode`: the decode worker's KV cache at the same block ids (its own blocks for the request
  are not reported: an approximation).

The destination offsets are the source blocks' offsets in the KV cache, so they move on every
round as vLLM's blocks do (its block pool hands out the least recently used first): the first
READ of a round (out of `target`) writes into memory not written since the previous cycle, as
vLLM's READ does; later READs of the round rewrite it. Every READ is printed per round.
`--handoff` also READs between the Prefill answer and the Decode call.

A READ lays its descriptors out as vLLM's does (one per block and layer region, at the region's
base + block id x block stride; the destination at the same offsets in the reader's buffer),
posted with prepared lists and NIXL's merging, without a notification (the prefill worker's
connector would take one as its own). Times are NIXL's telemetry `xferDuration` and the reading
thread's CPU seconds in `transfer()` (with `cma` the copy). The readers and the target outlive
the pairs: restarting the pair changes only the vLLM processes. Also printed per pair: how much of
each worker's KV cache mapping is in huge pages (/proc/<pid>/smaps, the VMAs under its regions).
Prints Markdown.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import multiprocessing as mp
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

from splitserve.worker.vllm_adapter import kvbench_runs as kr
from splitserve.worker.vllm_adapter.kvbench import (
    Client,
    MiB,
    WorkerProc,
    _buffer,
    _nixl_target,
    prompt_of,
    scrape,
    start_worker,
    stop_worker,
    ucx_env,
    xfer_delta,
)

GiB = 1 << 30
READER_CPU = kr.DECODE_CPU
Layout = list[tuple[int, int]]
"""(offset into the source's KV allocation, bytes) per descriptor, vLLM's order."""


def vma_huge(pid: int | str, lo: int, hi: int) -> tuple[int, int]:
    """(Rss kB, AnonHugePages kB) of the VMAs of `pid` overlapping [lo, hi)."""
    rss = huge = 0
    inside = False
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            a, b = (int(x, 16) for x in head.split("-"))
            inside = a < hi and b > lo
        elif inside and head == "Rss:":
            rss += int(line.split()[1])
        elif inside and head == "AnonHugePages:":
            huge += int(line.split()[1])
    return rss, huge


def _reader(ctl: Any, dest: str, size: int, cpu: int) -> None:
    os.sched_setaffinity(0, {cpu})
    os.environ.update(ucx_env())
    if dest == "torch":  # vLLM's CPU KV cache: one zeroed int8 tensor, THP by torch's allocator
        os.environ["THP_MEM_ALLOC_ENABLE"] = "1"
        import torch

        tensor = torch.zeros(size, dtype=torch.int8)
        keep: Any = tensor
        addr = int(tensor.data_ptr())
    else:
        keep, addr = _buffer(size, True, 2)
    from nixl._api import nixl_agent, nixl_agent_config

    config = nixl_agent_config(enable_prog_thread=False, capture_telemetry=True, num_threads=0)
    agent = nixl_agent(f"sides-{dest}-{os.getpid()}", config)
    agent.register_memory([(addr, size, 0, "")], "DRAM")
    ctl.send((vma_huge("self", addr, addr + size), addr))
    peers: dict[str, str] = {}
    while True:
        cmd = ctl.recv()
        if cmd[0] == "stop":
            break
        if cmd[0] == "peer":
            peers[cmd[1]] = agent.add_remote_agent(cmd[2])
            ctl.send("ok")
            continue
        _, key, remote, layout, repeat = cmd
        local_l = agent.get_xfer_descs([(addr + o, n, 0) for o, n in layout], "DRAM")
        remote_l = agent.get_xfer_descs([(a, n, 0) for a, n in remote], "DRAM")
        lp = agent.prep_xfer_dlist("NIXL_INIT_AGENT", local_l)
        rp = agent.prep_xfer_dlist(peers[key], remote_l)
        idx = list(range(len(layout)))
        out = []
        for _ in range(repeat):
            handle = agent.make_prepped_xfer("READ", lp, idx, rp, idx, notif_msg=b"")
            t0 = time.perf_counter()
            c0 = time.thread_time()
            state = agent.transfer(handle)
            c1 = time.thread_time()
            while state == "PROC":
                state = agent.check_xfer_state(handle)
            wall = time.perf_counter() - t0
            tel = agent.get_xfer_telemetry(handle)
            out.append((wall, tel.xferDuration / 1e6, c1 - c0))
            agent.release_xfer_handle(handle)
            if state != "DONE":
                raise RuntimeError(f"READ failed: {state}")
        agent.release_dlist_handle(lp)
        agent.release_dlist_handle(rp)
        ctl.send(out)
    del keep


class Reader:
    def __init__(self, dest: str, size: int, cpu: int = READER_CPU) -> None:
        ctx = mp.get_context("spawn")
        self.ctl, theirs = ctx.Pipe()
        self.proc = ctx.Process(target=_reader, args=(theirs, dest, size, cpu), daemon=True)
        self.proc.start()
        self.huge, self.addr = self._recv()

    def _recv(self) -> Any:
        if not self.ctl.poll(300):
            raise TimeoutError("reader did not answer")
        return self.ctl.recv()

    @property
    def pid(self) -> int:
        return int(self.proc.pid or 0)

    def peer(self, key: str, meta: bytes) -> None:
        self.ctl.send(("peer", key, meta))
        self._recv()

    def read(self, key: str, remote: Layout, layout: Layout, repeat: int) -> Any:
        self.ctl.send(("read", key, remote, layout, repeat))
        return self._recv()

    def close(self) -> None:
        self.ctl.send(("stop",))
        self.proc.join(30)


class Target:
    """The bench's raw target (`kvbench._nixl_target`): `2 * half` bytes in THP, core 0."""

    def __init__(self, half: int) -> None:
        ctx = mp.get_context("spawn")
        self.conn, theirs = ctx.Pipe()
        self.proc = ctx.Process(target=_nixl_target, args=(theirs, half, False, True, 0))
        self.proc.start()
        if not self.conn.poll(300):
            raise TimeoutError("target did not start")
        self.meta, self.addr, self.huge_kib = self.conn.recv()

    def close(self) -> None:
        self.conn.send("stop")
        self.proc.join(30)


def vllm_meta(address: str, warm_up_ms: int = 0) -> Any:
    """The worker's vLLM NixlAgentMetadata, over vLLM's side channel (its `KvEndpoint`)."""
    import grpc
    import msgspec
    import zmq
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl.metadata import (
        GET_META_MSG,
        NixlAgentMetadata,
        NixlHandshakePayload,
    )

    from splitserve._gen.v1 import worker_pb2, worker_pb2_grpc

    with grpc.insecure_channel(address) as ch:
        got = worker_pb2_grpc.WorkerKvStub(ch).KvEndpoint(
            worker_pb2.KvEndpointRequest(warm_up_ms=warm_up_ms)
        )
    ep = json.loads(got.params_json)
    sock = zmq.Context.instance().socket(zmq.REQ)
    sock.setsockopt(zmq.RCVTIMEO, 10000)
    sock.connect(f"tcp://{ep['host']}:{ep['port']}")
    sock.send(msgspec.msgpack.encode((GET_META_MSG, 0, 0)))
    parts = sock.recv_multipart()
    sock.close(0)
    payload = msgspec.msgpack.decode(parts[0], type=NixlHandshakePayload)
    return msgspec.msgpack.decode(payload.agent_metadata_bytes, type=NixlAgentMetadata)


def layout_of(meta: Any, blocks: list[int]) -> tuple[int, Layout]:
    """(base, [(offset from base, bytes)]) of `blocks` in each region, vLLM's descriptors."""
    base = min(meta.kv_caches_base_addr)
    out = [
        (a - base + b * stride, n)
        for a, n, stride in zip(
            meta.kv_caches_base_addr, meta.block_lens, meta.block_strides, strict=True
        )
        for b in blocks
    ]
    return base, out


def kv_span(meta: Any) -> tuple[int, int]:
    lo = min(meta.kv_caches_base_addr)
    hi = max(
        a + meta.num_blocks * s
        for a, s in zip(meta.kv_caches_base_addr, meta.block_strides, strict=True)
    )
    return lo, hi


def _perf(out: Path, pid: int) -> subprocess.Popen[bytes]:
    out.parent.mkdir(parents=True, exist_ok=True)
    argv = ["perf", "record", "-q", "-e", "cpu-clock", "-g", "-o", str(out), "-p", str(pid)]
    p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.5)
    return p


def _at_handoff(reader: Reader, last: list[Any], into: dict[str, list[Any]]) -> None:
    """Raw READs of last round's blocks from each source, between the Prefill answer and the
    Decode call (the prefill worker has just written its KV and is answering)."""
    for key, remote, lay in last:
        into["plain<-" + key.rstrip("0123456789") + " at hand-off"] = reader.read(
            key, remote, lay, 1
        )


def med_ms(xs: list[float]) -> str:
    return f"{1e3 * statistics.median(xs):.2f}" if xs else ""


async def _pd(
    p: WorkerProc, d: WorkerProc, rid: str, length: int, hook: Any = None
) -> tuple[list[int], float, float]:
    client = Client()
    try:
        before = scrape(d)
        prompt = prompt_of(length, seed=zlib.crc32(rid.encode()))
        t = await client.pd(p.address, d.address, rid, prompt, 4, hook)
        _, nbytes, secs = xfer_delta(before, scrape(d))
    finally:
        await client.close()
    return sorted(b for g in t.kv_blocks for b in g), nbytes, secs


async def _warm(p: WorkerProc, d: WorkerProc) -> None:
    from splitserve._gen.v1 import worker_pb2, worker_pb2_grpc

    client = Client()
    try:
        await kr._warm_engines(client, p, d, 4)
        stub = worker_pb2_grpc.WorkerKvStub(client.channel(d.address))
        warmed = await stub.WarmKv(worker_pb2.WarmKvRequest(peers=[p.address]), timeout=120)
        if warmed.failed:
            raise RuntimeError(f"WarmKv failed: {list(warmed.failed)}")
    finally:
        await client.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--length", type=int, default=2048)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument(
        "--handoff",
        action="store_true",
        help="also READ raw (plain reader, from the prefill worker's KV and from the target) "
        "between the Prefill answer and the Decode call, the moment vLLM's READ runs in",
    )
    ap.add_argument(
        "--perf",
        default="",
        help="directory: `perf record -e cpu-clock -g` the decode worker and the plain reader "
        "over each pair's counted rounds (perf.data files there)",
    )
    args = ap.parse_args()
    model = kr.bench_model(
        Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "splitserve/kvbench-model"
    )
    eargs = kr.engine_args(args.length + 64)
    env = {"SPLITSERVE_KV_PULL_IN_STEP": "0"}
    load0 = os.getloadavg()
    print(
        f"# nixl_vllm_sides {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
        f"load {load0[0]:.1f}, length {args.length}, {args.rounds} rounds x {args.pairs} pairs\n"
    )
    target = Target(GiB // 2 + 8 * MiB)
    readers = {k: Reader(k, GiB + 16 * MiB) for k in ("plain", "torch")}
    print(f"target: AnonHugePages {target.huge_kib} kB")
    for k, r in readers.items():
        print(f"reader {k}: its buffer's VMA Rss / AnonHugePages kB {r.huge}")
    for r in readers.values():
        r.peer("target", target.meta)
    rows: list[dict[str, Any]] = []
    run_dir = Path(tempfile.mkdtemp(prefix="sides-"))
    try:
        for pair in range(args.pairs):
            p = start_worker(run_dir, f"p{pair}", "prefill", model, 0, env=env, engine_args=eargs)
            try:
                d = start_worker(
                    run_dir, f"d{pair}", "decode", model, 1, env=env, engine_args=eargs
                )
                try:
                    asyncio.run(_warm(p, d))
                    dm = vllm_meta(d.address, warm_up_ms=5000)
                    # The prefill engine progresses NIXL for a while (UCX's wire-up to the
                    # readers needs its answer; vLLM runs no progress thread here).
                    pm = vllm_meta(p.address, warm_up_ms=5000)
                    for w, m in ((p, pm), (d, dm)):
                        lo, hi = kv_span(m)
                        rss, huge = vma_huge(w.pid, lo, hi)
                        print(
                            f"pair {pair} {w.name}: KV {len(m.kv_caches_base_addr)} regions, "
                            f"block_lens {sorted(set(m.block_lens))}, strides "
                            f"{sorted(set(m.block_strides))}, {m.num_blocks} blocks, span "
                            f"{(hi - lo) // MiB} MiB; its VMAs Rss {rss} kB, AnonHugePages "
                            f"{huge} kB"
                        )
                    for r in readers.values():
                        for key, m in ((f"prefill{pair}", pm), (f"decode{pair}", dm)):
                            r.peer(key, m.agent_metadata)
                            base0, lay0 = layout_of(m, [0])
                            r.read(key, [(base0 + o, n) for o, n in lay0], lay0, 1)
                    perfs: list[subprocess.Popen[bytes]] = []
                    last: list[Any] = []
                    for rnd in range(args.rounds + 1):
                        if rnd == 1 and args.perf:
                            perfs = [
                                _perf(Path(args.perf) / f"{who}{pair}.data", pid)
                                for who, pid in (
                                    ("decode", d.pid),
                                    ("reader", readers["plain"].pid),
                                )
                            ]
                        handoff: dict[str, list[Any]] = {}
                        hook = None
                        if args.handoff and last:
                            hook = functools.partial(_at_handoff, readers["plain"], last, handoff)
                        blocks, nbytes, secs = asyncio.run(
                            _pd(p, d, f"sides-{pair}-{rnd}", args.length, hook)
                        )
                        base, lay = layout_of(pm, blocks)
                        dbase = min(dm.kv_caches_base_addr)
                        row: dict[str, Any] = {
                            "pair": pair,
                            "round": rnd,
                            "blocks": f"{blocks[0]}..{blocks[-1]} ({len(blocks)})",
                            "MiB": nbytes / MiB,
                            "vllm_ms": 1e3 * secs,
                        }
                        src = {
                            "target": [(target.addr + o, n) for o, n in lay],
                            f"prefill{pair}": [(base + o, n) for o, n in lay],
                            # the decode worker's KV as a source: the same block ids (its own
                            # blocks for the request are not reported; an approximation)
                            f"decode{pair}": [(dbase + o, n) for o, n in lay],
                        }
                        last = [(k, v, lay) for k, v in src.items()]
                        for k, got in handoff.items():
                            row[k] = [x[1] for x in got]
                            row[k + " cpu"] = [x[2] for x in got]
                        for rk, r in readers.items():
                            for sk, remote in src.items():
                                got = r.read(sk, remote, lay, args.repeat)
                                name = f"{rk}<-{sk.rstrip('0123456789')}"
                                row[name] = [x[1] for x in got]
                                row[name + " cpu"] = [x[2] for x in got]
                        if rnd:  # round 0 warms every path: not counted
                            rows.append(row)
                        print(
                            f"pair {pair} round {rnd}: {row['blocks']} {row['MiB']:.0f} MiB "
                            f"vLLM {row['vllm_ms']:.2f} ms; "
                            + "; ".join(
                                f"{k} {' / '.join(f'{1e3 * x:.2f}' for x in v)} ms"
                                for k, v in row.items()
                                if "<-" in k and not k.endswith("cpu")
                            ),
                            flush=True,
                        )
                    for pp in perfs:
                        pp.send_signal(signal.SIGINT)
                        pp.wait(60)
                finally:
                    stop_worker(d)
            finally:
                stop_worker(p)
    finally:
        for r in readers.values():
            r.close()
        target.close()
    load1 = os.getloadavg()
    print(f"\nload at the end {load1[0]:.1f}\n")
    keys = [k for k in rows[0] if "<-" in k and not k.endswith("cpu")] if rows else []
    print("| pair | vLLM READ ms | " + " | ".join(f"{k} ms (CPU)" for k in keys) + " |")
    print("|---|---:|" + "---:|" * len(keys))
    for pair in range(args.pairs):
        rs = [r for r in rows if r["pair"] == pair]
        if not rs:
            continue
        cells = []
        for k in keys:
            wall = med_ms([x for r in rs for x in r[k]])
            cells.append(f"{wall} ({med_ms([x for r in rs for x in r[k + ' cpu']])})")
        vl = statistics.median(r["vllm_ms"] for r in rs)
        print(f"| {pair} | {vl:.2f} | " + " | ".join(cells) + " |")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
