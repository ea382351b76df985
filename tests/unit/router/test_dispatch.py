"""The P/D flow over fake workers: happy paths, fallbacks, take-over, cancellation, metrics."""

from __future__ import annotations

import asyncio
import contextlib

import grpc
import pytest

from splitserve.api.router import DispatchSettings
from splitserve.core.errors import NoEligibleEndpoint
from splitserve.core.ids import RequestId
from splitserve.core.request import FinishReason, Request, SamplingSpec
from splitserve.core.roles import Role
from splitserve.router.dispatch import Chunk, Dispatch
from splitserve.router.errors import InvalidRequest, RequestTimeout, WorkersFailed
from splitserve.router.generation import GenerationParams
from tests.unit.router.conftest import Stack, StackFactory, WorkerFactory

COMPLETION = (10, 11, 12, 13, 14, 15, 16, 17)
PROMPT = (1, 2, 3, 4)


def _request(max_tokens: int = 5, rid: str = "r1") -> Request:
    return Request(RequestId(rid), PROMPT, SamplingSpec(max_tokens=max_tokens), arrival_s=0.0)


async def _run(dispatch: Dispatch) -> list[Chunk]:
    async with contextlib.aclosing(dispatch.chunks()) as chunks:
        return [c async for c in chunks]


def _tokens(chunks: list[Chunk]) -> list[int]:
    return [t for c in chunks for t in c.token_ids]


async def test_disaggregated_happy_path(
    make_worker: WorkerFactory, make_stack: StackFactory
) -> None:
    p = await make_worker(Role.PREFILL)
    d = await make_worker(Role.DECODE)
    stack = await make_stack(p, d)
    dispatch = stack.dispatcher.open(_request(max_tokens=5))
    chunks = await _run(dispatch)
    assert _tokens(chunks) == list(COMPLETION[:5])
    assert chunks[-1].finish_reason is FinishReason.LENGTH
    assert all(c.finish_reason is None for c in chunks[:-1])
    assert dispatch.path is not None
    assert dispatch.path.value == "disaggregated"
    assert p.names() == ["Prefill"]
    assert d.names() == ["Decode"]
    [decode] = d.requests("Decode")
    assert decode.kv.source_address == p.address
    assert decode.first_token_id == COMPLETION[0]
    assert list(decode.prompt_token_ids) == list(PROMPT)
    await stack.dispatcher.drain_background()
    assert p.cancelled == []
    assert d.cancelled == []
    assert (
        stack.sample(
            "splitserve_router_requests_total",
            outcome="ok",
            path="disaggregated",
            slo_class="default",
        )
        == 1
    )
    assert (
        stack.sample(
            "splitserve_router_ttft_seconds_count", path="disaggregated", slo_class="default"
        )
        == 1
    )
    assert (
        stack.sample(
            "splitserve_router_tpot_seconds_count", path="disaggregated", slo_class="default"
        )
        == 1
    )
    assert stack.sample("splitserve_router_completion_tokens_total") == 5
    assert stack.sample("splitserve_router_prompt_tokens_total") == len(PROMPT)
    assert stack.sample("splitserve_router_inflight_requests") == 0
    assert all(v.inflight == 0 for v in stack.pool.views())


async def test_finished_at_prefill_skips_decode(
    make_worker: WorkerFactory, make_stack: StackFactory
) -> None:
    p = await make_worker(Role.PREFILL)
    d = await make_worker(Role.DECODE)
    stack = await make_stack(p, d)
    chunks = await _run(stack.dispatcher.open(_request(max_tokens=1)))
    assert chunks == [Chunk((COMPLETION[0],), FinishReason.LENGTH)]
    assert d.names() == []


async def test_aggregated_on_a_mixed_worker(
    make_worker: WorkerFactory, make_stack: StackFactory
) -> None:
    m = await make_worker(Role.MIXED)
    stack = await make_stack(m)
    dispatch = stack.dispatcher.open(_request(max_tokens=3))
    assert _tokens(await _run(dispatch)) == list(COMPLETION[:3])
    assert m.names() == ["Generate"]
    assert dispatch.path is not None
    assert dispatch.path.value == "aggregated"


