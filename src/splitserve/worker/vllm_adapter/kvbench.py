"""`make bench-kv`: what the KV handoff costs on the real engine, and what disaggregation buys.

Not a test: it measures and prints a Markdown report (summarised by hand in docs/benchmarks.md).
Everything runs on this machine: real `splitserve worker serve --engine vllm` processes (one core
each) driven over their gRPC API the way the router drives them (Prefill, then Decode with the
returned KV handle; or Generate), and NIXL's own two-process READ for the raw bandwidth.

Runs, interleaved so that load from other processes on a shared machine hits every mode alike:

* **single**: one request at a time at several prompt lengths, in three modes:
  `pd` (prefill worker -> NIXL -> decode worker), `agg` (the decode worker alone; the prefill
  worker stopped) and `control` (Generate on the decode worker while the idle prefill worker
  runs: what the mere presence of a second engine costs). Per request: TTFT, the token-1 ->
  token-2 gap, KV bytes and NIXL transfer time (the decode worker's vLLM metrics), and the raw
  NIXL READ time for the same bytes measured in the same run.
* **idle**: CPU per idle worker process (/proc), with NIXL's progress thread off and on.
* **interference**: a steady stream of decoding requests while long prompts arrive, with and
  without disaggregation: decode TPOT p50/p99 (see `interference`).

Timings here are wall-clock on a shared machine: compare modes within one run, as ratios.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing as mp
import os
import random
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MiB = 1 << 20


# -- worker processes ---------------------------------------------------------------------------


@dataclass(slots=True)
class WorkerProc:
    name: str
    proc: subprocess.Popen[bytes]
    address: str
    metrics_port: int
    log: Path

    @property
    def pid(self) -> int:
        return self.proc.pid


def start_worker(
    run_dir: Path,
    name: str,
    role: str,
    model: str,
    cpu: int,
    *,
    env: dict[str, str] | None = None,
    engine_args: Sequence[str] = (),
    engine: str = "vllm",
    timeout_s: float = 300.0,
) -> WorkerProc:
    """`splitserve worker serve` on one core; returns when it is ready. `engine="sim"`: the
    simulated engine timing `model` (a `core.perf` shape) on the `cpu-2core` preset."""
    from splitserve.worker.vllm_adapter.engine import local_cpu_env

    ready = run_dir / f"{name}.ready.json"
    ready.unlink(missing_ok=True)
    log = run_dir / f"{name}.log"
    penv = {**os.environ, **local_cpu_env(cpu=cpu), "VLLM_CACHE_ROOT": str(run_dir / "cache")}
    penv.update(env or {})
    argv = [
        *(sys.executable, "-m", "splitserve", "worker", "serve", "--engine", engine),
        *("--role", role, "--served-model-name", "bench"),
        *("--ready-file", str(ready), "--log-level", "WARNING"),
    ]
    if engine == "vllm":
        argv += ["--model", model, "--nixl-port", "0", "--", "--dtype", "float32", *engine_args]
    else:
        argv += ["--model", "bench", "--sim-shape", model, "--sim-hardware", "cpu-2core"]
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=penv)
    deadline = time.monotonic() + timeout_s
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            with contextlib.suppress(OSError):
                proc.kill()
            raise RuntimeError(f"worker {name} did not start:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)
    info = json.loads(ready.read_text())
    return WorkerProc(name, proc, str(info["address"]), int(info["metrics_port"]), log)


def stop_worker(w: WorkerProc) -> None:
    if w.proc.poll() is None:
        w.proc.send_signal(signal.SIGTERM)
        try:
            w.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            w.proc.kill()
            w.proc.wait()


def scrape(w: WorkerProc) -> dict[str, float]:
    """The worker's /metrics as {name: value} (unlabelled samples; labelled ones summed)."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{w.metrics_port}/metrics", timeout=10) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[s.name] = out.get(s.name, 0.0) + float(s.value)
    return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (all its threads), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def idle_cpu(workers: Sequence[WorkerProc], seconds: float) -> dict[str, float]:
    """Fraction of one core each worker used over `seconds` with nothing to do."""
    before = {w.name: cpu_seconds(w.pid) for w in workers}
    t0 = time.monotonic()
    time.sleep(seconds)
    dt = time.monotonic() - t0
    return {w.name: (cpu_seconds(w.pid) - before[w.name]) / dt for w in workers}


# -- requests over gRPC -------------------------------------------------------------------------


def prompt_of(length: int, seed: int, vocab: int = 2000) -> list[int]:
    rng = random.Random(seed)
    return [1, *(rng.randrange(3, vocab) for _ in range(length - 1))]


