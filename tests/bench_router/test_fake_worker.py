"""The lean bench worker (`fake_worker`) answers the stream-link ops the router sends as the
zero-delay sim worker does: a prefill with the first token and a `sim` KV handle naming it, a
decode (also one sent with `kv_follows`, which waits for its `decode_kv`) with the sim engine's
token ids, one token per chunk unless chunks wait for the same frame, the last one with its
finish reason, then one OK status; nothing after a cancel; the load and step feeds."""

from __future__ import annotations

import asyncio

import grpc

from splitserve._gen.v1 import common_pb2, worker_pb2
from splitserve.core.frames import FrameSplitter, frame
from splitserve.policy.batching.tokens import SyntheticTokens
from tests.bench_router.fake_worker import FIRST_TOKEN_ID, VOCAB_SIZE, FakeEngine, _Conn

PROMPT = list(range(100, 300))


class _Client:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.frames = FrameSplitter()
        self.events: list[worker_pb2.MuxEvent] = []
        self.messages = 0

    def send(self, *ops: worker_pb2.MuxOp) -> None:
        self.writer.write(frame(worker_pb2.MuxRequest(ops=ops).SerializeToString()))

    async def until(self, done: object) -> None:
        async with asyncio.timeout(10):
            while not done(self.events):  # type: ignore[operator]
                data = await self.reader.read(1 << 16)
                assert data, "the fake closed the link"
                for payload in self.frames.feed(data):
                    self.messages += 1
                    self.events.extend(worker_pb2.MuxResponse.FromString(payload).events)

    def of(self, sid: int) -> list[worker_pb2.MuxEvent]:
        return [e for e in self.events if e.stream_id == sid]


async def _start(role: str) -> tuple[FakeEngine, asyncio.Server, _Client]:
    engine = FakeEngine(role)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Conn(engine), "127.0.0.1", 0)
    engine.link_port = int(server.sockets[0].getsockname()[1])
    engine.address = "127.0.0.1:1"
    reader, writer = await asyncio.open_connection("127.0.0.1", engine.link_port)
    return engine, server, _Client(reader, writer)


def _status(events: list[worker_pb2.MuxEvent]) -> list[int]:
    return [e.status.code for e in events if e.HasField("status")]


async def test_prefill_answers_with_the_first_token_and_a_kv_handle_naming_the_worker() -> None:
    engine, server, client = await _start("prefill")
    try:
        sampling = common_pb2.SamplingParams(max_tokens=16)
        req = worker_pb2.PrefillRequest(request_id="r1", prompt_token_ids=PROMPT, sampling=sampling)
        client.send(worker_pb2.MuxOp(stream_id=7, prefill=req))
        await client.until(lambda ev: _status([e for e in ev if e.stream_id == 7]))
        prefill, status = client.of(7)
        tokens = SyntheticTokens(VOCAB_SIZE, FIRST_TOKEN_ID)
        resp = prefill.prefill
        assert resp.first_token_id == tokens.token(tokens.key(PROMPT, 0), 0)
        assert (resp.request_id, resp.num_prompt_tokens) == ("r1", len(PROMPT))
        assert resp.kv.transport == "sim"
        assert resp.kv.source_address == engine.address
        assert (resp.kv.source_request_id, resp.kv.num_tokens) == ("r1", len(PROMPT))
        assert resp.prefill_s > 0  # the router fits its prefill rate from it, as from the sim's
        assert status.status.code == grpc.StatusCode.OK.value[0]
        # a decode op on a prefill worker is refused, naming why
        client.send(worker_pb2.MuxOp(stream_id=8, decode=worker_pb2.DecodeRequest()))
        await client.until(lambda ev: _status([e for e in ev if e.stream_id == 8]))
        assert client.of(8)[0].status.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    finally:
        client.writer.close()
        server.close()


