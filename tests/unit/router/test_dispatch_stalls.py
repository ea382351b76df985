"""Stalled workers and lost KV (issue 12 items 3 and 7), over fake workers.

What must hold: a decode worker that stops producing tokens (frozen, wedged) is given up on after
`token_stall_timeout_s` and the request continues on another worker with no token duplicated or
lost; a prefill worker that stalls is given up on the same way; a decode whose KV pull fails
(ABORTED: the prefill worker died holding it) is re-run with Generate, on the same worker when it
is the only one.
"""

from __future__ import annotations

import asyncio
import contextlib

import grpc

from splitserve.api.router import DispatchSettings
from splitserve.core.ids import EndpointId, RequestId
from splitserve.core.request import Request, SamplingSpec
from splitserve.core.roles import Role
from splitserve.router.dispatch import Chunk, Dispatch
from tests.fakes.fake_worker import FakeWorker
from tests.unit.router.conftest import Stack, StackFactory, WorkerFactory

COMPLETION = (10, 11, 12, 13, 14, 15, 16, 17)
PROMPT = (1, 2, 3, 4)
STALL = DispatchSettings(token_stall_timeout_s=0.3)


def _request(max_tokens: int) -> Request:
    return Request(RequestId("r1"), PROMPT, SamplingSpec(max_tokens=max_tokens), arrival_s=0.0)


async def _run(dispatch: Dispatch) -> list[Chunk]:
    async with contextlib.aclosing(dispatch.chunks()) as chunks:
        return [c async for c in chunks]


def _tokens(chunks: list[Chunk]) -> list[int]:
    return [t for c in chunks for t in c.token_ids]


async def test_a_decode_stream_that_stalls_moves_to_another_worker(
    make_worker: WorkerFactory, make_stack: StackFactory
) -> None:
    frozen = asyncio.Event()
    p = await make_worker(Role.PREFILL)
    d1 = await make_worker(Role.DECODE, hold=frozen, hold_after=2)
    d2 = await make_worker(Role.DECODE, num_running=3)  # placed second
    stack = await make_stack(p, d1, d2, dispatch=STALL)
    try:
        chunks = await _run(stack.dispatcher.open(_request(max_tokens=7)))
        # First token from P, two from d1, then d1 froze: the rest from d2, none twice.
        assert _tokens(chunks) == list(COMPLETION[:7])
        [gen] = d2.requests("Generate")
        assert list(gen.prompt_token_ids) == [*PROMPT, *COMPLETION[:3]]
        assert gen.sampling.max_tokens == 4
        await d1.wait_call("Cancel")  # the stalled worker is told to drop the request
        await p.wait_call("Cancel")  # and the KV held for it is released
        assert stack.sample("splitserve_router_fallbacks_total", reason="token_stall") == 1
        assert stack.sample(
            "splitserve_router_requests_total",
            outcome="ok",
            path="disaggregated",
            slo_class="default",
        )
    finally:
        frozen.set()


async def test_a_stalled_prefill_is_given_up_for_the_next_prefill_worker(
    make_worker: WorkerFactory, make_stack: StackFactory
) -> None:
    frozen = asyncio.Event()
    p1 = await make_worker(Role.PREFILL, prefill_hold=frozen)
    p2 = await make_worker(Role.PREFILL, num_running=3)
    d = await make_worker(Role.DECODE)
    stack = await make_stack(p1, p2, d, dispatch=STALL)
    try:
        chunks = await _run(stack.dispatcher.open(_request(max_tokens=5)))
        assert _tokens(chunks) == list(COMPLETION[:5])
        assert p2.names() == ["Prefill"]
        assert d.requests("Decode")[0].kv.source_address == p2.address
        await p1.wait_call("Cancel")
        assert stack.sample("splitserve_router_fallbacks_total", reason="prefill_retry") == 1
    finally:
        frozen.set()


async def test_a_slow_but_steady_stream_is_not_a_stall(
    make_worker: WorkerFactory, make_stack: StackFactory
) -> None:
    d = await make_worker(Role.MIXED, token_delay_s=0.05)
    stack = await make_stack(d, dispatch=DispatchSettings(token_stall_timeout_s=2.0))
    chunks = await _run(stack.dispatcher.open(_request(max_tokens=6)))
    assert _tokens(chunks) == list(COMPLETION[:6])
    assert d.names() == ["Generate"]
    assert stack.sample("splitserve_router_fallbacks_total", reason="token_stall") == 0


async def test_lost_kv_is_regenerated_on_the_same_decode_worker(
    make_worker: WorkerFactory, make_stack: StackFactory
) -> None:
    """The prefill worker died holding the KV: the only decode worker cannot pull it (ABORTED)
    but is healthy, so it runs the request with Generate instead."""
    p = await make_worker(Role.PREFILL)
    d = await make_worker(Role.DECODE, decode_abort=grpc.StatusCode.ABORTED)
    stack = await make_stack(p, d)
    chunks = await _run(stack.dispatcher.open(_request(max_tokens=5)))
    assert _tokens(chunks) == list(COMPLETION[:5])
    await stack.dispatcher.drain_background()
    # No Cancel to the decode worker: a late one would cancel the retry (same request id).
    assert d.names() == ["Decode", "Generate"]
    await p.wait_call("Cancel")  # the lost KV is dropped at its source
    [gen] = d.requests("Generate")
    assert list(gen.prompt_token_ids) == [*PROMPT, COMPLETION[0]]
    assert gen.sampling.max_tokens == 4
    assert stack.sample("splitserve_router_fallbacks_total", reason="generate_retry") == 1