@dataclass(slots=True)
class Timing:
    """One request: seconds from the first call."""

    mode: str
    prompt_tokens: int
    ttft_s: float
    token2_s: float
    """Gap between the first and the second token reaching the client."""
    tokens: list[int]
    end_s: float
    kv_bytes: float = 0.0
    """Bytes NIXL moved (the decode worker's vLLM metrics)."""
    handle_bytes: float = 0.0
    """Bytes the KV handle announced (the engine's own count; the sim engine's model)."""
    xfer_s: float = 0.0
    raw_s: list[float] = field(default_factory=list)
    """Raw NIXL READs of the same bytes as one descriptor right after this request (RawNixl;
    NIXL's xferDuration, the measure of `xfer_s`)."""
    raw_vllm_s: list[float] = field(default_factory=list)
    """The same bytes read the way vLLM reads them (`vllm_like`: its descriptor layout,
    prepared lists, a notification), right after this request."""
    raw_vllm_cpu_s: list[float] = field(default_factory=list)
    """CPU seconds of the raw reader's thread inside `transfer()` for those READs."""
    raw_cold_s: list[float] = field(default_factory=list)
    """The same vLLM-like READs by the same reader into its cold buffer (a destination as large
    as the decode worker's KV cache, least recently written slots first: as cold as vLLM's
    destination), alternating one by one with the `raw_vllm_s` ones (xferDuration)."""
    raw_cold_cpu_s: list[float] = field(default_factory=list)
    raw_cold_age_s: list[float] = field(default_factory=list)
    """Per cold READ: the median seconds since the slots it wrote were last written."""
    raw_handoff_s: list[float] = field(default_factory=list)
    raw_handoff_cpu_s: list[float] = field(default_factory=list)
    """`--raw-at-handoff`: vLLM-like raw READs on the decode worker's core between this
    request's Prefill answer and its Decode call (xferDuration, CPU in `transfer()`)."""
    raw_core_s: list[float] = field(default_factory=list)
    """vLLM-like raw READs by a reader pinned to the decode worker's core, right before and
    right after this request (with cma, UCX's READ on one host, the copy runs on the reader's
    core)."""
    kv_blocks: list[list[int]] = field(default_factory=list)
    """The prefill's KV block ids per KV cache group (the handle's `remote_block_ids`)."""
    token_times_s: list[float] = field(default_factory=list)