async def test_decode_streams_the_sim_engines_tokens_then_one_ok_and_kv_follows_waits() -> None:
    engine, server, client = await _start("decode")
    try:
        sampling = common_pb2.SamplingParams(max_tokens=16)
        plain = worker_pb2.DecodeRequest(
            request_id="a", prompt_token_ids=PROMPT, sampling=sampling, first_token_id=5
        )
        early = worker_pb2.DecodeRequest(
            request_id="b", prompt_token_ids=PROMPT, sampling=sampling, kv_follows=True
        )
        long = worker_pb2.DecodeRequest(
            request_id="c",
            prompt_token_ids=PROMPT,
            sampling=common_pb2.SamplingParams(max_tokens=100_000),
        )
        client.send(
            worker_pb2.MuxOp(stream_id=1, decode=plain),
            worker_pb2.MuxOp(stream_id=2, decode=early),
            worker_pb2.MuxOp(stream_id=3, decode=long),
        )
        await client.until(lambda ev: _status([e for e in ev if e.stream_id == 1]))
        assert not client.of(2)  # waits for its decode_kv
        client.send(
            worker_pb2.MuxOp(stream_id=2, decode_kv=worker_pb2.DecodeKv(first_token_id=5)),
            worker_pb2.MuxOp(stream_id=3, cancel=worker_pb2.MuxCancel()),
        )
        await client.until(lambda ev: _status([e for e in ev if e.stream_id == 2]))
        tokens = SyntheticTokens(VOCAB_SIZE, FIRST_TOKEN_ID)
        want = [tokens.token(tokens.key(PROMPT, 0), i) for i in range(1, 16)]
        for sid, rid in ((1, "a"), (2, "b")):
            events = client.of(sid)
            chunks = [e.chunk for e in events if e.HasField("chunk")]
            assert [t for c in chunks for t in c.token_ids] == want
            assert {c.request_id for c in chunks} == {rid}
            assert {c.num_prompt_tokens for c in chunks} == {len(PROMPT)}
            reasons = [c.finish_reason for c in chunks]
            assert reasons[-1] == common_pb2.FINISH_REASON_LENGTH
            assert set(reasons[:-1]) <= {common_pb2.FINISH_REASON_UNSPECIFIED}
            assert _status(events) == [grpc.StatusCode.OK.value[0]]
            assert events[-1].HasField("status")
        # the cancelled one: some tokens, no finish, no status, and no longer stepped
        assert not _status(client.of(3))
        assert not engine.running
        assert not engine.parked
    finally:
        client.writer.close()
        server.close()


async def test_one_token_per_chunk_when_the_reader_keeps_up() -> None:
    """A router reading as fast as the fake steps gets each token in its own chunk (the sim
    worker's counts at c=1 are the reference; the benchmark compares them)."""
    _, server, client = await _start("decode")
    try:
        sampling = common_pb2.SamplingParams(max_tokens=6)
        req = worker_pb2.DecodeRequest(request_id="a", prompt_token_ids=PROMPT, sampling=sampling)
        client.send(worker_pb2.MuxOp(stream_id=1, decode=req))
        await client.until(lambda ev: _status(ev))
        chunks = [e.chunk for e in client.of(1) if e.HasField("chunk")]
        assert [len(c.token_ids) for c in chunks] == [1] * 5
    finally:
        client.writer.close()
        server.close()


async def test_load_and_step_feeds() -> None:
    engine, server, client = await _start("decode")
    try:
        client.send(
            worker_pb2.MuxOp(stream_id=10, watch_load=worker_pb2.WatchLoadRequest(interval_s=0.01)),
            worker_pb2.MuxOp(stream_id=11, watch_step_batches=worker_pb2.WatchStepsRequest()),
        )
        await client.until(lambda ev: sum(e.HasField("load") for e in ev) >= 3)
        report = client.of(10)[0].load
        assert report.link_port == engine.link_port
        assert report.role == common_pb2.ROLE_DECODE
        assert report.kv_blocks_free == report.kv_blocks_total > 0
        sampling = common_pb2.SamplingParams(max_tokens=4)
        req = worker_pb2.DecodeRequest(request_id="a", prompt_token_ids=PROMPT, sampling=sampling)
        client.send(worker_pb2.MuxOp(stream_id=1, decode=req))
        await client.until(lambda ev: _status([e for e in ev if e.stream_id == 1]))
        samples = [s for e in client.of(11) for s in e.steps.samples]
        assert [list(s.decode_context_tokens) for s in samples] == [[200 + i] for i in (1, 2, 3)]
        assert [s.index for s in samples] == sorted({s.index for s in samples})
        # the cancel, then an op with none (answered INVALID_ARGUMENT after the cancel is handled)
        client.send(
            worker_pb2.MuxOp(stream_id=10, cancel=worker_pb2.MuxCancel()),
            worker_pb2.MuxOp(stream_id=12),
        )
        await client.until(lambda ev: _status([e for e in ev if e.stream_id == 12]))
        assert not engine.load_feeds
    finally:
        client.writer.close()
        server.close()
