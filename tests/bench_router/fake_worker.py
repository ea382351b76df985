"""A lean zero-delay prefill or decode worker for the router benchmark (issue 17, c=32 saturation).

Why: on the 2-core machine the load core (core 1) runs the load generator and the zero-delay sim
workers, and the sim workers cost ~1.5 ms of CPU per request there (docs/benchmarks.md
"Fourteenth pass", step 1), which caps a c=32 run at ~500 req/s while the router (core 0) is
half idle. This fake speaks the protocol the router uses with a real worker, at a fraction of the
CPU, so the router's own saturation can be reached:

- gRPC `WatchLoad` for the first load report (which names the stream link's port, as
  `worker serve` does); every other gRPC method is UNIMPLEMENTED, as the base servicer answers
  (the simulated engine serves no `WorkerKv` either);
- the stream link (`core.frames` framing, `MuxRequest` / `MuxResponse`), the ops `prefill`,
  `decode` (with or without `kv_follows`, then `decode_kv`), `generate`, `cancel`,
  `watch_load` and `watch_step_batches`, answered as `worker.mux.serve` answers them: a
  `PrefillResponse` with a `sim` KV handle naming this worker, then an OK status; one
  `TokenChunk` per token (request id and prompt length set, the last with its finish reason),
  then an OK status; load reports every `interval_s`; one `StepSample` per step, the samples
  that wait for the same frame joined per feed.

The engine is a step loop paced like the simulated one with `--sim-time-scale 0`, whose steps take
a fraction of a millisecond of CPU each with the worker's event loop blocked: a step here sleeps
`--step-ms` plus `--seq-ms` per sequence in it with the loop blocked (`time.sleep`: the wall time,
not the CPU, so the load core stays free), then answers every waiting prefill (prefill role) or
gives every running sequence one token (decode role), and writes one frame per connection with what
is ready, as the sim worker writes a message per step; the next step runs at the loop's next turn,
after the connections' reads. Chunks of one sub-request that wait for the same frame are joined, as
`worker.mux` joins them; a frame waits while more than `WRITE_BUFFER_BYTES` are unsent (as
`worker.link`'s `drain`). The token ids are the simulated engine's (`SyntheticTokens` with the
worker's defaults, the same key of prompt and seed), so the router detokenizes the same text.

Not a worker: no KV, no batching policy, no admission, no metrics, no TLS. Whether the router does
the same work per request with it as with the sim workers is measured, not assumed
(`tests.bench_router.ab --backend`, `tests.bench_router.counts --backend`; docs/benchmarks.md
"Fourteenth pass", fairness check).

    python -m tests.bench_router.fake_worker --role prefill|decode --ready-file F
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Final, cast

import grpc
from grpc import aio

from splitserve._gen.v1 import common_pb2, worker_pb2, worker_pb2_grpc
from splitserve.core.frames import FrameError, FrameSplitter, frame
from splitserve.policy.batching.tokens import SyntheticTokens
from tests.bench_router.ready import announce

WRITE_BUFFER_BYTES: Final = 2048
"""As `worker.link`: above this many unsent bytes the next frame waits (and gathers)."""
VOCAB_SIZE: Final = 4096
FIRST_TOKEN_ID: Final = 16
"""`worker serve`'s defaults (`WorkerConfig.vocab_size`, `first_token_id`)."""
KV_BLOCKS: Final = 6976
KV_BLOCK_SIZE: Final = 16
"""What a zero-delay sim worker with the default shape reports (measured)."""
KV_BYTES_PER_TOKEN: Final = 524288
"""The default shape's KV bytes per token (a 200-token prompt: 104,857,600 bytes, measured)."""
MODEL: Final = "splitserve-sim"
STEP_MS: Final = float(os.environ.get("BENCH_FAKE_STEP_MS", "0.06"))
SEQ_MS: Final = float(os.environ.get("BENCH_FAKE_SEQ_MS", "0.035"))
"""The defaults of `--step-ms` and `--seq-ms`, chosen so that the router does about the same work
per request as with the sim workers (docs/benchmarks.md "Fourteenth pass", fairness check); the
environment variables set them for a whole bench run (the workers inherit them)."""

_OK = worker_pb2.MuxStatus(code=grpc.StatusCode.OK.value[0])
_ROLES = {"prefill": common_pb2.ROLE_PREFILL, "decode": common_pb2.ROLE_DECODE}
_LENGTH = common_pb2.FINISH_REASON_LENGTH
_STOP = common_pb2.FINISH_REASON_STOP
_UNFINISHED = common_pb2.FINISH_REASON_UNSPECIFIED