class Client:
    """gRPC stubs for the workers, used the way the router uses them."""

    def __init__(self, trace: Any = None, mux: bool = False, early_decode: bool = False) -> None:
        import grpc

        from splitserve._gen.v1 import worker_pb2_grpc

        self.trace = trace
        """A `kvtrace.KvTrace`: P/D requests mark when token 1 and token 2 reach us."""
        self.mux = mux
        """Prefill / Decode / Generate as sub-requests of one `Multiplex` stream per worker (what
        the router does), not a call each (the bench's default: a Decode pays a call's set-up
        between token 1 and token 2, which the router does not)."""
        self.early_decode = early_decode
        """With `mux`: each P/D request's Decode is sent with `kv_follows` before its Prefill,
        and only the first token and KV handle (`MuxOp.decode_kv`) after the Prefill answers."""
        if early_decode and not mux:
            raise ValueError("early_decode needs mux (kv_follows is for Multiplex sub-requests)")

        self._grpc = grpc
        self._channels: dict[str, Any] = {}
        self._muxes: dict[str, MuxConn] = {}
        self._stub_cls = worker_pb2_grpc.WorkerStub

    def channel(self, address: str) -> Any:
        ch = self._channels.get(address)
        if ch is None:
            ch = self._grpc.aio.insecure_channel(address)
            self._channels[address] = ch
        return ch

    def stub(self, address: str) -> Any:
        return self._stub_cls(self.channel(address))

    async def _mux(self, address: str) -> MuxConn:
        conn = self._muxes.get(address)
        if conn is None:
            conn = self._muxes[address] = MuxConn(self.stub(address))
        await conn.ready()
        return conn

    async def _unary_prefill(self, address: str, msg: Any) -> Any:
        if self.mux:
            return await (await self._mux(address)).prefill(msg)
        return await self.stub(address).Prefill(msg)

    async def _stream(self, address: str, kind: str, msg: Any) -> Any:
        """A Decode (`kind` "decode") or Generate's chunks."""
        if self.mux:
            return (await self._mux(address)).stream(kind, msg)
        stub = self.stub(address)
        return (stub.Decode if kind == "decode" else stub.Generate)(msg)

    async def close(self) -> None:
        for conn in self._muxes.values():
            await conn.close()
        self._muxes.clear()
        for ch in self._channels.values():
            await ch.close()
        self._channels.clear()

    @staticmethod
    def sampling(max_tokens: int) -> Any:
        from splitserve._gen.v1 import common_pb2

        return common_pb2.SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)

    async def pd(
        self,
        prefill: str,
        decode: str,
        rid: str,
        prompt: list[int],
        max_tokens: int,
        at_handoff: Any = None,
    ) -> Timing:
        """`at_handoff`: called between the Prefill answer and the Decode call (the moment
        vLLM's READ happens in; its time is the client's, so the gap is not comparable)."""
        from splitserve._gen.v1 import worker_pb2

        t0 = time.perf_counter()
        early: tuple[MuxConn, int, Any] | None = None
        if self.early_decode:  # sent when the pair is known, before the prefill
            conn = await self._mux(decode)
            msg = worker_pb2.DecodeRequest(
                request_id=rid,
                prompt_token_ids=prompt,
                sampling=self.sampling(max_tokens),
                kv_follows=True,
            )
            early = (conn, *await conn.open("decode", msg))
        out = await self._unary_prefill(
            prefill,
            worker_pb2.PrefillRequest(
                request_id=rid, prompt_token_ids=prompt, sampling=self.sampling(max_tokens)
            ),
        )
        t1 = time.perf_counter() - t0
        if at_handoff is not None:
            at_handoff()
        if self.trace is not None:
            self.trace.mark(rid, "token1", t0 + t1)
        tokens = [out.first_token_id]
        times = [t1]
        kv_bytes = float(out.kv.num_bytes) if out.HasField("kv") else 0.0
        params = json.loads(out.kv.params_json or "{}") if out.HasField("kv") else {}
        blocks = params.get("remote_block_ids") or []
        if blocks and not isinstance(blocks[0], list):
            blocks = [blocks]
        call: Any
        if early is not None:
            conn, sid, call = early
            await conn.send(
                sid, decode_kv=worker_pb2.DecodeKv(first_token_id=out.first_token_id, kv=out.kv)
            )
        else:
            call = await self._stream(
                decode,
                "decode",
                worker_pb2.DecodeRequest(
                    request_id=rid,
                    prompt_token_ids=prompt,
                    first_token_id=out.first_token_id,
                    sampling=self.sampling(max_tokens),
                    kv=out.kv,
                ),
            )
        async for chunk in call:
            if chunk.error:
                raise RuntimeError(f"decode of {rid}: {chunk.error}")
            now = time.perf_counter() - t0
            if self.trace is not None and len(tokens) == 1 and chunk.token_ids:
                self.trace.mark(rid, "token2", t0 + now)
            for t in chunk.token_ids:
                tokens.append(t)
                times.append(now)
        t = _timing("pd", prompt, tokens, times)
        t.handle_bytes = kv_bytes
        t.kv_blocks = [[int(b) for b in g] for g in blocks]
        return t

    async def generate(self, address: str, rid: str, prompt: list[int], max_tokens: int) -> Timing:
        from splitserve._gen.v1 import worker_pb2

        t0 = time.perf_counter()
        tokens: list[int] = []
        times: list[float] = []
        call = await self._stream(
            address,
            "generate",
            worker_pb2.GenerateRequest(
                request_id=rid, prompt_token_ids=prompt, sampling=self.sampling(max_tokens)
            ),
        )
        async for chunk in call:
            if chunk.error:
                raise RuntimeError(f"generate of {rid}: {chunk.error}")
            now = time.perf_counter() - t0
            for t in chunk.token_ids:
                tokens.append(t)
                times.append(now)
        return _timing("agg", prompt, tokens, times)