async def test_next_prefill_worker_after_a_failure(
    make_worker: WorkerFactory, make_stack: StackFactory
) -> None:
    bad = await make_worker(Role.PREFILL, prefill_abort=grpc.StatusCode.UNAVAILABLE, num_running=0)
    good = await make_worker(Role.PREFILL, num_running=5)  # ranked second: busier
    d = await make_worker(Role.DECODE)
    stack = await make_stack(bad, good, d)
    chunks = await _run(stack.dispatcher.open(_request()))
    assert _tokens(chunks) == list(COMPLETION[:5])
    await stack.dispatcher.drain_background()
    assert bad.names() == ["Prefill", "Cancel"]  # told to drop whatever it holds
    assert good.names() == ["Prefill"]
    assert d.requests("Decode")[0].kv.source_address == good.address
    assert stack.sample("splitserve_router_fallbacks_total", reason="prefill_retry") == 1


async def test_aggregated_fallback_when_every_prefill_fails(
    make_worker: WorkerFactory, make_stack: StackFactory
) -> None:
    p = await make_worker(Role.PREFILL, prefill_abort=grpc.StatusCode.INTERNAL)
    d = await make_worker(Role.DECODE)
    stack = await make_stack(p, d)
    dispatch = stack.dispatcher.open(_request())
    assert _tokens(await _run(dispatch)) == list(COMPLETION[:5])
    assert d.names() == ["Generate"]
    assert dispatch.path is not None
    assert dispatch.path.value == "aggregated"
    assert stack.sample("splitserve_router_fallbacks_total", reason="prefill_to_aggregated") == 1
    assert (
        stack.sample(
            "splitserve_router_requests_total", outcome="ok", path="aggregated", slo_class="default"
        )
        == 1
    )


@pytest.mark.parametrize(
    "code",
    [
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.OUT_OF_RANGE,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    ],
    ids=str,
)
async def test_request_that_can_never_fit_is_rejected(
    make_worker: WorkerFactory, make_stack: StackFactory, code: grpc.StatusCode
) -> None:
    p = await make_worker(Role.PREFILL, prefill_abort=code)
    d = await make_worker(Role.DECODE)
    stack = await make_stack(p, d)
    with pytest.raises(InvalidRequest, match="scripted prefill failure"):
        await _run(stack.dispatcher.open(_request()))
    assert d.names() == []  # no fallback for a request that cannot fit anywhere
    assert (
        stack.sample(
            "splitserve_router_requests_total",
            outcome="rejected",
            path="disaggregated",
            slo_class="default",
        )
        == 1
    )


async def test_next_decode_worker_reuses_the_kv_when_the_first_is_unreachable(
    make_worker: WorkerFactory, make_stack: StackFactory
) -> None:
    p = await make_worker(Role.PREFILL)
    d1 = await make_worker(Role.DECODE, decode_abort=grpc.StatusCode.UNAVAILABLE)
    d2 = await make_worker(Role.DECODE, num_running=3)
    stack = await make_stack(p, d1, d2)
    chunks = await _run(stack.dispatcher.open(_request(max_tokens=6)))
    assert _tokens(chunks) == list(COMPLETION[:6])
    await stack.dispatcher.drain_background()
    assert d1.names() == ["Decode", "Cancel"]
    assert d2.names() == ["Decode"]
    assert p.cancelled == []  # the KV was used by d2, not dropped
    assert d2.requests("Decode")[0].kv.source_address == p.address
    assert stack.sample("splitserve_router_fallbacks_total", reason="decode_retry") == 1