async def _release_later(event: asyncio.Event, after_s: float) -> None:
    await asyncio.sleep(after_s)
    event.set()


async def _steps_seen(stack: Stack, *workers: FakeWorker) -> None:
    """Until the router has a step report of each worker (its step stream is followed)."""
    await stack.pool.wait_for(
        lambda p: all(p.latency.step_age_s(EndpointId(w.address)) is not None for w in workers),
        10,
    )


async def test_a_prefill_queued_on_a_stepping_worker_is_not_a_stall(
    make_worker: WorkerFactory, make_stack: StackFactory
) -> None:
    """The worker answers after > 3 x the stall timeout but its engine reports steps all along
    (the prompt is queued behind others): the router waits for it instead of falling back."""
    queued = asyncio.Event()
    p1 = await make_worker(Role.PREFILL, prefill_hold=queued, step_every_s=0.05)
    p2 = await make_worker(Role.PREFILL, num_running=3)  # placed second
    d = await make_worker(Role.DECODE)
    stack = await make_stack(p1, p2, d, dispatch=STALL)
    await _steps_seen(stack, p1)
    release = asyncio.create_task(_release_later(queued, 1.0))
    try:
        chunks = await _run(stack.dispatcher.open(_request(max_tokens=5)))
        assert _tokens(chunks) == list(COMPLETION[:5])
        assert p1.names() == ["Prefill"]
        assert "Prefill" not in p2.names()
        assert d.names() == ["Decode"]
        assert stack.sample("splitserve_router_fallbacks_total", reason="token_stall") == 0
        assert stack.sample("splitserve_router_fallbacks_total", reason="prefill_retry") == 0
    finally:
        queued.set()
        await release


async def test_a_prefill_worker_that_stops_stepping_is_still_a_stall(
    make_worker: WorkerFactory, make_stack: StackFactory
) -> None:
    """Steps came, then the engine froze (no more steps, no answer): given up on as before."""
    frozen, stop = asyncio.Event(), asyncio.Event()
    p1 = await make_worker(Role.PREFILL, prefill_hold=frozen, step_every_s=0.05, steps_stop=stop)
    p2 = await make_worker(Role.PREFILL, num_running=3)
    d = await make_worker(Role.DECODE)
    stack = await make_stack(p1, p2, d, dispatch=STALL)
    await _steps_seen(stack, p1)
    freeze = asyncio.create_task(_release_later(stop, 0.2))
    try:
        chunks = await _run(stack.dispatcher.open(_request(max_tokens=5)))
        assert _tokens(chunks) == list(COMPLETION[:5])
        assert p2.names() == ["Prefill"]
        await p1.wait_call("Cancel")
        assert stack.sample("splitserve_router_fallbacks_total", reason="token_stall") == 1
        assert stack.sample("splitserve_router_fallbacks_total", reason="prefill_retry") == 1
    finally:
        frozen.set()
        await freeze


async def test_a_stream_queued_on_a_stepping_worker_is_not_a_stall(
    make_worker: WorkerFactory, make_stack: StackFactory
) -> None:
    """The only worker holds the stream (first token included) for > 3 x the stall timeout
    while its engine steps: no stall, so no 'no decode worker could finish' error."""
    queued = asyncio.Event()
    d = await make_worker(Role.MIXED, hold=queued, step_every_s=0.05)
    stack = await make_stack(d, dispatch=STALL)
    await _steps_seen(stack, d)
    release = asyncio.create_task(_release_later(queued, 1.0))
    try:
        chunks = await _run(stack.dispatcher.open(_request(max_tokens=6)))
        assert _tokens(chunks) == list(COMPLETION[:6])
        assert d.names() == ["Generate"]
        assert stack.sample("splitserve_router_fallbacks_total", reason="token_stall") == 0
    finally:
        queued.set()
        await release


async def test_a_stream_on_a_worker_that_stops_stepping_is_still_a_stall(
    make_worker: WorkerFactory, make_stack: StackFactory
) -> None:
    """Two tokens, then the engine froze (no token, no step): moved to the next worker."""
    frozen, stop = asyncio.Event(), asyncio.Event()
    d1 = await make_worker(
        Role.MIXED, hold=frozen, hold_after=2, step_every_s=0.05, steps_stop=stop
    )
    d2 = await make_worker(Role.MIXED, num_running=3)  # placed second
    stack = await make_stack(d1, d2, dispatch=STALL)
    await _steps_seen(stack, d1)
    stop.set()
    try:
        chunks = await _run(stack.dispatcher.open(_request(max_tokens=6)))
        assert _tokens(chunks) == list(COMPLETION[:6])
        assert d2.names() == ["Generate"]
        await d1.wait_call("Cancel")
        assert stack.sample("splitserve_router_fallbacks_total", reason="token_stall") == 1
    finally:
        frozen.set()