class MuxConn:
    """One `Worker.Multiplex` stream to a worker, its sub-requests read like their own calls
    (a minimal counterpart of the router's `router.mux.MuxLink`, which the worker package may
    not import: no fallback, no deadlines, no fast lane)."""

    def __init__(self, stub: Any) -> None:
        import asyncio

        self._call = stub.Multiplex()
        self._subs: dict[int, asyncio.Queue[Any]] = {}
        self._next = 0
        self._reader: asyncio.Task[None] | None = None
        self._writing = asyncio.Lock()  # one write at a time on the call

    async def ready(self) -> None:
        """The worker's header is in (it is sent first; nothing is written before it)."""
        if self._reader is None:
            import asyncio

            await self._call.initial_metadata()
            self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        from grpc import aio

        while True:
            resp = await self._call.read()
            if resp is aio.EOF:
                break
            for ev in resp.events:
                q = self._subs.get(ev.stream_id)
                if q is not None:
                    q.put_nowait(ev)
        for q in self._subs.values():
            q.put_nowait(None)

    async def send(self, sid: int, **op: Any) -> None:
        """One op (`prefill=`, `decode=`, `generate=`, `decode_kv=`, ...) for sub-request `sid`."""
        from splitserve._gen.v1 import worker_pb2

        msg = worker_pb2.MuxRequest(ops=[worker_pb2.MuxOp(stream_id=sid, **op)])
        async with self._writing:
            await self._call.write(msg)

    def _new(self) -> tuple[int, Any]:
        import asyncio

        self._next += 1
        q: asyncio.Queue[Any] = asyncio.Queue()
        self._subs[self._next] = q
        return self._next, q

    async def prefill(self, msg: Any) -> Any:
        sid, q = self._new()
        try:
            await self.send(sid, prefill=msg)
            ev = await q.get()
            if ev is None or ev.WhichOneof("event") != "prefill":
                raise RuntimeError(f"prefill sub-request {sid}: {ev}")
            return ev.prefill
        finally:
            del self._subs[sid]

    async def open(self, kind: str, msg: Any) -> tuple[int, Any]:
        """A Decode (`kind` "decode") or Generate sub-request, sent now: its stream_id, and its
        chunks (an async iterator; an error status raises)."""
        sid, q = self._new()
        try:
            await self.send(sid, **{kind: msg})
        except BaseException:
            del self._subs[sid]
            raise
        return sid, self._chunks(kind, sid, q)

    async def stream(self, kind: str, msg: Any) -> Any:
        _, chunks = await self.open(kind, msg)
        async for chunk in chunks:
            yield chunk

    async def _chunks(self, kind: str, sid: int, q: Any) -> Any:
        try:
            while True:
                ev = await q.get()
                if ev is None:
                    raise RuntimeError(f"{kind} sub-request {sid}: the stream ended")
                which = ev.WhichOneof("event")
                if which == "status":
                    if ev.status.code:
                        raise RuntimeError(f"{kind} sub-request {sid}: {ev.status}")
                    return
                if which == "chunk":
                    yield ev.chunk
        finally:
            del self._subs[sid]

    async def close(self) -> None:
        await self._call.done_writing()
        if self._reader is not None:
            await self._reader


def _timing(mode: str, prompt: list[int], tokens: list[int], times: list[float]) -> Timing:
    if len(times) < 2:
        raise RuntimeError(f"{mode}: fewer than 2 tokens came back")
    return Timing(
        mode=mode,
        prompt_tokens=len(prompt),
        ttft_s=times[0],
        token2_s=times[1] - times[0],
        tokens=tokens,
        end_s=times[-1],
        token_times_s=times,
    )


# -- raw NIXL ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReadMethod:
    """How a raw READ lays out and posts its descriptors (what may differ from vLLM's READ).

    `pieces` descriptors of `nbytes // pieces` bytes, spread over `regions` registered regions
    (vLLM's CPU KV cache: one region per layer and K/V, one descriptor per block), posted with
    `make_prepped_xfer` over prepared lists as vLLM does (`prepped`; else `initialize_xfer`),
    NIXL merging address-contiguous descriptors unless `merge` is off (vLLM leaves it on),
    and with a completion notification to the target as vLLM's READ carries (`notify`). A
    region's blocks lie in `runs` address-contiguous runs (a block's gap between runs), as
    vLLM's block ids may not be consecutive."""

    pieces: int = 1
    regions: int = 1
    prepped: bool = False
    merge: bool = True
    notify: bool = False
    runs: int = 1
    offset: int = 0
    """Bytes into the registered buffers where the READ's layout starts, on both sides (a
    different window of physical memory)."""
    fresh: bool = False
    """The target writes the bytes right before each READ (a prefill has just written the KV it
    hands off: in the prefill core's caches, not in memory)."""
    cold: bool = False
    """The READ's destination is the reader's cold buffer (`RawNixl(cold_bytes=...)`, as large as
    the decode worker's KV cache), at the block slots written longest ago (`cold_descs`: a ring,
    as vLLM's free-block queue hands a new request the least recently used blocks); else the
    reader's small buffer, rewritten by every READ (warm)."""

    def describe(self) -> str:
        post = "make_prepped_xfer" if self.prepped else "initialize_xfer"
        merge = "" if self.merge else ", merging off"
        notif = ", with a notification" if self.notify else ""
        notif += ", source freshly written" if self.fresh else ""
        notif += ", into the least recently written slots of the cold buffer" if self.cold else ""
        runs = f" ({self.runs} contiguous runs each)" if self.regions > 1 or self.runs > 1 else ""
        return (
            f"{self.pieces} descriptor(s) in {self.regions} region(s){runs}, {post}{merge}{notif}"
        )


