"""The stream link (`pool.link: stream`): `router.mux.StreamLink` against the worker's
`worker.link` listener over a real socket, the worker's own `mux.serve` over a fake service whose
Decode yields chunks when the test says so. No timing: steps are ordered by events.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc import aio
from pydantic import ValidationError

from splitserve._gen.v1 import common_pb2, worker_pb2
from splitserve.api.router import PoolSettings
from splitserve.core.frames import MAX_FRAME_BYTES, FrameError, FrameSplitter, frame
from splitserve.router.mux import MuxLink, MuxLinks, MuxStream, StreamLink
from splitserve.security import tls
from splitserve.security.ca import local_pki
from splitserve.worker import link as worker_link


class _Service:
    """What `mux.serve` calls: Decodes whose chunks the test releases, per request id."""

    def __init__(self) -> None:
        self.queues: dict[str, asyncio.Queue[list[int] | None]] = {}
        self.emitted = 0
        self.cancelled: list[str] = []
        self.started = asyncio.Event()
        self.gone = asyncio.Event()
        """A Decode was cancelled."""
        self.yielded = asyncio.Event()
        """A Decode yielded a chunk (the test clears it)."""
        self.owners: list[object] = []

    def queue(self, rid: str) -> asyncio.Queue[list[int] | None]:
        return self.queues.setdefault(rid, asyncio.Queue())

    async def Decode(  # noqa: N802
        self, req: worker_pb2.DecodeRequest, ctx: Any
    ) -> AsyncIterator[common_pb2.TokenChunk]:
        self.owners.append(tls.peer(ctx))
        q = self.queue(req.request_id)
        self.started.set()
        try:
            while (ids := await q.get()) is not None:
                yield common_pb2.TokenChunk(token_ids=ids)
                self.emitted += 1
                self.yielded.set()
        except asyncio.CancelledError:
            self.cancelled.append(req.request_id)
            self.gone.set()
            raise
        yield common_pb2.TokenChunk(finish_reason=common_pb2.FINISH_REASON_LENGTH)


async def _read_all(sub: MuxStream | Any) -> list[int]:
    ids: list[int] = []
    while (chunk := await sub.read()) is not aio.EOF:
        ids.extend(chunk.token_ids)
    return ids


def _decode(rid: str) -> worker_pb2.DecodeRequest:
    return worker_pb2.DecodeRequest(request_id=rid)


async def _serve(service: _Service) -> tuple[asyncio.Server, int]:
    return await worker_link.start(service, "127.0.0.1", 0)  # type: ignore[arg-type]


class _NoCalls:
    """The gRPC stub beside the link: a stream link never falls back to it."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the stream link called {name} over gRPC")


def _link(port: int) -> StreamLink:
    # the endpoint id is the gRPC address; the link takes its host and the advertised port
    return StreamLink(_NoCalls(), f"127.0.0.1:{port - 1}", port)  # type: ignore[arg-type]


# -- framing -------------------------------------------------------------------------------------


def test_frames_split_across_any_pieces() -> None:
    payloads = [b"", b"a", bytes(range(256)) * 40, b"xyz"]
    wire = b"".join(frame(p) for p in payloads)
    for step in (1, 3, 7, len(wire)):
        frames = FrameSplitter()
        out: list[bytes] = []
        for i in range(0, len(wire), step):
            out += frames.feed(wire[i : i + step])
        assert out == payloads
        assert frames.buffered == 0


def test_an_oversized_frame_is_refused() -> None:
    with pytest.raises(FrameError):
        FrameSplitter().feed((MAX_FRAME_BYTES + 1).to_bytes(4, "big"))


def test_the_setting_is_checked() -> None:
    assert PoolSettings().link == "stream"
    assert PoolSettings(link="grpc").link == "grpc"
    with pytest.raises(ValidationError, match="link"):
        PoolSettings(link="tcp")
    with pytest.raises(ValueError, match=r"pool\.link"):
        MuxLinks("tcp")


async def test_links_pick_the_stream_only_where_a_port_is_advertised() -> None:
    class Stub:
        Multiplex = None

    stub = Stub()
    grpc_links, stream_links = MuxLinks("grpc"), MuxLinks("stream")
    assert type(grpc_links.get("h:1", stub, 5)) is MuxLink
    assert type(stream_links.get("h:1", stub, 0)) is MuxLink
    link = stream_links.get("h:1", stub, 5)
    assert isinstance(link, StreamLink)
    assert (link.host, link.port) == ("h", 5)
    assert stream_links.get("h:1", stub, 5) is link
    assert stream_links.get("h:1", stub, 6) is not link  # the worker restarted on another port
    await grpc_links.close()
    await stream_links.close()