async def test_decode_crash_mid_stream_continues_on_another_worker(
    make_worker: WorkerFactory, make_stack: StackFactory
) -> None:
    p = await make_worker(Role.PREFILL)
    d1 = await make_worker(Role.DECODE, fail_after_tokens=2)
    d2 = await make_worker(Role.DECODE, num_running=3)
    stack = await make_stack(p, d1, d2)
    chunks = await _run(stack.dispatcher.open(_request(max_tokens=7)))
    # No token repeated or lost: first from P, two from d1, the rest from d2.
    assert _tokens(chunks) == list(COMPLETION[:7])
    [gen] = d2.requests("Generate")
    assert list(gen.prompt_token_ids) == [*PROMPT, *COMPLETION[:3]]
    assert gen.sampling.max_tokens == 4
    await p.wait_call("Cancel")  # the KV held for d1 is released
    assert stack.sample("splitserve_router_fallbacks_total", reason="generate_retry") == 1


async def test_error_chunk_moves_to_the_next_worker(
    make_worker: WorkerFactory, make_stack: StackFactory
) -> None:
    bad = await make_worker(Role.MIXED, error_chunk=True)
    good = await make_worker(Role.MIXED, num_running=3)
    stack = await make_stack(bad, good)
    assert _tokens(await _run(stack.dispatcher.open(_request(max_tokens=2)))) == [10, 11]
    assert good.names() == ["Generate"]


async def test_every_decode_worker_failing_is_an_error(
    make_worker: WorkerFactory, make_stack: StackFactory
) -> None:
    d1 = await make_worker(Role.DECODE, generate_abort=grpc.StatusCode.INTERNAL)
    d2 = await make_worker(Role.DECODE, generate_abort=grpc.StatusCode.UNAVAILABLE)
    stack = await make_stack(d1, d2)
    with pytest.raises(WorkersFailed):
        await _run(stack.dispatcher.open(_request()))
    assert (
        stack.sample(
            "splitserve_router_requests_total",
            outcome="error",
            path="aggregated",
            slo_class="default",
        )
        == 1
    )


async def test_no_decode_worker_is_no_eligible_endpoint(
    make_worker: WorkerFactory, make_stack: StackFactory
) -> None:
    p = await make_worker(Role.PREFILL)
    stack = await make_stack(p)
    with pytest.raises(NoEligibleEndpoint):
        await _run(stack.dispatcher.open(_request()))
    assert p.names() == []
    # It never reached a worker: no prompt tokens counted.
    assert stack.sample("splitserve_router_prompt_tokens_total") == 0
    assert stack.sample("splitserve_router_completion_tokens_total") == 0
    assert (
        stack.sample(
            "splitserve_router_requests_total",
            outcome="unavailable",
            path="none",
            slo_class="default",
        )
        == 1
    )


async def test_fenced_decode_worker_gets_no_work(
    make_worker: WorkerFactory, make_stack: StackFactory
) -> None:
    d1 = await make_worker(Role.DECODE)
    d2 = await make_worker(Role.DECODE, num_running=9)
    stack = await make_stack(d1, d2)
    stack.pool.fence(d1.address)
    await _run(stack.dispatcher.open(_request()))
    assert d1.names() == []
    assert d2.names() == ["Generate"]


async def test_cancelling_the_consumer_cancels_prefill_and_decode_workers(
    make_worker: WorkerFactory, make_stack: StackFactory
) -> None:
    hold = asyncio.Event()
    p = await make_worker(Role.PREFILL)
    d = await make_worker(Role.DECODE, hold=hold, hold_after=1)
    stack = await make_stack(p, d)
    got_two = asyncio.Event()
    received: list[Chunk] = []

    async def consume() -> None:
        async with contextlib.aclosing(stack.dispatcher.open(_request(rid="gone")).chunks()) as cs:
            async for chunk in cs:
                received.append(chunk)
                if len(received) == 2:
                    got_two.set()

    task = asyncio.create_task(consume())
    async with asyncio.timeout(10):
        await got_two.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await p.wait_call("Cancel")
    await d.wait_call("Cancel")
    assert p.cancelled == ["gone"]
    assert d.cancelled == ["gone"]
    await stack.dispatcher.drain_background()
    assert (
        stack.sample(
            "splitserve_router_requests_total",
            outcome="cancelled",
            path="disaggregated",
            slo_class="default",
        )
        == 1
    )
    # The tokens it did send, and its prompt (it reached the workers), count whatever the outcome.
    sent = len(_tokens(received))
    assert sent >= 2
    assert stack.sample("splitserve_router_completion_tokens_total") == sent
    assert stack.sample("splitserve_router_prompt_tokens_total") == len(PROMPT)
    assert stack.sample("splitserve_router_inflight_requests") == 0
    assert all(v.inflight == 0 for v in stack.pool.views())