ONE_DESCRIPTOR = ReadMethod()
"""The bench's first raw READ: the bytes as one contiguous descriptor."""


def vllm_like(nbytes: int, regions: int, block_bytes: int, runs: int = 1) -> ReadMethod:
    """vLLM's READ of `nbytes` of a CPU KV cache with `regions` regions (layers x K/V) and
    blocks of `block_bytes` per region: one descriptor per block and region, prepared lists,
    merging on, a notification."""
    blocks = max(1, nbytes // (regions * block_bytes))
    return ReadMethod(blocks * regions, regions, prepped=True, notify=True, runs=runs)


def _buffer(nbytes: int, huge_pages: bool, fill: int) -> tuple[Any, int]:
    """An anonymous mapping of `nbytes`, madvised into transparent huge pages or 4 KiB ones,
    touched (as vLLM's KV cache is: no page faults during a READ); (mapping, address)."""
    import ctypes
    import mmap

    size = -(-nbytes // (2 * MiB)) * 2 * MiB + 2 * MiB
    m = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    m.madvise(mmap.MADV_HUGEPAGE if huge_pages else mmap.MADV_NOHUGEPAGE)
    base = ctypes.addressof(ctypes.c_char.from_buffer(m))
    addr = -(-base // (2 * MiB)) * 2 * MiB  # 2 MiB aligned, so huge pages can back it
    ctypes.memset(addr, fill, nbytes)
    return m, addr


def anon_huge_kib(pid: int | str = "self") -> int:
    """AnonHugePages of a process (kB, /proc/<pid>/smaps_rollup); -1 when unreadable."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("AnonHugePages:"):
                return int(line.split()[1])
    except OSError:
        pass
    return -1


def ucx_env() -> dict[str, str]:
    """UCX's settings of a local vLLM worker (`local_cpu_env`, with this process's own UCX_*
    on top, which the workers inherit too): raw READs run on the same transports."""
    from splitserve.worker.vllm_adapter.engine import local_cpu_env

    env = {k: v for k, v in local_cpu_env().items() if k.startswith("UCX_")}
    env.update({k: v for k, v in os.environ.items() if k.startswith("UCX_")})
    return env


CHURN_ENV = "SPLITSERVE_KVBENCH_CHURN"
"""`<reader core>,<target core>` (-1: none): a thread in the raw reader / target process maps
and unmaps 1 MiB every 0.2 ms on that core while the READs run, as a worker's other threads
(gRPC, the allocator) change its address space beside the copy. For measuring only."""


def _churn(cpu: int) -> None:
    import mmap
    import threading

    def run() -> None:
        os.sched_setaffinity(0, {cpu})  # this thread only
        while True:
            m = mmap.mmap(-1, MiB)
            m[0:MiB:4096] = b"x" * (MiB // 4096)  # touch every page: unmapping must flush
            m.close()
            time.sleep(0.0002)

    threading.Thread(target=run, daemon=True).start()


def _churn_core(side: int) -> int:
    parts = os.environ.get(CHURN_ENV, "").split(",")
    return int(parts[side]) if len(parts) == 2 else -1


def _nixl_target(
    conn: Any, nbytes: int, progress_thread: bool, huge_pages: bool = True, cpu: int | None = None
) -> None:
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    if _churn_core(1) >= 0:
        _churn(_churn_core(1))
    os.environ.update(ucx_env())
    from nixl._api import nixl_agent, nixl_agent_config

    agent = nixl_agent("target", nixl_agent_config(enable_prog_thread=progress_thread))
    buf, addr = _buffer(2 * nbytes, huge_pages, 1)
    agent.register_memory([(addr, 2 * nbytes, 0, "")], "DRAM")
    conn.send((agent.get_agent_metadata(), addr, anon_huge_kib()))
    import ctypes

    while True:
        while not conn.poll(0.001):
            agent.get_new_notifs()  # progress (transports that need the target's help)
        cmd = conn.recv()
        if not (isinstance(cmd, tuple) and cmd[0] == "write"):
            break
        for off, size in cmd[1]:  # the READ's bytes, written as a prefill writes its KV
            ctypes.memset(addr + off, cmd[2], size)
        conn.send("written")
    del buf


def _descs(addr: int, max_bytes: int, n: int, m: ReadMethod) -> list[tuple[int, int, int]]:
    """The READ's descriptors: `m.pieces` equal blocks, `m.pieces // m.regions` contiguous ones
    at the start of each of `m.regions` equal spans of the registered buffer (`max_bytes`, twice
    the largest READ: regions never touch, as vLLM's layers' K and V caches do not); a region's
    blocks in `m.runs` runs, one block's gap between runs."""
    size = n // m.pieces
    per_region = max(1, m.pieces // m.regions)
    runs = max(1, min(m.runs, per_region))
    per_run = -(-per_region // runs)
    span = max_bytes // m.regions
    if (per_region + runs) * size > span:
        raise ValueError(f"{m.describe()}: {n} bytes do not fit the {max_bytes} registered")
    out = []
    for i in range(m.pieces):
        j = i % per_region
        out.append((addr + (i // per_region) * span + (j + j // per_run) * size, size, 0))
    return out


def cold_descs(
    addr: int, span: int, n: int, m: ReadMethod, cursor: int
) -> tuple[list[tuple[int, int, int]], int]:
    """A cold READ's destination descriptors and the next `cursor`: `_descs`' blocks (`n //
    m.pieces` bytes, `m.pieces // m.regions` per region, in `_descs`' order), each region a
    ring of `span // m.regions // size` block slots in a `span`-byte buffer at `addr`. Block j
    of every region goes to slot (first + j) mod slots, `first` the slot at byte `cursor` of
    a region (rounded up to a whole slot), and the next READ starts after the last one written:
    every READ writes the slots written longest ago, as vLLM's block pool hands a request the
    least recently used blocks, and the same slot in every region, as vLLM's block ids index
    every layer's region alike. The blocks of one READ are contiguous (across the ring's end,
    two runs); the `runs` of `m` describe the source only (an approximation: vLLM's decode
    blocks are as contiguous as its free queue leaves them)."""
    size = n // m.pieces
    per_region = max(1, m.pieces // m.regions)
    region = span // m.regions
    slots = region // size if size else 0
    if slots < per_region:
        raise ValueError(
            f"{m.describe()}: {per_region} blocks of {size} bytes per region do not fit the "
            f"cold buffer's {region} bytes per region ({span} bytes in all)"
        )
    first = -(-cursor // size) % slots
    out = []
    for i in range(m.pieces):
        r, j = divmod(i, per_region)
        out.append((addr + r * region + ((first + j) % slots) * size, size, 0))
    return out, ((first + per_region) % slots) * size


def check_read(nbytes: int, method: ReadMethod, max_bytes: int, cold_bytes: int) -> None:
    """Refuses a READ `RawNixl` cannot make, naming why (before anything is sent)."""
    if nbytes > max_bytes:
        raise ValueError(f"{nbytes} bytes > the {max_bytes} registered")
    if method.pieces % method.regions or nbytes % method.pieces:
        raise ValueError(f"{method.describe()} does not split {nbytes} bytes evenly")
    if method.cold and not cold_bytes:
        raise ValueError("a cold READ needs RawNixl(cold_bytes=...) > 0 (no cold buffer)")
    if method.cold:  # raises when the blocks do not fit the ring
        cold_descs(0, cold_bytes, nbytes, method, 0)


def _nixl_reader(
    conn: Any,
    ctl: Any,
    nbytes: int,
    progress_thread: bool,
    cpu: int | None = None,
    huge_pages: bool = True,
    num_threads: int = 0,
    cold_bytes: int = 0,
) -> None:
    """Reads the first n bytes of the target's buffer `repeat` times per ("read", n, repeat,
    method) command on `ctl`, answering (seconds from `transfer()` to DONE, polled; NIXL's own
    xferDuration in seconds; NIXL's descriptor count after merging) per READ. On `cpu` only
    when given (the decode worker's core: the READ's copy then gets the CPU the worker's gets).
    `cold_bytes`: a second destination of that size (touched once at start, then written only
    by cold READs, each into the slots written longest ago: `cold_descs`)."""
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    if _churn_core(0) >= 0:
        _churn(_churn_core(0))
    os.environ.update(ucx_env())
    from nixl._api import nixl_agent, nixl_agent_config

    config = nixl_agent_config(
        enable_prog_thread=progress_thread, capture_telemetry=True, num_threads=num_threads
    )
    agent = nixl_agent("reader", config)
    buf, addr = _buffer(2 * nbytes, huge_pages, 2)
    agent.register_memory([(addr, 2 * nbytes, 0, "")], "DRAM")
    cold_buf, cold_addr = _buffer(cold_bytes, huge_pages, 4) if cold_bytes else (None, 0)
    if cold_bytes:
        agent.register_memory([(cold_addr, cold_bytes, 0, "")], "DRAM")
    cursor = 0  # the cold ring's next slot (bytes into each region)
    written: dict[int, float] = {}  # when each byte of a cold region was last written (by slot)
    ages: list[float] = []  # per cold READ: seconds since its slots were last written (median)
    born = time.monotonic()
    meta, remote_addr, target_huge = conn.recv()
    peer = agent.add_remote_agent(meta)
    ctl.send((anon_huge_kib(), target_huge))
    while True:
        cmd = ctl.recv()
        if cmd[0] == "stop":
            break
        if cmd[0] == "ages":
            ctl.send(ages)
            ages = []
            continue
        _, n, repeat, m = cmd
        span = 2 * nbytes - m.offset
        sources = _descs(remote_addr + m.offset, span, n, m)
        remote = agent.get_xfer_descs(sources, "DRAM")
        idx = list(range(m.pieces))
        rp = agent.prep_xfer_dlist(peer, remote) if m.prepped else None
        notif = b"raw" if m.notify else b""
        out = []
        for k in range(repeat):
            if m.cold:  # each READ into the ring's next (least recently written) slots
                ranges, cursor = cold_descs(cold_addr, cold_bytes, n, m, cursor)
                now = time.monotonic()
                region0 = [
                    a - cold_addr for a, _, _ in ranges if a - cold_addr < cold_bytes // m.regions
                ]
                ages.append(statistics.median(now - written.get(o, born) for o in region0))
                written.update(dict.fromkeys(region0, now))
            elif k == 0:
                ranges = _descs(addr + m.offset, span, n, m)
            if m.cold or k == 0:
                local = agent.get_xfer_descs(ranges, "DRAM")
                lp = agent.prep_xfer_dlist("NIXL_INIT_AGENT", local) if m.prepped else None
            if m.fresh:  # every byte the READ's descriptors cover, rewritten by the target
                conn.send(("write", [(a - remote_addr, n) for a, n, _ in sources], 3 + k % 100))
                conn.recv()
            if m.prepped:
                handle = agent.make_prepped_xfer(
                    "READ", lp, idx, rp, idx, notif_msg=notif, skip_desc_merge=not m.merge
                )
            else:
                handle = agent.initialize_xfer("READ", local, remote, peer, notif)
            t0 = time.perf_counter()
            c0 = time.thread_time()
            state = agent.transfer(handle)
            c1 = time.thread_time()
            while state == "PROC":
                state = agent.check_xfer_state(handle)
            dt = time.perf_counter() - t0
            tel = agent.get_xfer_telemetry(handle)
            out.append((dt, tel.xferDuration / 1e6, int(tel.descCount), c1 - c0))
            agent.release_xfer_handle(handle)
            if state != "DONE":
                raise RuntimeError(f"NIXL READ failed: {state}")
            if m.cold and lp is not None:  # the next READ has other slots
                agent.release_dlist_handle(lp)
                lp = None
        for h in (lp, rp):
            if h is not None:
                agent.release_dlist_handle(h)
        ctl.send(out)
    conn.send("done")
    del buf, cold_buf


class RawNixl:
    """Two processes moving DRAM with NIXL READs (UCX, loopback), kept for a whole run so that
    raw reads can be interleaved with the engine's transfers of the same bytes. Both buffers are
    anonymous mappings in transparent huge pages (`huge_pages`, as `local_cpu_env` puts vLLM's
    KV cache) or in 4 KiB pages. `cold_bytes` > 0: the reader also holds a destination that
    large (the decode worker's KV cache size), which READs made with `ReadMethod(cold=True)`
    write in a ring, the least recently written slots first (`cold_descs`)."""

    def __init__(
        self,
        max_bytes: int,
        progress_thread: bool = False,
        cpu: int | None = None,
        huge_pages: bool = True,
        num_threads: int = 0,
        target_cpu: int | None = None,
        cold_bytes: int = 0,
    ) -> None:
        if cold_bytes < 0:
            raise ValueError(f"cold_bytes must be >= 0, got {cold_bytes}")
        ctx = mp.get_context("spawn")
        a, b = ctx.Pipe()
        self._ctl, ctl = ctx.Pipe()
        self._procs = [
            ctx.Process(
                target=_nixl_target, args=(a, max_bytes, progress_thread, huge_pages, target_cpu)
            ),
            ctx.Process(
                target=_nixl_reader,
                args=(b, ctl, max_bytes, progress_thread, cpu, huge_pages, num_threads, cold_bytes),
            ),
        ]
        for p in self._procs:
            p.start()
        self.max_bytes = max_bytes
        self.cold_bytes = cold_bytes
        if not self._ctl.poll(300):
            raise TimeoutError("raw NIXL reader did not start")
        self.huge_kib: tuple[int, int] = self._ctl.recv()
        """AnonHugePages (kB) of the reader and the target process once their buffers are in."""
        self.huge_pages = huge_pages
        self.read_s(min(max_bytes, MiB), 2)  # connection set-up: not counted

    def thp_short(self) -> str | None:
        """With huge pages asked for: which raw buffer the kernel did not (all) back with
        them (`thp_short`), else None."""
        if not self.huge_pages:
            return None
        return thp_short(self.huge_kib, self.max_bytes, self.cold_bytes)

    def read(
        self, nbytes: int, repeat: int = 3, method: ReadMethod = ONE_DESCRIPTOR
    ) -> list[tuple[float, float, int, float]]:
        """Per READ of `nbytes` by `method`: (seconds from `transfer()` to DONE, NIXL's
        telemetry xferDuration in seconds — what vLLM reports —, descriptors after merging,
        CPU seconds of the reading thread inside `transfer()`: with `cma` the copy)."""
        check_read(nbytes, method, self.max_bytes, self.cold_bytes)
        self._ctl.send(("read", nbytes, repeat, method))
        if not self._ctl.poll(300):
            raise TimeoutError("raw NIXL read did not answer")
        got: list[tuple[float, float, int, float]] = self._ctl.recv()
        return got

    def cold_ages(self) -> list[float]:
        """Per cold READ since the last call: the median seconds since the ring slots it wrote
        were last written (or, on the ring's first turn, since the buffer was touched)."""
        self._ctl.send(("ages",))
        if not self._ctl.poll(60):
            raise TimeoutError("raw NIXL reader did not answer")
        got: list[float] = self._ctl.recv()
        return got

    def read_s(
        self, nbytes: int, repeat: int = 3, method: ReadMethod = ONE_DESCRIPTOR
    ) -> list[float]:
        """NIXL's xferDuration per READ (the measure vLLM's `nixl_xfer_time` is made of)."""
        return [tel for _, tel, _, _ in self.read(nbytes, repeat, method)]

    def close(self) -> None:
        with contextlib.suppress(OSError, BrokenPipeError):
            self._ctl.send(("stop",))
        for p in self._procs:
            p.join(30)
            if p.is_alive():
                p.kill()


def thp_short(huge_kib: tuple[int, int], max_bytes: int, cold_bytes: int) -> str | None:
    """Which of `RawNixl`'s buffers are less than 90 % in transparent huge pages, from the
    reader's and the target's AnonHugePages (kB, `RawNixl.huge_kib`), or None. The reader
    holds 2 x `max_bytes` and the cold ring, the target 2 x `max_bytes`. With THP in `madvise`
    mode the kernel falls back to 4 KiB pages when it finds no free 2 MiB ones (seen on this
    VM on 2026-11-27: reader 228 MiB of 1,160, target none; the raw READ 1.7x slower)."""
    want = {"reader": (2 * max_bytes + cold_bytes) // 1024, "target": 2 * max_bytes // 1024}
    short = [
        f"{name} {got} of {need} kB"
        for (name, need), got in zip(want.items(), huge_kib, strict=True)
        if got < 0.9 * need
    ]
    return ", ".join(short) or None


def raw_nixl_read_s(nbytes: int, repeat: int = 5, progress_thread: bool = False) -> list[float]:
    """Seconds per NIXL READ of `nbytes` (one descriptor) between two fresh processes."""
    raw = RawNixl(nbytes, progress_thread)
    try:
        return raw.read_s(nbytes, repeat)
    finally:
        raw.close()


# -- the runs -----------------------------------------------------------------------------------


def xfer_delta(before: dict[str, float], after: dict[str, float]) -> tuple[float, float, float]:
    """(transfers, bytes, seconds) the decode worker's NIXL metrics counted in between."""
    base = "splitserve_worker_vllm_kv_transfer_"
    n = after.get(base + "seconds_count", 0) - before.get(base + "seconds_count", 0)
    b = after.get(base + "bytes_sum", 0) - before.get(base + "bytes_sum", 0)
    s = after.get(base + "seconds_sum", 0) - before.get(base + "seconds_sum", 0)
    return n, b, s


def pct(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    k = min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))
    return s[k]


def med(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def ms(x: float) -> str:
    return f"{x * 1000:.1f}"


@contextlib.contextmanager
def workers(
    run_dir: Path, model: str, specs: Sequence[tuple[str, str, int]], **kw: Any
) -> Iterator[list[WorkerProc]]:
    started: list[WorkerProc] = []
    try:
        for name, role, cpu in specs:
            started.append(start_worker(run_dir, name, role, model, cpu, **kw))
        yield started
    finally:
        for w in started:
            stop_worker(w)


def main(argv: Sequence[str] | None = None) -> None:
    from splitserve.worker.vllm_adapter import kvbench_runs

    kvbench_runs.main(argv)


if __name__ == "__main__":
    main()