class _Seq:
    """One decode (or generate) sub-request."""

    __slots__ = ("conn", "ctx", "end", "index", "key", "n_prompt", "request_id", "sid", "stops")

    def __init__(
        self, conn: _Conn, sid: int, req: Any, key: int, start: int, max_tokens: int
    ) -> None:
        self.conn = conn
        self.sid = sid
        self.request_id = req.request_id
        self.n_prompt = len(req.prompt_token_ids)
        self.key = key
        self.index = start
        """The next token's index in the output (0 is the prefill's first token)."""
        self.end = max_tokens
        self.ctx = self.n_prompt + start
        self.stops = frozenset(req.sampling.stop_token_ids)


class FakeEngine:
    """The step loop of one worker process, shared by its link connections."""

    def __init__(self, role: str, step_s: float = 0.0, seq_s: float = 0.0) -> None:
        self.role = _ROLES[role]
        self.step_s = step_s
        self.seq_s = seq_s
        """The wall time of a step (`step_s` plus `seq_s` per sequence in it), slept with the
        event loop blocked (as a step of the sim engine blocks it while it computes) but without
        using the CPU."""
        self.tokens = SyntheticTokens(VOCAB_SIZE, FIRST_TOKEN_ID)
        self.address = ""
        self.link_port = 0
        self.prefills: list[tuple[_Conn, int, Any, float]] = []
        self.running: list[_Seq] = []
        self.parked: dict[tuple[_Conn, int], _Seq] = {}
        """Decodes sent with kv_follows, waiting for their `decode_kv`."""
        self.step_feeds: set[tuple[_Conn, int]] = set()
        self.load_feeds: dict[tuple[_Conn, int], asyncio.TimerHandle] = {}
        self.index = 0
        self.seq = 0
        self._scheduled = False
        self._keys: dict[tuple[tuple[int, ...], int], int] = {}

    # -- ops -----------------------------------------------------------------------------------

    def op(self, conn: _Conn, op: worker_pb2.MuxOp) -> None:
        sid = op.stream_id
        which = op.WhichOneof("op")
        if which == "prefill":
            if self.role != common_pb2.ROLE_PREFILL:
                self._refuse(conn, sid, "this fake worker does not prefill")
                return
            self.prefills.append((conn, sid, op.prefill, time.monotonic()))
            self._kick()
        elif which in ("decode", "generate"):
            if self.role != common_pb2.ROLE_DECODE:
                self._refuse(conn, sid, "this fake worker does not decode")
                return
            req = op.decode if which == "decode" else op.generate
            max_tokens = req.sampling.max_tokens
            start = 1 if which == "decode" else 0
            if max_tokens <= start:
                self._refuse(conn, sid, "nothing to decode")
                return
            seq = _Seq(conn, sid, req, self._key(req), start, max_tokens)
            if which == "decode" and op.decode.kv_follows:
                self.parked[(conn, sid)] = seq
            else:
                self.running.append(seq)
                self._kick()
        elif which == "decode_kv":
            parked = self.parked.pop((conn, sid), None)
            if parked is not None:
                self.running.append(parked)
                self._kick()
        elif which == "cancel":
            self._cancel(conn, sid)
        elif which == "watch_load":
            interval_s = op.watch_load.interval_s or 0.1
            self._report(conn, sid, interval_s)
        elif which == "watch_step_batches":
            self.step_feeds.add((conn, sid))
        else:
            self._refuse(conn, sid, f"mux op with {'no operation' if which is None else which}")

    def _refuse(self, conn: _Conn, sid: int, details: str) -> None:
        status = worker_pb2.MuxStatus(
            code=grpc.StatusCode.INVALID_ARGUMENT.value[0], details=details
        )
        conn.emit(worker_pb2.MuxEvent(stream_id=sid, status=status))

    def _cancel(self, conn: _Conn, sid: int) -> None:
        key = (conn, sid)
        self.parked.pop(key, None)
        self.step_feeds.discard(key)
        timer = self.load_feeds.pop(key, None)
        if timer is not None:
            timer.cancel()
        self.running = [s for s in self.running if s.conn is not conn or s.sid != sid]
        self.prefills = [p for p in self.prefills if p[0] is not conn or p[1] != sid]

    def drop(self, conn: _Conn) -> None:
        """A connection closed: its sub-requests end (as `worker.link` cancels them)."""
        self.parked = {k: v for k, v in self.parked.items() if k[0] is not conn}
        self.step_feeds = {k for k in self.step_feeds if k[0] is not conn}
        for key in [k for k in self.load_feeds if k[0] is conn]:
            self.load_feeds.pop(key).cancel()
        self.running = [s for s in self.running if s.conn is not conn]
        self.prefills = [p for p in self.prefills if p[0] is not conn]

    def _key(self, req: Any) -> int:
        """`SyntheticTokens.key` of the prompt and seed, cached (every request of a bench run
        has the same prompt)."""
        k = (tuple(req.prompt_token_ids), req.sampling.seed)
        key = self._keys.get(k)
        if key is None:
            if len(self._keys) > 1024:
                self._keys.clear()
            key = self._keys[k] = self.tokens.key(k[0], k[1])
        return key

    # -- load feed -----------------------------------------------------------------------------

    def report(self) -> common_pb2.LoadReport:
        self.seq += 1
        used = sum(-(-(s.ctx + 1) // KV_BLOCK_SIZE) for s in self.running)
        return common_pb2.LoadReport(
            worker_id=self.address,
            role=self.role,
            num_waiting=len(self.prefills),
            num_running=len(self.running) + len(self.parked),
            kv_blocks_free=max(0, KV_BLOCKS - used),
            kv_blocks_total=KV_BLOCKS,
            kv_block_size=KV_BLOCK_SIZE,
            num_pending_prefill_tokens=sum(len(p[2].prompt_token_ids) for p in self.prefills),
            seq=self.seq,
            engine="sim",
            model=MODEL,
            link_port=self.link_port,
        )

    def _report(self, conn: _Conn, sid: int, interval_s: float) -> None:
        if conn.closed:
            return
        conn.emit(worker_pb2.MuxEvent(stream_id=sid, load=self.report()))
        conn.flush()
        loop = asyncio.get_running_loop()
        self.load_feeds[(conn, sid)] = loop.call_later(
            interval_s, self._report, conn, sid, interval_s
        )

    # -- the step loop -------------------------------------------------------------------------

    def _kick(self) -> None:
        if self._scheduled:
            return
        self._scheduled = True
        asyncio.get_running_loop().call_soon(self._step)

    def _step(self) -> None:
        """One engine step (`step_s` + `seq_s` per sequence long), its frames written; the next
        at the loop's next turn (after the connections' reads) while there is work."""
        self._scheduled = False
        start = time.monotonic()
        wall_s = self.step_s + self.seq_s * (len(self.prefills) + len(self.running))
        if wall_s > 0:
            time.sleep(wall_s)
        self.index += 1
        sample = worker_pb2.StepSample(index=self.index, start_s=start)
        touched: set[_Conn] = set()
        if self.prefills:
            batch, self.prefills = self.prefills, []
            tokens = self.tokens
            for conn, sid, req, arrived in batch:
                n = len(req.prompt_token_ids)
                resp = worker_pb2.PrefillResponse(
                    request_id=req.request_id,
                    first_token_id=tokens.token(self._key(req), 0),
                    num_prompt_tokens=n,
                    queue_s=start - arrived,
                    prefill_s=max(1e-6, time.monotonic() - start),
                )
                kv = resp.kv
                kv.transport = "sim"
                kv.source_address = self.address
                kv.source_request_id = req.request_id
                kv.num_tokens = n
                kv.num_bytes = n * KV_BYTES_PER_TOKEN
                conn.emit(worker_pb2.MuxEvent(stream_id=sid, prefill=resp))
                conn.emit(worker_pb2.MuxEvent(stream_id=sid, status=_OK))
                sample.prefill_chunks.add(new_tokens=n, context_tokens=0)
                touched.add(conn)
            sample.num_seqs = len(batch)
        elif self.running:
            left: list[_Seq] = []
            token = self.tokens.token
            contexts = sample.decode_context_tokens
            for seq in self.running:
                contexts.append(seq.ctx)
                tok = token(seq.key, seq.index)
                seq.index += 1
                seq.ctx += 1
                reason = (
                    _STOP if tok in seq.stops else _LENGTH if seq.index >= seq.end else _UNFINISHED
                )
                chunk = common_pb2.TokenChunk(
                    request_id=seq.request_id,
                    token_ids=(tok,),
                    finish_reason=reason,
                    num_prompt_tokens=seq.n_prompt,
                )
                seq.conn.emit_chunk(seq.sid, chunk)
                if reason == _UNFINISHED:
                    left.append(seq)
                else:
                    seq.conn.emit(worker_pb2.MuxEvent(stream_id=seq.sid, status=_OK))
                touched.add(seq.conn)
            sample.num_seqs = len(self.running)
            self.running = left
        else:
            return
        for conn in touched:
            conn.flush()
        if self.step_feeds:
            # The sim worker's step feed is its own task, woken by the step: its samples mostly
            # leave in a message of their own, after the step's tokens (as here, a loop turn
            # later; measured by the fairness check).
            asyncio.get_running_loop().call_soon(self._feed_steps, sample)
        if self.prefills or self.running:
            self._kick()

    def _feed_steps(self, sample: worker_pb2.StepSample) -> None:
        touched: set[_Conn] = set()
        for conn, sid in self.step_feeds:
            conn.emit_step(sid, sample)
            touched.add(conn)
        for conn in touched:
            conn.flush()


class _Conn(asyncio.Protocol):
    """One link connection (a router's `StreamLink`)."""

    def __init__(self, engine: FakeEngine) -> None:
        self.engine = engine
        self.frames = FrameSplitter()
        self.transport: asyncio.Transport | None = None
        self.pending: list[worker_pb2.MuxEvent] = []
        self.open_chunks: dict[int, common_pb2.TokenChunk] = {}
        self.open_steps: dict[int, worker_pb2.StepSampleBatch] = {}
        self.paused = False
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = tr = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        sock = tr.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        tr.set_write_buffer_limits(high=WRITE_BUFFER_BYTES)

    def data_received(self, data: bytes) -> None:
        try:
            payloads = self.frames.feed(data)
        except FrameError:
            assert self.transport is not None
            self.transport.close()
            return
        for payload in payloads:
            for op in worker_pb2.MuxRequest.FromString(payload).ops:
                self.engine.op(self, op)
        self.flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.engine.drop(self)

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        self.flush()

    def emit(self, event: worker_pb2.MuxEvent) -> None:
        self.pending.append(event)

    def emit_chunk(self, sid: int, chunk: common_pb2.TokenChunk) -> None:
        prev = self.open_chunks.get(sid)
        if prev is not None:  # waiting for the same frame: joined, as `worker.mux.merge_into`
            prev.token_ids.extend(chunk.token_ids)
            prev.finish_reason = chunk.finish_reason
            if chunk.finish_reason != _UNFINISHED:
                del self.open_chunks[sid]
            return
        ev = worker_pb2.MuxEvent(stream_id=sid, chunk=chunk)
        self.pending.append(ev)
        if chunk.finish_reason == _UNFINISHED:
            self.open_chunks[sid] = ev.chunk

    def emit_step(self, sid: int, sample: worker_pb2.StepSample) -> None:
        prev = self.open_steps.get(sid)
        if prev is not None:
            prev.samples.append(sample)
            return
        ev = worker_pb2.MuxEvent(stream_id=sid, steps=worker_pb2.StepSampleBatch(samples=[sample]))
        self.pending.append(ev)
        self.open_steps[sid] = ev.steps

    def flush(self) -> None:
        """One frame of what is ready, unless the transport holds more than
        `WRITE_BUFFER_BYTES` (then it goes when the transport drains: `resume_writing`)."""
        if not self.pending or self.paused or self.closed or self.transport is None:
            return
        batch, self.pending = self.pending, []
        self.open_chunks.clear()
        self.open_steps.clear()
        self.transport.write(frame(worker_pb2.MuxResponse(events=batch).SerializeToString()))


class _Servicer(worker_pb2_grpc.WorkerServicer):
    """`WatchLoad` only: the router's first report comes over gRPC and names the link's port."""

    def __init__(self, engine: FakeEngine) -> None:
        self.engine = engine

    async def WatchLoad(  # noqa: N802
        self, request: worker_pb2.WatchLoadRequest, context: Any
    ) -> AsyncIterator[common_pb2.LoadReport]:
        interval_s = request.interval_s or 0.1
        while True:
            yield self.engine.report()
            await asyncio.sleep(interval_s)


async def serve(role: str, ready_file: Path, step_s: float = 0.0, seq_s: float = 0.0) -> None:
    engine = FakeEngine(role, step_s, seq_s)
    loop = asyncio.get_running_loop()
    link = await loop.create_server(lambda: _Conn(engine), "127.0.0.1", 0)
    engine.link_port = int(link.sockets[0].getsockname()[1])
    server = aio.server()
    # The generated base class answers UNIMPLEMENTED to every method not defined here (what the
    # router gets, e.g. for WorkerKv, from a sim worker); its stubs declare them abstract.
    servicer = _Servicer(engine)  # type: ignore[abstract]
    worker_pb2_grpc.add_WorkerServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    engine.address = f"127.0.0.1:{port}"
    announce(ready_file, engine.address)
    await server.wait_for_termination()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--role", choices=sorted(_ROLES), required=True)
    parser.add_argument("--ready-file", type=Path, required=True)
    parser.add_argument(
        "--step-ms",
        type=float,
        default=STEP_MS,
        help="the wall time of one engine step, slept (no CPU) with the loop blocked",
    )
    parser.add_argument(
        "--seq-ms",
        type=float,
        default=SEQ_MS,
        help="more wall time of a step per sequence in it (slept likewise)",
    )
    args = parser.parse_args()
    for name in ("step_ms", "seq_ms"):
        if not getattr(args, name) >= 0:
            parser.error(f"--{name.replace('_', '-')} must be >= 0, got {getattr(args, name)}")
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.role, args.ready_file, args.step_ms / 1e3, args.seq_ms / 1e3))


if __name__ == "__main__":
    main()
