"""`Worker.Multiplex` on a real sim worker: the same answers as the per-request calls."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from splitserve._gen.v1 import common_pb2, worker_pb2
from splitserve.core.roles import Role
from splitserve.router.mux import MuxLink
from splitserve.security import tls
from splitserve.worker.mux import SubAbort, SubContext, merge_into
from tests.unit.worker.conftest import WorkerFactory
from tests.unit.worker.test_server import collect

PROMPT = [5, 6, 7, 8, 9, 10, 11, 12]


def sampling(max_tokens: int = 6) -> common_pb2.SamplingParams:
    return common_pb2.SamplingParams(max_tokens=max_tokens, ignore_eos=True, seed=1, seeded=True)


async def test_mux_pd_and_generate_match_the_per_request_calls(make_worker: WorkerFactory) -> None:
    p = await make_worker(Role.PREFILL)
    d = await make_worker(Role.DECODE)
    lp, ld = MuxLink(p.stub, "p"), MuxLink(d.stub, "d")  # type: ignore[arg-type]
    pre = await lp.prefill(
        worker_pb2.PrefillRequest(request_id="a", prompt_token_ids=PROMPT, sampling=sampling()),
        10.0,
        None,
    )
    assert pre.kv.source_address == p.address
    decode = ld.stream(
        "decode",
        worker_pb2.DecodeRequest(
            request_id="a",
            prompt_token_ids=PROMPT,
            first_token_id=pre.first_token_id,
            sampling=sampling(),
            kv=pre.kv,
        ),
        10.0,
        None,
    )
    # Several generate sub-requests at once on the same stream, and one per-request call.
    gens = [
        ld.stream(
            "generate",
            worker_pb2.GenerateRequest(
                request_id=f"g{i}", prompt_token_ids=PROMPT, sampling=sampling()
            ),
            10.0,
            None,
        )
        for i in range(3)
    ]
    direct, _ = await collect(
        d.stub.Generate(
            worker_pb2.GenerateRequest(request_id="b", prompt_token_ids=PROMPT, sampling=sampling())
        )
    )
    tokens, reasons = await collect(decode)
    assert [pre.first_token_id, *tokens] == direct
    assert reasons[-1] == common_pb2.FINISH_REASON_LENGTH
    for g in gens:
        assert (await collect(g))[0] == direct
    assert lp.supported
    assert ld.supported
    assert d.sample("splitserve_worker_requests_total", kind="generate", outcome="ok") == 4
    await lp.close()
    await ld.close()


async def test_mux_errors_are_the_calls_codes(make_worker: WorkerFactory) -> None:
    w = await make_worker(Role.PREFILL)
    link = MuxLink(w.stub, "w")  # type: ignore[arg-type]
    gen = link.stream(
        "generate",
        worker_pb2.GenerateRequest(request_id="x", prompt_token_ids=PROMPT, sampling=sampling()),
        10.0,
        None,
    )
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await collect(gen)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION  # a prefill worker
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await link.prefill(
            worker_pb2.PrefillRequest(request_id="", prompt_token_ids=PROMPT), 10.0, None
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    # The stream survived both: a good request still runs on it.
    ok = await link.prefill(
        worker_pb2.PrefillRequest(request_id="y", prompt_token_ids=PROMPT, sampling=sampling()),
        10.0,
        None,
    )
    assert ok.request_id == "y"
    await link.close()


async def test_mux_cancel_and_deadline_stop_the_request_on_the_worker(
    make_worker: WorkerFactory,
) -> None:
    w = await make_worker(Role.MIXED, sim_time_scale=1.0)  # real-time: long enough to cancel
    link = MuxLink(w.stub, "w")  # type: ignore[arg-type]
    long = sampling(max_tokens=2000)
    a = link.stream(
        "generate",
        worker_pb2.GenerateRequest(request_id="a", prompt_token_ids=PROMPT, sampling=long),
        30.0,
        None,
    )
    assert (await a.read()).token_ids  # running
    a.cancel()
    b = link.stream(
        "generate",
        worker_pb2.GenerateRequest(request_id="b", prompt_token_ids=PROMPT, sampling=long),
        0.5,
        None,
    )
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await collect(b)
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    async with asyncio.timeout(10):
        while w.service.engine.in_flight:  # noqa: ASYNC110 - the engine has no such event
            await asyncio.sleep(0.02)
    assert w.sample("splitserve_worker_requests_total", kind="generate", outcome="cancelled") == 2
    await link.close()


async def test_sub_context_is_the_streams_caller_with_the_ops_metadata() -> None:
    class Outer:
        def auth_context(self) -> dict[str, list[bytes]]:
            return {"x509_pem_cert": [b"PEM of the router"]}

        def peer(self) -> str:
            return "ipv4:127.0.0.1:5"

    outer: Any = Outer()
    sub = SubContext(outer, {"traceparent": "00-abc-def-01"})
    # Owners see the stream's certificate: an owner-scoped Cancel from that router still acts.
    assert tls.peer_fingerprint(sub) == tls.peer_fingerprint(outer) is not None
    assert sub.peer() == "ipv4:127.0.0.1:5"
    assert sub.invocation_metadata() == (("traceparent", "00-abc-def-01"),)
    with pytest.raises(SubAbort) as err:
        await sub.abort(grpc.StatusCode.OUT_OF_RANGE, "too long")
    assert err.value.code == grpc.StatusCode.OUT_OF_RANGE


def test_chunks_waiting_for_one_message_join_as_the_router_would_merge_them() -> None:
    unfinished = common_pb2.FINISH_REASON_UNSPECIFIED
    lp = common_pb2.TokenLogprobs(token_ids=[1], logprobs=[-0.5])
    prev = common_pb2.TokenChunk(request_id="r", token_ids=[1], num_prompt_tokens=8)
    assert merge_into(None, common_pb2.TokenChunk(token_ids=[2])) is None  # nothing to join
    joined = merge_into(prev, common_pb2.TokenChunk(token_ids=[2, 3], logprobs=[lp]))
    assert joined is prev
    assert list(prev.token_ids) == [1, 2, 3]
    assert len(prev.logprobs) == 1
    assert prev.finish_reason == unfinished
    merge_into(
        prev, common_pb2.TokenChunk(token_ids=[4], finish_reason=common_pb2.FINISH_REASON_LENGTH)
    )
    assert list(prev.token_ids) == [1, 2, 3, 4]
    assert prev.finish_reason == common_pb2.FINISH_REASON_LENGTH  # the last one's reason
    # An error or a cancellation ends the stream on its own: the tokens before it stay emitted.
    for reason in (common_pb2.FINISH_REASON_ERROR, common_pb2.FINISH_REASON_CANCELLED):
        other = common_pb2.TokenChunk(token_ids=[1])
        assert merge_into(other, common_pb2.TokenChunk(finish_reason=reason, error="x")) is None
        assert list(other.token_ids) == [1]
        assert other.finish_reason == unfinished