# -- over a real socket --------------------------------------------------------------------------


async def test_many_interleaved_sub_streams_each_get_their_tokens_in_order() -> None:
    service = _Service()
    server, port = await _serve(service)
    link = _link(port)
    n = 20
    subs = [link.stream("decode", _decode(f"r{i}"), None, None) for i in range(n)]
    readers = [asyncio.create_task(_read_all(s)) for s in subs]
    for k in range(5):
        for i in range(n):
            service.queue(f"r{i}").put_nowait([i * 100 + k])
        await asyncio.sleep(0)
    for i in range(n):
        service.queue(f"r{i}").put_nowait(None)
    got = await asyncio.gather(*readers)
    assert got == [[i * 100 + k for k in range(5)] for i in range(n)]
    # and a prefill-less second round on the same connection
    sub = link.stream("decode", _decode("again"), None, None)
    service.queue("again").put_nowait([7])
    service.queue("again").put_nowait(None)
    assert await _read_all(sub) == [7]
    await link.close()
    server.close()


async def test_cancel_reaches_the_worker() -> None:
    service = _Service()
    server, port = await _serve(service)
    link = _link(port)
    sub = link.stream("decode", _decode("c"), None, None)
    service.queue("c").put_nowait([1])
    assert list((await sub.read()).token_ids) == [1]
    assert sub.cancel()
    await service.gone.wait()
    assert service.cancelled == ["c"]
    await link.close()
    server.close()


async def test_the_router_closing_the_link_cancels_the_worker_side() -> None:
    service = _Service()
    server, port = await _serve(service)
    link = _link(port)
    sub = link.stream("decode", _decode("z"), None, None)
    service.queue("z").put_nowait([1])
    assert list((await sub.read()).token_ids) == [1]
    await link.close()  # the connection goes; no MuxCancel is sent
    await service.gone.wait()
    assert service.cancelled == ["z"]
    with pytest.raises(aio.AioRpcError) as err:
        await sub.read()
    assert err.value.code() == grpc.StatusCode.CANCELLED
    server.close()


async def test_a_deadline_ends_the_sub_stream_and_cancels_it_on_the_worker() -> None:
    service = _Service()
    server, port = await _serve(service)
    link = _link(port)
    sub = link.stream("decode", _decode("d"), 0.05, None)
    with pytest.raises(aio.AioRpcError) as err:
        await _read_all(sub)
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    await service.gone.wait()
    assert service.cancelled == ["d"]
    await link.close()
    server.close()