async def test_request_timeout(make_worker: WorkerFactory, make_stack: StackFactory) -> None:
    d = await make_worker(Role.MIXED, hold=asyncio.Event(), hold_after=1)
    stack = await make_stack(d, dispatch=DispatchSettings(request_timeout_s=0.3))
    with pytest.raises(RequestTimeout):
        await _run(stack.dispatcher.open(_request()))
    assert (
        stack.sample(
            "splitserve_router_requests_total",
            outcome="timeout",
            path="aggregated",
            slo_class="default",
        )
        == 1
    )


async def test_stop_string_cuts_text_and_cancels_workers(
    make_worker: WorkerFactory, make_stack: StackFactory
) -> None:
    tok = (await make_stack()).generator.tokenizer
    completion = tok.encode("alpha beta. gamma delta")
    upto_stop = next(k for k in range(len(completion) + 1) if "." in tok.decode(completion[:k]))
    # Never set: the stream would hang right after the token that completes the stop string.
    hold = asyncio.Event()
    d = await make_worker(Role.MIXED, hold=hold, hold_after=upto_stop, completion=completion)
    stack = await make_stack(d)
    prompt = tok.encode("Say something:")
    request = stack.generator.build_request("s1", prompt, GenerationParams(stop=(".",)))
    assert request.sampling.stop_token_ids == tok.stop_token_ids
    async with contextlib.aclosing(stack.generator.stream(request, (".",))) as stream:
        pieces = [c async for c in stream]
    assert "".join(p.text for p in pieces) == "alpha beta"
    assert pieces[-1].finish_reason is FinishReason.STOP
    assert pieces[-1].usage is not None
    assert pieces[-1].usage.prompt_tokens == len(prompt)
    await d.wait_call("Cancel")
    assert d.cancelled == ["s1"]
    await stack.dispatcher.drain_background()
    assert (
        stack.sample(
            "splitserve_router_requests_total", outcome="ok", path="aggregated", slo_class="default"
        )
        == 1
    )


async def test_decode_is_called_before_the_consumer_asks_past_token_one(
    make_worker: WorkerFactory, make_stack: StackFactory
) -> None:
    """The Decode call goes out when token 1 reaches the consumer, not when the consumer comes
    back for token 2: a consumer that holds token 1 until the decode worker has the call gets
    it (before, this waited forever), and the tokens are the same."""
    p = await make_worker(Role.PREFILL)
    d = await make_worker(Role.DECODE)
    stack = await make_stack(p, d)
    received: list[Chunk] = []
    async with contextlib.aclosing(stack.dispatcher.open(_request(max_tokens=5)).chunks()) as cs:
        async for chunk in cs:
            received.append(chunk)
            if len(received) == 1:
                assert d.names() == []  # nothing has run on the loop since the call was made
                await d.wait_call("Decode", timeout_s=10)
    assert _tokens(received) == list(COMPLETION[:5])
    assert d.names() == ["Decode"]


