"""One multiplexed gRPC stream per worker (`Worker.Multiplex`) instead of a call per request.

A `grpc.aio` call costs the router a set-up, a task, a read per message through the
completion-queue poller thread and a loop wake-up, and trailers at the end. Over one long-lived
`Multiplex` stream per worker, a request is a `MuxOp` on the stream and its events arrive in
`MuxResponse` messages that carry whatever every sub-request had ready: at load, one read serves
many requests.

`MuxLink.stream` and `MuxLink.prefill` look to the dispatcher like the calls they replace
(`read()` giving `TokenChunk`s then `aio.EOF`, `cancel()`; errors as `aio.AioRpcError` with the
code the worker's handler ended with), including the call's deadline (a timer here; on expiry
the sub-request is cancelled on the worker and the reader gets DEADLINE_EXCEEDED). When the
stream breaks (the worker went away), every open sub-request fails with the stream's error, as
its own call would have; the next request opens a new stream. A worker that does not serve
`Multiplex` (UNIMPLEMENTED: an older worker, a test fake) is remembered as such and its requests
go through the per-request calls, including those already waiting on the link: nothing had
reached the worker.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import socket
import ssl
from collections.abc import Callable, Sequence
from typing import Any, Final

import grpc
from grpc import aio

from splitserve._gen.v1 import common_pb2, worker_pb2, worker_pb2_grpc
from splitserve.core.channels import FAST_RECONNECT_OPTIONS
from splitserve.core.frames import FrameSplitter, frame
from splitserve.security import tls

log = logging.getLogger(__name__)

Metadata = Sequence[tuple[str, str]] | None
_OK: Final = grpc.StatusCode.OK.value[0]
MUX_HEADER: Final = "splitserve-mux"
"""The header a worker sends first on a `Multiplex` stream it serves."""
_CODES: Final = {c.value[0]: c for c in grpc.StatusCode}


LINK_WINDOW_BYTES: Final = 2048
"""The default HTTP/2 receive window of a worker stream (`PoolSettings.link_window_bytes`)."""


def worker_channel_options(window_bytes: int = LINK_WINDOW_BYTES) -> tuple[tuple[str, int], ...]:
    """The router's channel options to a worker for a fixed receive window of `window_bytes`
    (0: gRPC's default growing window, only the fast-reconnect options)."""
    if window_bytes < 0:
        raise ValueError(f"link window must be >= 0 bytes, got {window_bytes}")
    if window_bytes == 0:
        return FAST_RECONNECT_OPTIONS
    return (
        *FAST_RECONNECT_OPTIONS,
        ("grpc.http2.bdp_probe", 0),
        ("grpc.http2.lookahead_bytes", window_bytes),
    )


WORKER_CHANNEL_OPTIONS: Final[tuple[tuple[str, int], ...]] = worker_channel_options()
"""The options of the router's channel to each worker (`pool_view.PoolView.add`), by default.

They keep HTTP/2's receive window per stream small and fixed (`LINK_WINDOW_BYTES`; gRPC's
bandwidth-delay probe would grow it to megabytes on loopback). That makes the `Multiplex` stream
coalesce tokens when the router reads behind, with no timer: the worker's `mux.serve` writes the
next `MuxResponse` when the previous write completes, and a write completes only while the window
is open, i.e. once the router has read what came before. A router that keeps up sees no
difference (the window does not fill: the first token and every token are sent at once); a busy
router gets fewer, fuller messages (several tokens of a request in one chunk, `merge_into` on the
worker, handled with one detokenize step and one SSE write: `fast_lane`), where a large window
let every token through as a message of its own for the router to read later (issue 17,
`docs/benchmarks.md` "Eleventh pass"). Cost: at most the window in flight per worker stream per
round trip (~2 KiB: ~10 MB/s at a 0.2 ms in-cluster round trip, ~40 KB/s at 50 ms; a token event
is ~10-30 bytes), so a router far from its workers would want it larger."""


def _error(code: grpc.StatusCode, details: str) -> aio.AioRpcError:
    return aio.AioRpcError(code, aio.Metadata(), aio.Metadata(), details=details)


class _Unsupported(Exception):  # noqa: N818 - internal signal
    """The worker does not serve `Multiplex`: use the per-request call."""


class MuxStream:
    """One sub-request of a link, read like `aio.UnaryStreamCall` (or awaited, for a prefill)."""

    __slots__ = (
        "_call",
        "_ended",
        "_error",
        "_fallback",
        "_items",
        "_link",
        "_loop",
        "_sid",
        "_timer",
        "_waiter",
        "deadline",
        "followed",
        "lane",
    )

    def __init__(
        self, link: MuxLink, sid: int, timeout_s: float | None, fallback: Callable[[], Any]
    ) -> None:
        self._link = link
        self._sid = sid
        self._loop = link.loop
        self._items: collections.deque[Any] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None
        self._ended = False
        self._error: BaseException | None = None
        self._fallback: Callable[[], Any] | None = fallback
        self._call: Any = None
        """The per-request call that replaced this sub-request (the worker has no Multiplex)."""
        self.deadline: float | None = None
        self.lane: Any = None
        """A `fast_lane.FastLane` that may handle a chunk in the reader (None: none)."""
        self.followed: worker_pb2.DecodeKv | None = None
        """An early Decode's first token and KV handle, once sent (`follow`)."""
        self._timer: asyncio.TimerHandle | None = None
        if timeout_s is not None:
            self.deadline = due = self._loop.time() + timeout_s
            self._timer = self._loop.call_at(due, self._expire)

    # -- fed by the link ------------------------------------------------------------------------

    def _push(self, item: Any) -> None:
        lane = self.lane
        if lane is not None and not self._items:
            w = self._waiter
            # Only while the request's task is parked in `read` with nothing queued: every
            # level of its chain is then where it is before its next chunk (`fast_lane`).
            if w is not None and not w.done():
                first = not lane.held
                if lane.offer(self, item):
                    if first:
                        self._link._held.append(self)  # flushed at the end of the message
                    return
        self._items.append(item)
        self._wake()

    def _flush_lane(self) -> None:
        """The fast lane's tokens of the message just read: detokenized, written."""
        lane = self.lane
        if lane is None:
            return
        items = self._items
        if items and lane.held:
            # The request's task wakes anyway: a chunk the lane did not take (the last one, as
            # a rule) is queued behind the tokens it took from the same read. The tokens go
            # back in front of it, where the lane found the queue empty, so the task's merged
            # read (`_merge`) handles them with it: one event and one write instead of a lane
            # write and a task write. What the task then does is what it does with the lane off.
            items.appendleft(_TokenChunk(token_ids=lane.held))
            lane.held.clear()
            return
        try:
            lane.flush()
        except Exception as err:  # the reader serves every request: fail this one alone
            log.exception("the fast lane of a %s sub-request failed", self._link.name)
            lane.held.clear()
            self.lane = None
            if not self._ended:
                self._link._cancel(self._sid)
            # Also when the stream had ended (its last chunk queued): the request fails rather
            # than finish without the text of the tokens taken.
            self._items.clear()
            self._end(err)
            self._error = err

    def _end(self, error: BaseException | None) -> None:
        if self._ended:
            return
        self._ended = True
        self._error = error
        if not isinstance(error, _Unsupported):
            # Only an unsupported link reads the fallback; it closes over this stream (a cycle
            # that would leave the request's objects to the garbage collector).
            self._fallback = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._wake()

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    def _expire(self) -> None:
        self._timer = None
        if not self._ended:
            self._link._cancel(self._sid)
            self._end(_error(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"))

    # -- the caller's side ----------------------------------------------------------------------

    async def read(self) -> Any:
        """The next event (`TokenChunk`, or the `PrefillResponse`), `aio.EOF` at the end."""
        if self._call is not None:
            return await self._call.read()
        items = self._items
        while not items:
            if self._ended:
                err = self._error
                if isinstance(err, _Unsupported):
                    fallback, self._fallback = self._fallback, None
                    assert fallback is not None
                    self._call = fallback()
                    return await self._call.read()
                if err is not None:
                    raise err
                return aio.EOF
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        item = items.popleft()
        if items and type(item) is _TokenChunk:
            _merge(item, items)
        return item

    def cancel(self) -> bool:
        """Stop the sub-request on the worker (nothing if it already ended)."""
        if self._call is not None:
            return bool(self._call.cancel())
        if self._ended:
            return False
        self._link._cancel(self._sid)
        self._end(asyncio.CancelledError())
        return True

    def remaining_s(self) -> float | None:
        return None if self.deadline is None else max(0.0, self.deadline - self._loop.time())

    def refused(self) -> bool:
        """It ended with the worker refusing the request as sent (INVALID_ARGUMENT or
        UNIMPLEMENTED): for an early Decode, a worker that does not take `kv_follows`."""
        err = self._error
        return (
            self._ended
            and isinstance(err, aio.AioRpcError)
            and err.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.UNIMPLEMENTED)
        )

    @property
    def link(self) -> MuxLink:
        return self._link

    def follow(self, decode_kv: worker_pb2.DecodeKv) -> bool:
        """An early Decode's (`MuxLink.early_decode`) first token and KV handle, sent on this
        sub-request. False when it has ended (the worker refused it, went away, or the link
        broke): the caller makes an ordinary Decode call instead."""
        if self._ended and not isinstance(self._error, _Unsupported):
            return False
        self.followed = decode_kv
        if not self._ended:
            self._link._follow(self._sid, decode_kv)
        return True  # (no Multiplex on the worker: `read` makes the whole Decode call)


_TokenChunk: Final = common_pb2.TokenChunk
_UNFINISHED: Final = common_pb2.FINISH_REASON_UNSPECIFIED
_FAILED: Final = frozenset({common_pb2.FINISH_REASON_ERROR, common_pb2.FINISH_REASON_CANCELLED})


def _merge(chunk: common_pb2.TokenChunk, items: collections.deque[Any]) -> None:
    """Append to `chunk` the chunks queued behind it (they arrived while the reader was busy):
    the reader then handles, detokenizes and writes them as one. Nothing waits for them; the
    last one's finish reason carries over. Stops after a finishing chunk and before an error or
    cancelled one (so the tokens ahead of a failure count as emitted, as when read one by one)."""
    while items and chunk.finish_reason == _UNFINISHED:
        nxt = items[0]
        if type(nxt) is not _TokenChunk or nxt.finish_reason in _FAILED:
            return  # an error ends the stream on its own: the tokens before it stay emitted
        items.popleft()
        chunk.token_ids.extend(nxt.token_ids)
        if nxt.logprobs:
            chunk.logprobs.extend(nxt.logprobs)
        chunk.finish_reason = nxt.finish_reason


class _UnaryAsStream:
    """A prefill's per-request call (the fallback) read as a one-message stream."""

    __slots__ = ("_call", "_done")

    def __init__(self, call: Callable[[], Any]) -> None:
        self._call = call
        self._done = False

    async def read(self) -> Any:
        if self._done:
            return aio.EOF
        self._done = True
        return await self._call()

    def cancel(self) -> bool:
        return False  # the awaiting task's cancellation cancels the call


class MuxLink:
    """The `Multiplex` stream to one worker (opened on first use, re-opened after a break)."""

    def __init__(self, stub: worker_pb2_grpc.WorkerAsyncStub, name: str = "") -> None:
        self.stub = stub
        self.name = name
        self.loop = asyncio.get_running_loop()
        self.supported = True
        """False once the worker answered UNIMPLEMENTED: every request uses its own call."""
        self.early_refused = False
        """The worker refused an early Decode (`kv_follows`, an older worker) on the current
        stream: `early_decode` sends none until that stream ends (the worker restarted, maybe
        upgraded; the next stream tries again)."""
        self._call: Any = None
        self._reader: asyncio.Task[None] | None = None
        self._subs: dict[int, MuxStream] = {}
        self._next = 0
        self._pending = worker_pb2.MuxRequest()
        """The ops not written yet (the writer sends them as one message)."""
        self._writer: asyncio.Task[None] | None = None
        self._write_wake = asyncio.Event()
        self._confirmed = False
        """The worker sent something on the current stream: it serves Multiplex."""
        self._held: list[MuxStream] = []
        """Sub-requests whose fast lane took chunks of the message being read."""

    # -- opening sub-requests -------------------------------------------------------------------

    def stream(
        self,
        kind: str,
        msg: worker_pb2.DecodeRequest | worker_pb2.GenerateRequest,
        timeout: float | None,
        metadata: Metadata,
    ) -> MuxStream | aio.UnaryStreamCall:
        """A Decode (`kind` "decode") or Generate sub-request, read like its call."""
        stub = self.stub
        if not self.supported:
            method = stub.Decode if kind == "decode" else stub.Generate
            return method(msg, timeout=timeout, metadata=metadata)
        sub: MuxStream

        def fallback() -> Any:
            method = stub.Decode if kind == "decode" else stub.Generate
            return method(msg, timeout=sub.remaining_s(), metadata=metadata)

        sub = self._open("decode" if kind == "decode" else "generate", msg, timeout, metadata,
                         fallback)  # fmt: skip
        return sub

    def early_decode(
        self, msg: worker_pb2.DecodeRequest, timeout: float | None, metadata: Metadata
    ) -> MuxStream | None:
        """A Decode sent with `kv_follows` before the prefill answers; `MuxStream.follow` sends
        its first token and KV. None when the worker is known not to serve Multiplex."""
        if not self.supported or self.early_refused:
            return None
        stub = self.stub
        sub: MuxStream

        def fallback() -> Any:  # read only after `follow`: the whole Decode as its own call
            whole = worker_pb2.DecodeRequest()
            whole.CopyFrom(msg)
            whole.kv_follows = False
            if sub.followed is not None:
                whole.first_token_id = sub.followed.first_token_id
                whole.kv.CopyFrom(sub.followed.kv)
            return stub.Decode(whole, timeout=sub.remaining_s(), metadata=metadata)

        sub = self._open("decode", msg, timeout, metadata, fallback)
        return sub

    async def prefill(
        self, msg: worker_pb2.PrefillRequest, timeout_s: float | None, metadata: Metadata
    ) -> worker_pb2.PrefillResponse:
        """A Prefill sub-request's answer (errors as its call's)."""
        if not self.supported:
            resp: worker_pb2.PrefillResponse = await self.stub.Prefill(
                msg, timeout=timeout_s, metadata=metadata
            )
            return resp
        sub: MuxStream

        async def unary() -> Any:
            return await self.stub.Prefill(msg, timeout=sub.remaining_s(), metadata=metadata)

        sub = self._open("prefill", msg, timeout_s, metadata, lambda: _UnaryAsStream(unary))
        try:
            resp = await sub.read()
        except asyncio.CancelledError:
            sub.cancel()
            raise
        if resp is aio.EOF:
            raise _error(grpc.StatusCode.INTERNAL, "prefill ended without an answer")
        assert isinstance(resp, worker_pb2.PrefillResponse)
        return resp

    def watch(
        self, kind: str, msg: worker_pb2.WatchLoadRequest | worker_pb2.WatchStepsRequest
    ) -> MuxStream:
        """A feed as a sub-request: `kind` "watch_load" (its `read()` gives `LoadReport`s) or
        "watch_step_batches" (`StepSampleBatch`es); no deadline. It ends as a call would: with
        the worker's status, or UNAVAILABLE when the link breaks (`PoolView`, `LatencyBook`
        then do what a broken gRPC feed makes them do). A worker that predates these ops ends
        it with INVALID_ARGUMENT."""
        if kind not in ("watch_load", "watch_step_batches"):
            raise ValueError(f"not a feed: {kind!r}")
        if not self.supported:
            raise _error(grpc.StatusCode.UNIMPLEMENTED, "the worker does not serve Multiplex")

        def fallback() -> Any:
            raise _error(grpc.StatusCode.UNIMPLEMENTED, "the worker does not serve Multiplex")

        return self._open(kind, msg, None, None, fallback)

    def _open(
        self,
        field: str,
        msg: worker_pb2.PrefillRequest
        | worker_pb2.DecodeRequest
        | worker_pb2.GenerateRequest
        | worker_pb2.WatchLoadRequest
        | worker_pb2.WatchStepsRequest,
        timeout: float | None,
        metadata: Metadata,
        fallback: Callable[[], Any],
    ) -> MuxStream:
        """A sub-request: `msg` goes into the op's `field` (`prefill`, `decode`, `generate`).

        The op is added straight to the next `MuxRequest` and `msg` copied into it once (a
        `MuxOp(prefill=msg)` then `MuxRequest(ops=...)` copied the prompt's ids twice)."""
        self._next += 1
        sid = self._next
        if self._call is None:
            self._start()  # before adding: a (re)start begins with an empty request
        op = self._pending.ops.add()
        op.stream_id = sid
        getattr(op, field).CopyFrom(msg)
        if metadata:
            op.metadata.update(metadata)
        sub = MuxStream(self, sid, timeout, fallback)
        self._subs[sid] = sub
        self._kick()
        return sub

    def _cancel(self, sid: int) -> None:
        if self._subs.pop(sid, None) is not None:
            if self._call is None:
                self._start()
            op = self._pending.ops.add()
            op.stream_id = sid
            op.cancel.SetInParent()
            self._kick()

    def _follow(self, sid: int, decode_kv: worker_pb2.DecodeKv) -> None:
        if sid in self._subs:  # (a broken stream has failed and forgotten its sub-requests)
            op = self._pending.ops.add()
            op.stream_id = sid
            op.decode_kv.CopyFrom(decode_kv)
            self._kick()

    def _kick(self) -> None:
        """Ops are pending: have them written (the writer task sends them as one message)."""
        self._write_wake.set()

    # -- the stream -----------------------------------------------------------------------------

    def _start(self) -> None:
        self._call = self.stub.Multiplex()
        self._confirmed = False
        self._write_wake = asyncio.Event()  # the writer of a broken stream may still hold its own
        self._writer = asyncio.create_task(self._write(self._call), name=f"mux-write {self.name}")
        self._reader = asyncio.create_task(self._read(self._call), name=f"mux-read {self.name}")

    async def _write(self, call: Any) -> None:
        wake = self._write_wake
        try:
            # Nothing is written before the worker's headers say it serves Multiplex: a write
            # racing an UNIMPLEMENTED answer turns the call's status into INTERNAL.
            headers = await call.initial_metadata()
            if not any(k == MUX_HEADER for k, _ in headers or ()):
                await call.code()  # not ours: wait for its end, which the reader reports
                return
            while call is self._call:
                await wake.wait()
                wake.clear()
                if self._pending.ops and call is self._call:
                    pending, self._pending = self._pending, worker_pb2.MuxRequest()
                    await call.write(pending)
        except (aio.AioRpcError, aio.UsageError, asyncio.InvalidStateError) as err:
            log.debug("mux write to %s failed: %s", self.name, err)  # the reader reports it

    async def _read(self, call: Any) -> None:
        error: BaseException
        try:
            while True:
                msg = await call.read()
                if msg is aio.EOF:
                    error = _error(grpc.StatusCode.UNAVAILABLE, "the worker closed the stream")
                    break
                self._confirmed = True
                self._handle(msg.events, self._subs)
                if self._held:
                    self._flush_held()
        except aio.AioRpcError as err:
            error = err
            if err.code() == grpc.StatusCode.UNIMPLEMENTED and not self._confirmed:
                log.info("worker %s does not serve Multiplex: one call per request", self.name)
                self.supported = False
                error = _Unsupported()
        except asyncio.CancelledError:
            error = _error(grpc.StatusCode.CANCELLED, "the router closed the stream")
            self._fail(call, error)
            raise
        self._fail(call, error)

    @staticmethod
    def _handle(events: Sequence[worker_pb2.MuxEvent], subs: dict[int, MuxStream]) -> None:
        """One `MuxResponse`'s events to their sub-requests (`_flush_held` after)."""
        for ev in events:
            sub = subs.get(ev.stream_id)
            if sub is None:
                continue  # cancelled here meanwhile
            which = ev.WhichOneof("event")
            if which == "chunk":
                sub._push(ev.chunk)
            elif which == "prefill":
                sub._push(ev.prefill)
            elif which == "load":
                sub._push(ev.load)
            elif which == "steps":
                sub._push(ev.steps)
            elif which == "status":
                del subs[ev.stream_id]
                code = ev.status.code
                sub._end(
                    None
                    if code == _OK
                    else _error(_CODES.get(code, grpc.StatusCode.UNKNOWN), ev.status.details)
                )

    def _flush_held(self) -> None:
        """The fast lanes that took chunks of what was just read: detokenized, written."""
        held = self._held
        for sub in held:
            sub._flush_lane()
        held.clear()

    def _fail(self, call: Any, error: BaseException) -> None:
        """The stream is gone: every open sub-request ends with `error`; the next opens anew."""
        if call is not self._call:
            return
        self._call = None
        self.early_refused = False  # the next stream may reach a new (upgraded) worker
        self._pending = worker_pb2.MuxRequest()
        self._held.clear()
        self._write_wake.set()  # lets the writer see the call is gone
        subs, self._subs = self._subs, {}
        if subs and not isinstance(error, _Unsupported):
            log.warning(
                "mux stream to %s broke (%d requests open): %s", self.name, len(subs), error
            )
        for sub in subs.values():
            sub._end(error)
        with contextlib.suppress(Exception):
            call.cancel()

    async def close(self) -> None:
        call, self._call = self._call, None
        if call is not None:
            call.cancel()
        for task in (self._reader, self._writer):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        subs, self._subs = self._subs, {}
        for sub in subs.values():
            sub._end(_error(grpc.StatusCode.CANCELLED, "the router closed the stream"))


LINK_CONNECT_TIMEOUT_S: Final = 5.0
"""How long a stream link may take to connect (TCP and TLS) before its requests fail with
UNAVAILABLE (a port a firewall drops would otherwise hold them for the kernel's minutes)."""


class StreamLink(MuxLink):
    """The same link over the worker's stream link (`worker.link`): the `Multiplex` messages
    length-prefixed on a plain TCP socket (TLS with this process's identity once configured,
    checked as the gRPC channel checks the worker), no `grpc.aio` (`pool.link: stream`).

    Reading is an `asyncio.Protocol`: `data_received` splits the bytes into frames and hands
    each `MuxResponse`'s events to the sub-streams at once (the fast lane takes a parked
    request's chunks there); the fast lanes are flushed once per `data_received`, so the frames
    that arrived together (the router was behind: they waited in the socket) are handled,
    detokenized and written as one per request, and a request whose task reads queued chunks
    gets them merged (`_merge`). So the link coalesces on the router's side, with no window:
    unlike a `grpc.aio` message, a frame read costs no thread hand-off and no task wake, only its
    parse. (A small socket receive buffer, the gRPC link's small window's counterpart, was tried
    and dropped: the worker then waits for the router's delayed ACKs, and c=32 throughput fell
    by half; docs/benchmarks.md "Twelfth pass".) Writing: the ops opened in one loop turn leave as
    one frame (a `call_soon`, no writer task). Flow control: reading is never paused (a frame is
    handled as it arrives, into the same unbounded sub-stream queues as the gRPC link's), and
    op writes are not held back when the worker reads slowly (the gRPC link awaited each write):
    they wait in the transport, bounded by the requests in flight.

    Failures look like the gRPC link's: the connection refused or lost ends every open
    sub-request with UNAVAILABLE (the dispatcher's retry / fallback rules apply as to a broken
    stream); a refused caller (the worker's role check) ends them with the worker's
    PERMISSION_DENIED; a deadline or a cancel sends a `MuxCancel`; the next request opens a new
    connection. Requests never fall back to per-request gRPC calls (the worker advertised the
    link)."""

    def __init__(self, stub: worker_pb2_grpc.WorkerAsyncStub, name: str, port: int) -> None:
        super().__init__(stub, name)
        host = name.rpartition(":")[0] if ":" in name else name
        self.host = host[1:-1] if host.startswith("[") else host  # [v6]:port
        self.port = port
        self._flush_soon: asyncio.Handle | None = None

    def _kick(self) -> None:
        if self._flush_soon is None:
            self._flush_soon = self.loop.call_soon(self._write_pending)

    def _write_pending(self) -> None:
        self._flush_soon = None
        proto = self._call
        if not isinstance(proto, _LinkProtocol) or proto.transport is None:
            return  # not connected yet: written on connection
        if self._pending.ops:
            pending, self._pending = self._pending, worker_pb2.MuxRequest()
            proto.transport.write(frame(pending.SerializeToString()))

    def _start(self) -> None:
        proto = _LinkProtocol(self)
        self._call = proto
        self._confirmed = False
        self._reader = self.loop.create_task(self._connect(proto), name=f"link {self.name}")

    async def _connect(self, proto: _LinkProtocol) -> None:
        try:
            async with asyncio.timeout(LINK_CONNECT_TIMEOUT_S):
                sock = socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET)
                try:
                    sock.setblocking(False)
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    await self.loop.sock_connect(sock, (self.host, self.port))
                except BaseException:
                    sock.close()
                    raise
                ssl_ctx = tls.link_client_ssl()
                await self.loop.create_connection(
                    lambda: proto,
                    sock=sock,
                    ssl=ssl_ctx,
                    server_hostname=tls.LINK_SERVER_NAME if ssl_ctx is not None else None,
                )
        except asyncio.CancelledError:
            self._fail(proto, _error(grpc.StatusCode.CANCELLED, "the router closed the link"))
            raise
        except (OSError, ssl.SSLError) as err:
            self._fail(
                proto,
                _error(
                    grpc.StatusCode.UNAVAILABLE,
                    f"stream link to {self.host}:{self.port}: {type(err).__name__}: {err}",
                ),
            )

    def _connected(self, proto: _LinkProtocol) -> None:
        if proto is self._call:
            self._write_pending()

    def _received(self, proto: _LinkProtocol, data: bytes) -> None:
        if proto is not self._call:
            return
        try:
            payloads = proto.frames.feed(data)
            for payload in payloads:
                events = worker_pb2.MuxResponse.FromString(payload).events
                if events and events[0].stream_id == 0 and events[0].HasField("status"):
                    st = events[0].status  # the worker refused the connection itself
                    code = _CODES.get(st.code, grpc.StatusCode.UNKNOWN)
                    self._fail(proto, _error(code, st.details))
                    return
                self._confirmed = True
                self._handle(events, self._subs)
        except Exception as err:
            log.exception("stream link from %s sent what could not be read", self.name)
            self._fail(proto, _error(grpc.StatusCode.INTERNAL, f"stream link: {err}"))
        finally:
            if self._held:
                self._flush_held()

    def _lost(self, proto: _LinkProtocol, exc: BaseException | None) -> None:
        why = "the worker closed the link" if exc is None else f"the link broke: {exc}"
        self._fail(proto, _error(grpc.StatusCode.UNAVAILABLE, why))

    async def close(self) -> None:
        if self._flush_soon is not None:
            self._flush_soon.cancel()
            self._flush_soon = None
        await super().close()


class _LinkProtocol(asyncio.Protocol):
    """One connection of a `StreamLink` (the link's `_call`: `cancel()` closes it)."""

    def __init__(self, link: StreamLink) -> None:
        self.link = link
        self.frames = FrameSplitter()
        self.transport: Any = None
        """The connection's transport (an `asyncio.Transport`, or uvloop's, which is not one)."""
        self.closed = False

    def connection_made(self, transport: Any) -> None:
        if self.closed:
            transport.abort()
            return
        self.transport = transport
        self.link._connected(self)

    def data_received(self, data: bytes) -> None:
        self.link._received(self, data)

    def eof_received(self) -> bool:
        return False  # the worker closed: close our side too (connection_lost reports it)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.link._lost(self, exc)

    def cancel(self) -> bool:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()
        return True


class MuxLinks:
    """A link per worker endpoint, re-made when the endpoint's stub (or stream-link port)
    changes. `mode` is `pool.link`: "stream" uses a `StreamLink` to workers that advertise a
    port, "grpc" (or a worker without one) the gRPC `Multiplex` stream."""

    def __init__(self, mode: str = "grpc") -> None:
        if mode not in ("grpc", "stream"):
            raise ValueError(f"pool.link must be 'grpc' or 'stream', got {mode!r}")
        self.mode = mode
        self._links: dict[str, MuxLink] = {}

    def get(self, eid: str, stub: Any, link_port: int = 0) -> MuxLink | None:
        """The link to `eid` through `stub` (or its stream link on `link_port`, 0: none); None
        for stubs without `Multiplex` (HTTP backends)."""
        if not hasattr(stub, "Multiplex"):
            return None
        port = link_port if self.mode == "stream" else 0
        link = self._links.get(eid)
        if link is None or link.stub is not stub or getattr(link, "port", 0) != port:
            if link is not None:
                old = link
                asyncio.get_running_loop().create_task(old.close())
            link = self._links[eid] = StreamLink(stub, eid, port) if port else MuxLink(stub, eid)
        return link

    async def close(self) -> None:
        links, self._links = self._links, {}
        for link in links.values():
            await link.close()