async def test_a_worker_gone_mid_stream_ends_every_sub_stream_unavailable() -> None:
    """A listener that takes the ops, sends one chunk, then closes: a worker dying mid-stream."""
    got_ops = asyncio.Event()

    async def dying(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        frames = FrameSplitter()
        ops: list[worker_pb2.MuxOp] = []
        while len(ops) < 2:
            for p in frames.feed(await reader.read(1 << 16)):
                ops += worker_pb2.MuxRequest.FromString(p).ops
        got_ops.set()
        ev = worker_pb2.MuxEvent(stream_id=ops[0].stream_id)
        ev.chunk.token_ids.append(5)
        writer.write(frame(worker_pb2.MuxResponse(events=[ev]).SerializeToString()))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(dying, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    link = _link(port)
    a = link.stream("decode", _decode("a"), None, None)
    b = link.stream("decode", _decode("b"), None, None)
    assert list((await a.read()).token_ids) == [5]
    for sub in (a, b):
        with pytest.raises(aio.AioRpcError) as err:
            await sub.read()
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert got_ops.is_set()
    server.close()
    # nothing listens there any more: the next request fails the same way
    c = link.stream("decode", _decode("c"), None, None)
    with pytest.raises(aio.AioRpcError) as err:
        await c.read()
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    await link.close()


async def test_a_router_reading_behind_gets_the_waiting_frames_in_one_read() -> None:
    """Chunks the worker sent as messages of their own while the router did not read reach the
    sub-stream in a few socket reads, handed over together: its reads get them merged (with the
    router keeping up, each chunk is read alone)."""
    service = _Service()
    server, port = await _serve(service)
    link = _link(port)
    reads = 0
    received = link._received

    def counting(proto: Any, data: bytes) -> None:
        nonlocal reads
        reads += 1
        received(proto, data)

    link._received = counting  # type: ignore[method-assign]
    sub = link.stream("decode", _decode("b"), None, None)
    q = service.queue("b")
    for i in range(5):  # keeping up: one chunk per read
        q.put_nowait([i])
        assert list((await sub.read()).token_ids) == [i]
    proto: Any = link._call
    proto.transport.pause_reading()
    before = reads
    for i in range(50):  # one at a time, each given the loop to be written on its own
        service.yielded.clear()
        q.put_nowait([100 + i])
        await service.yielded.wait()
        for _ in range(5):
            await asyncio.sleep(0)
    proto.transport.resume_reading()
    got: list[int] = []
    sub_reads = 0
    while len(got) < 50:
        got += (await sub.read()).token_ids
        sub_reads += 1
    assert got == [100 + i for i in range(50)]
    # The socket holds a few dozen small segments (each is charged its buffer's true size), the
    # worker's transport the rest: a few reads, not 50.
    assert reads - before <= 5
    assert sub_reads <= 5
    q.put_nowait(None)
    assert await _read_all(sub) == []
    await link.close()
    server.close()


# -- TLS -----------------------------------------------------------------------------------------


@pytest.fixture
def pki(tmp_path: Path) -> Iterator[dict[str, Path]]:
    yield local_pki(tmp_path, "svc", now=dt.datetime.now(dt.UTC))
    tls.configure(None)


async def test_tls_names_the_router_as_grpc_does(pki: dict[str, Path]) -> None:
    tls.configure(pki["worker"])
    service = _Service()
    server, port = await _serve(service)
    tls.configure(pki["router"])  # this process now connects as the router
    link = _link(port)
    sub = link.stream("decode", _decode("t"), None, None)
    service.queue("t").put_nowait([3])
    service.queue("t").put_nowait(None)
    assert await _read_all(sub) == [3]
    assert service.owners == [tls.Peer("svc", "router")]
    await link.close()
    server.close()


async def test_tls_refuses_a_caller_grpc_would_refuse(pki: dict[str, Path]) -> None:
    tls.configure(pki["worker"])  # a worker may not call Multiplex
    service = _Service()
    server, port = await _serve(service)
    link = _link(port)
    sub = link.stream("decode", _decode("x"), None, None)
    with pytest.raises(aio.AioRpcError) as err:
        await sub.read()
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "router" in (err.value.details() or "")
    assert not service.started.is_set()
    await link.close()
    server.close()


async def test_tls_refuses_a_plaintext_caller(pki: dict[str, Path]) -> None:
    tls.configure(pki["worker"])
    service = _Service()
    server, port = await _serve(service)
    tls.configure(None)
    link = _link(port)
    sub = link.stream("decode", _decode("p"), None, None)
    with pytest.raises(aio.AioRpcError) as err:
        await sub.read()
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert not service.started.is_set()
    await link.close()
    server.close()


def test_the_link_runs_on_uvloop_as_the_router_does() -> None:
    """uvloop's transports are not `asyncio.Transport`s (a type check there broke the link)."""
    uvloop = pytest.importorskip("uvloop")

    async def one_request() -> list[int]:
        service = _Service()
        server, port = await _serve(service)
        link = _link(port)
        sub = link.stream("decode", _decode("u"), None, None)
        service.queue("u").put_nowait([1, 2])
        service.queue("u").put_nowait(None)
        try:
            return await _read_all(sub)
        finally:
            await link.close()
            server.close()

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        assert runner.run(one_request()) == [1, 2]


def test_router_serve_link_flag_sets_pool_link(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from click.testing import CliRunner

    from splitserve.api.router import RouterConfig
    from splitserve.cli import router as cli_router

    got: list[RouterConfig] = []
    monkeypatch.setattr(cli_router, "_serve", lambda config, *_: got.append(config))

    def run(*args: str) -> Any:
        return CliRunner().invoke(cli_router.router, ["serve", "--tokenizer", str(tmp_path), *args])

    assert run().exit_code == 0
    assert run("--link", "grpc").exit_code == 0
    assert [c.pool.link for c in got] == ["stream", "grpc"]
    bad = run("--link", "tcp")
    assert bad.exit_code != 0
    assert "--link" in bad.output


async def test_a_frame_that_is_no_request_is_a_warning_not_a_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    reader = asyncio.StreamReader()
    reader.feed_data(frame(b"\xff\xff\xff\xff"))  # not a MuxRequest
    pump = asyncio.create_task(asyncio.sleep(3600))
    got = [r async for r in worker_link._requests(reader, pump)]
    await asyncio.sleep(0)
    assert got == []
    assert pump.cancelled()
    [record] = [r for r in caplog.records if "stream link" in r.getMessage()]
    assert record.levelname == "WARNING"
    assert record.exc_info is None
    assert "not a MuxRequest" in record.getMessage()