async def test_closing_at_token_one_cancels_the_started_decode(
    make_worker: WorkerFactory, make_stack: StackFactory
) -> None:
    p = await make_worker(Role.PREFILL)
    d = await make_worker(Role.DECODE)
    stack = await make_stack(p, d)
    async with contextlib.aclosing(stack.dispatcher.open(_request(rid="early")).chunks()) as cs:
        head = await anext(cs)
        await d.wait_call("Decode")
    assert head.token_ids == (COMPLETION[0],)
    await d.wait_call("Cancel")
    assert d.cancelled == ["early"]
    await stack.dispatcher.drain_background()
    assert stack.sample("splitserve_router_inflight_requests") == 0
    assert all(v.inflight == 0 for v in stack.pool.views())


async def _a_stream_under_way(stack: Stack) -> tuple[asyncio.Task[None], list[Chunk]]:
    """A 5-token stream read in a task of its own, once its first chunk has arrived: the task
    and the chunks it has received (so far)."""
    got_one = asyncio.Event()
    received: list[Chunk] = []

    async def consume() -> None:
        async with contextlib.aclosing(
            stack.dispatcher.open(_request(max_tokens=5)).chunks()
        ) as cs:
            async for chunk in cs:
                received.append(chunk)
                got_one.set()

    task = asyncio.create_task(consume())
    async with asyncio.timeout(10):
        await got_one.wait()
    return task, received


async def test_a_worker_removed_by_discovery_keeps_its_streams_in_flight(
    make_worker: WorkerFactory, make_stack: StackFactory
) -> None:
    """Discovery drops a worker (pod deleted, label changed) while a stream runs on it: no new
    request goes there, but the running stream gets all its tokens (the pod is still alive in
    its termination grace period); the channel closes once nothing runs on it."""
    hold = asyncio.Event()
    d = await make_worker(Role.MIXED, hold=hold, hold_after=1)
    stack = await make_stack(d)
    task, received = await _a_stream_under_way(stack)
    await stack.pool.remove(d.address)
    assert stack.pool.ids() == []  # no new work is placed on it
    with pytest.raises(NoEligibleEndpoint):
        await _run(stack.dispatcher.open(_request(rid="r2")))
    hold.set()
    async with asyncio.timeout(10):
        await task
    assert [t for c in received for t in c.token_ids] == list(COMPLETION[:5])
    assert received[-1].finish_reason is FinishReason.LENGTH
    async with asyncio.timeout(10):
        await stack.pool.close()


async def test_a_removed_worker_s_stream_that_outlives_the_grace_ends_with_an_error(
    make_worker: WorkerFactory, make_stack: StackFactory
) -> None:
    """Past the leave grace the channel closes: the stream still running on it ends with an
    error (the client's error event), never a silent truncation or a hang."""
    d = await make_worker(Role.MIXED, hold=asyncio.Event(), hold_after=1)
    stack = await make_stack(d)
    stack.pool._leave_grace_s = 0.0
    task, received = await _a_stream_under_way(stack)
    await stack.pool.remove(d.address)
    with pytest.raises(WorkersFailed):
        async with asyncio.timeout(10):
            await task
    assert [c.finish_reason for c in received] == [None]


async def test_a_worker_removed_and_added_back_keeps_its_streams_in_flight(
    make_worker: WorkerFactory, make_stack: StackFactory
) -> None:
    """A discovery resync drops a worker and adds it back (same address) while a stream runs
    on it: the stream keeps its tokens, and new requests run on the same worker again."""
    hold = asyncio.Event()
    d = await make_worker(Role.MIXED, hold=hold, hold_after=1)
    stack = await make_stack(d)
    task, received = await _a_stream_under_way(stack)
    await stack.pool.remove(d.address)
    stack.pool.add(d.address)
    await stack.wait_ready()
    hold.set()
    second = await _run(stack.dispatcher.open(_request(max_tokens=3, rid="r2")))
    async with asyncio.timeout(10):
        await task
    assert [t for c in received for t in c.token_ids] == list(COMPLETION[:5])
    assert [t for c in second for t in c.token_ids] == list(COMPLETION[:3])
    assert all(v.inflight == 0 for v in stack.pool.views())
