"""The router on real ports: the official OpenAI client, the gRPC face, disconnects, serve()."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import grpc
import httpx
import openai
import pytest
from grpc import aio

from splitserve._gen.v1 import common_pb2, router_pb2, router_pb2_grpc
from splitserve.api.router import RouterConfig
from splitserve.core.roles import Role
from splitserve.router.server import RouterServer, serve
from splitserve.router.tokenizer import TextTokenizer
from tests.unit.router.conftest import MODEL, ServerFactory, WorkerFactory

TEXT = "The quick brown fox jumps over the lazy dog."


def _openai(server: RouterServer) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=f"http://127.0.0.1:{server.http_port}/v1", api_key="unused", max_retries=0
    )


async def test_openai_client_chat_and_completions(
    make_worker: WorkerFactory, make_router: ServerFactory, tokenizer: TextTokenizer
) -> None:
    p = await make_worker(Role.PREFILL)
    d = await make_worker(Role.DECODE)
    for w in (p, d):
        w.script.completion = tuple(tokenizer.encode(TEXT))
    server = await make_router(p.address, d.address)
    async with _openai(server) as client:
        chat = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Tell me about foxes."}]
        )
        assert chat.choices[0].message.content == TEXT
        assert chat.choices[0].finish_reason == "stop"
        assert chat.usage is not None
        assert chat.usage.completion_tokens == len(tokenizer.encode(TEXT))

        stream = await client.completions.create(
            model=MODEL,
            prompt="Foxes",
            max_tokens=4,
            stream=True,
            stream_options={"include_usage": True},
        )
        pieces: list[str] = []
        usage = None
        async for chunk in stream:
            pieces.extend(c.text for c in chunk.choices)
            usage = chunk.usage or usage
        assert "".join(pieces) == tokenizer.decode(tokenizer.encode(TEXT)[:4])
        assert usage is not None
        assert usage.prompt_tokens == len(tokenizer.encode("Foxes"))
        assert usage.completion_tokens == 4
        assert usage.total_tokens == usage.prompt_tokens + 4

        chat_stream = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Hi"}], stream=True
        )
        deltas = [c.choices[0].delta.content or "" async for c in chat_stream if c.choices]
        assert "".join(deltas) == TEXT

        with pytest.raises(openai.NotFoundError, match="does not exist"):
            await client.completions.create(model="other", prompt="x")
        with pytest.raises(openai.BadRequestError, match="maximum context length"):
            await client.completions.create(model=MODEL, prompt="x", max_tokens=10_000)
    assert [n for n in p.names() if n != "Cancel"] == ["Prefill"] * 3
    assert d.names() == ["Decode"] * 3


async def test_stream_disconnect_cancels_the_workers(
    make_worker: WorkerFactory, make_router: ServerFactory
) -> None:
    hold = asyncio.Event()
    p = await make_worker(Role.PREFILL)
    d = await make_worker(Role.DECODE, hold=hold, hold_after=0)
    server = await make_router(p.address, d.address)
    url = f"http://127.0.0.1:{server.http_port}/v1/completions"
    async with httpx.AsyncClient() as client:
        payload = {"model": MODEL, "prompt": [1, 2, 3], "stream": True}
        async with client.stream("POST", url, json=payload) as response:
            assert response.status_code == 200
            # Keep the line iterator referenced: a dropped one is finalized, closing the response.
            lines = response.aiter_lines()
            while not (await anext(lines)).startswith("data: "):
                pass  # wait for the first token (from the prefill worker)
            await d.wait_call("Decode")
        # Leaving the block closes the connection mid-stream.
    await d.wait_call("Cancel")
    await p.wait_call("Cancel")
    assert len(set(d.cancelled)) == 1
    assert d.cancelled == p.cancelled


async def test_whole_response_disconnect_cancels_the_worker(
    make_worker: WorkerFactory, make_router: ServerFactory
) -> None:
    m = await make_worker(Role.MIXED, hold=asyncio.Event(), hold_after=1)
    server = await make_router(m.address)
    url = f"http://127.0.0.1:{server.http_port}/v1/chat/completions"
    payload = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}]}
    async with httpx.AsyncClient() as client:
        task = asyncio.create_task(client.post(url, json=payload))
        await m.wait_call("Generate")
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    await m.wait_call("Cancel")
    assert m.cancelled == [m.requests("Generate")[0].request_id]
    await server.dispatcher.drain_background()
    labels = {"outcome": "cancelled", "path": "aggregated", "slo_class": "default"}
    assert server.registry.get_sample_value("splitserve_router_requests_total", labels) == 1


async def test_grpc_generate(
    make_worker: WorkerFactory, make_router: ServerFactory, tokenizer: TextTokenizer
) -> None:
    m = await make_worker(Role.MIXED, completion=tuple(tokenizer.encode(TEXT)))
    server = await make_router(m.address)
    async with aio.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        stub = router_pb2_grpc.RouterStub(channel)
        req = router_pb2.RouterGenerateRequest(request_id="g1", prompt="Say it", stop=[" over"])
        chunks = [c async for c in stub.Generate(req)]
        assert "".join(c.text for c in chunks) == "The quick brown fox jumps"
        last = chunks[-1]
        assert last.finish_reason == common_pb2.FINISH_REASON_STOP
        assert last.path == "aggregated"
        assert last.usage.prompt_tokens == len(tokenizer.encode("Say it"))
        assert last.usage.total_tokens == last.usage.prompt_tokens + last.usage.completion_tokens
        assert all(c.request_id == "g1" for c in chunks)

        ids = router_pb2.RouterGenerateRequest(
            prompt_token_ids=router_pb2.TokenIds(ids=[1, 2]),
            sampling=common_pb2.SamplingParams(max_tokens=3),
        )
        chunks = [c async for c in stub.Generate(ids)]
        assert [t for c in chunks for t in c.token_ids] == tokenizer.encode(TEXT)[:3]
        assert chunks[-1].finish_reason == common_pb2.FINISH_REASON_LENGTH

        # The seed's uint64 carries an int64's bits (-3 here), passed on to the worker as sent.
        seeded = router_pb2.RouterGenerateRequest(
            prompt="Say it", sampling=common_pb2.SamplingParams(seed=2**64 - 3, max_tokens=2)
        )
        chunks = [c async for c in stub.Generate(seeded)]
        assert chunks[-1].finish_reason == common_pb2.FINISH_REASON_LENGTH
        assert m.requests("Generate")[-1].sampling.seed == 2**64 - 3

        with pytest.raises(aio.AioRpcError) as err:
            _ = [c async for c in stub.Generate(router_pb2.RouterGenerateRequest())]
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT

        # A sampling field the gRPC face does not honour is refused by name, never dropped.
        for sampling in (
            common_pb2.SamplingParams(logprobs=True),
            common_pb2.SamplingParams(top_k=5),
            common_pb2.SamplingParams(structured_outputs='{"json_object": true}'),
        ):
            name = sampling.ListFields()[0][0].name
            refused = router_pb2.RouterGenerateRequest(prompt="Say it", sampling=sampling)
            with pytest.raises(aio.AioRpcError) as err:
                _ = [c async for c in stub.Generate(refused)]
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert f"sampling.{name}" in (err.value.details() or "")

        await server.pool.remove(m.address)
        with pytest.raises(aio.AioRpcError) as err:
            _ = [c async for c in stub.Generate(req)]
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_grpc_caller_cancel_cancels_the_workers(
    make_worker: WorkerFactory, make_router: ServerFactory
) -> None:
    m = await make_worker(Role.MIXED, hold=asyncio.Event(), hold_after=2)
    server = await make_router(m.address)
    async with aio.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        stub = router_pb2_grpc.RouterStub(channel)
        req = router_pb2.RouterGenerateRequest(
            request_id="c1", prompt_token_ids=router_pb2.TokenIds(ids=[1])
        )
        call = stub.Generate(req)
        got = await anext(aiter(call))
        assert got.token_ids
        call.cancel()
        await m.wait_call("Cancel")
    # The worker saw the router's own id, not the caller's label.
    assert len(m.cancelled) == 1
    assert m.cancelled[0].startswith("grpc-")
    assert m.cancelled == [m.requests("Generate")[0].request_id]


async def test_serve_runs_until_cancelled(tokenizer_dir: Path) -> None:
    config = RouterConfig(
        model_name=MODEL,
        tokenizer_dir=str(tokenizer_dir),
        http_host="127.0.0.1",
        http_port=0,
        grpc_host="127.0.0.1",
        grpc_port=0,
    )
    ready = asyncio.Event()
    task = asyncio.create_task(serve(config, ready))
    async with asyncio.timeout(20):
        await ready.wait()
    assert not task.done()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def test_config_rejects_unknown_fields() -> None:
    with pytest.raises(ValueError, match="extra"):
        RouterConfig(model_name="m", tokenizer_dir="/t", http_prot=1)  # type: ignore[call-arg]
