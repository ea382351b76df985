"""The fast lane (`router.fast_lane`): mid-stream chunks handled in the worker link's reader
write what the request's task writes, and everything else still goes through the task.

How tokens group into events depends on timing on both paths (chunks that queue while the task
is busy are merged, `mux._merge`), so two runs are compared with consecutive plain text deltas
joined (`_events`); every other event (role, final chunk, usage, log probabilities, errors,
`[DONE]`) is compared byte for byte.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import pytest

from splitserve.core.roles import Role
from splitserve.router import openai_models as wire
from splitserve.router.client_link import ClientLink
from splitserve.router.fast_lane import ENV, FastLane, enabled_from_env
from splitserve.router.generation import GenerationParams
from splitserve.router.http_sse import EdgeSseResponse, EdgeStream
from splitserve.router.openai_stream import stream_body
from splitserve.router.server import RouterServer
from splitserve.router.tokenizer import TextTokenizer
from tests.unit.router.conftest import MODEL, ServerFactory, StackFactory, WorkerFactory
from tests.unit.router.test_http_sse import _Cycle, _exchange, _normal, _request

TEXT = "The quick brown fox jumps over the lazy dog, and then it runs far away."
_DELAY_S = 0.002  # the fake worker's time per token: most tokens arrive one by one


def _events(body: bytes, *, loose: bool = False) -> list[bytes]:
    """The SSE events of `body` with the text taken out of them (it comes last, whole), and the
    events left with nothing but an empty delta dropped: how tokens were grouped into events
    does not show. `loose` (for requests that never take the lane, whose per-event log
    probabilities and running usage also follow the grouping): each event reduced to its finish
    reason, the last event's usage kept."""
    out: list[bytes] = []
    text: list[str] = []
    for raw in body.split(b"\n\n"):
        if not raw:
            continue
        if not raw.startswith(b"data: {"):
            out.append(raw)
            continue
        ev = json.loads(raw[6:])
        choices = ev.get("choices") or []
        for c in choices:
            if "delta" in c:
                text.append(c["delta"].pop("content", ""))
            elif "text" in c:
                text.append(c.pop("text"))
        finish = [c.get("finish_reason") for c in choices]
        if loose:
            if any(finish):
                out.append(json.dumps(finish).encode())
            last_usage = ev.get("usage")
            continue
        plain = len(choices) == 1 and not any(finish) and choices[0].get("logprobs") is None
        if plain and ev.get("usage") is None and not choices[0].get("delta"):
            continue
        out.append(json.dumps(ev).encode())
    if loose:
        out.append(json.dumps(last_usage).encode())
    out.append("".join(text).encode())
    return out


_USAGE = {"stream_options": {"include_usage": True}}
_CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "stream": True}
_TEXT = {"model": MODEL, "prompt": "Foxes", "max_tokens": 12, "stream": True}
CASES: dict[str, tuple[str, dict[str, Any], bool]] = {
    # name: (path, payload, may take the lane)
    "chat": ("/v1/chat/completions", {**_CHAT, **_USAGE}, True),
    "completion": ("/v1/completions", _TEXT, True),
    "chat-stop-string": ("/v1/chat/completions", {**_CHAT, "stop": ["lazy"], **_USAGE}, False),
    "completion-logprobs": ("/v1/completions", {**_TEXT, "logprobs": 2}, False),
    "chat-continuous-usage": (
        "/v1/chat/completions",
        {**_CHAT, "stream_options": {"include_usage": True, "continuous_usage_stats": True}},
        False,
    ),
}


async def _serve_all(server: RouterServer) -> dict[str, tuple[list[bytes], list[bytes], int]]:
    assert server.http_port is not None
    out = {}
    for name, (path, payload, may_take) in CASES.items():
        before = FastLane.taken_total
        ((head, body),) = await _exchange(server.http_port, [_request(path, payload)])
        lines, body = _normal(head, body)
        body = re.sub(rb'"created":\d+', b'"created":0', body)  # the wall clock's second
        out[name] = (lines, _events(body, loose=not may_take), FastLane.taken_total - before)
    return out


@pytest.mark.parametrize("pd", [False, True], ids=["aggregated", "prefill-decode"])
async def test_the_lane_writes_what_the_requests_task_writes(
    make_worker: WorkerFactory, make_router: ServerFactory, tokenizer: TextTokenizer, pd: bool
) -> None:
    completion = tuple(tokenizer.encode(TEXT))
    roles = (Role.PREFILL, Role.DECODE) if pd else (Role.MIXED,)
    workers = [await make_worker(r, engine="vllm") for r in roles]  # it serves log probabilities
    for w in workers:
        w.script.completion = completion
        w.script.token_delay_s = _DELAY_S
    server = await make_router(*(w.address for w in workers))
    generator = server._generator
    assert generator is not None
    assert generator.fast_lane
    fast = await _serve_all(server)
    generator.fast_lane = False
    slow = await _serve_all(server)
    for name, (_, _, may_take) in CASES.items():
        f_head, f_events, f_taken = fast[name]
        s_head, s_events, s_taken = slow[name]
        assert f_head == s_head, name
        assert f_events == s_events, name
        assert s_taken == 0, name
        assert (f_taken > 0) is may_take, name
    *chat_events, chat_text = fast["chat"][1]
    assert chat_text == TEXT.encode()
    assert chat_events[-1] == b"data: [DONE]"
    assert b'"finish_reason": "stop"' in chat_events[-3]  # then the usage chunk, then [DONE]
    assert b'"completion_tokens": %d' % len(completion) in chat_events[-2]
    assert fast["completion"][1][-1] == TEXT.encode()[: len(fast["completion"][1][-1])]
    *stop_events, stop_text = fast["chat-stop-string"][1]
    assert stop_text == TEXT.split("lazy")[0].encode()
    assert b'["stop"]' in stop_events


# -- the chain driven by hand, against a recording connection ----------------------------------


class _PausingTransport:
    """Pauses the connection (flow control) after its `pause_at`-th write, resumes a little
    later; records whether any write happened while paused."""

    def __init__(self, cycle: _Cycle, pause_at: int) -> None:
        self.cycle = cycle
        self.writes: list[bytes] = []
        self.pause_at = pause_at
        self.written_while_paused = False
        self.closed = False

    def write(self, data: bytes) -> None:
        flow = self.cycle.flow
        self.written_while_paused |= flow.write_paused
        self.writes.append(data)
        if len(self.writes) == self.pause_at:
            flow.write_paused = True
            asyncio.get_running_loop().call_later(0.03, self._resume)

    def _resume(self) -> None:
        self.cycle.flow.write_paused = False
        self.cycle.flow.resumed.set()

    def close(self) -> None:
        self.closed = True


async def _drive(
    stack: Any, cycle: _Cycle, tokenizer: TextTokenizer, *, lane_on: bool, rid: str
) -> FastLane | None:
    """Generator -> stream_body -> EdgeSseResponse for one chat stream, as `openai_api` does."""
    gen = stack.generator
    request = gen.build_request(rid, tokenizer.encode("Foxes"), GenerationParams(max_tokens=20))
    lane = FastLane() if lane_on else None
    chunks = gen.stream(request, (), lane)
    first = await anext(chunks)
    fmt = wire.Formatter(chat=True, response_id="chatcmpl-x", created=1, model=MODEL)
    body = stream_body(fmt, first, chunks, include_usage=True, lane=lane)
    response = EdgeSseResponse(body, ClientLink(), EdgeStream(cycle), None, hold_first=True,
                               lane=lane)  # fmt: skip
    await response({}, None, None)
    return lane


def _body(writes: list[bytes]) -> bytes:
    raw = b"".join(writes)
    raw = raw[raw.index(b"\r\n\r\n") + 4 :]
    out = b""
    while True:
        size_end = raw.index(b"\r\n")
        size = int(raw[:size_end], 16)
        if size == 0:
            return out
        out += raw[size_end + 2 : size_end + 2 + size]
        raw = raw[size_end + 4 + size :]


async def test_a_paused_connection_sends_chunks_through_the_task(
    make_worker: WorkerFactory, make_stack: StackFactory, tokenizer: TextTokenizer
) -> None:
    w = await make_worker(Role.MIXED, completion=tuple(tokenizer.encode(TEXT)))
    w.script.token_delay_s = _DELAY_S
    stack = await make_stack(w)
    bodies = []
    for lane_on in (True, False):
        cycle = _Cycle()
        transport = _PausingTransport(cycle, pause_at=3)
        cycle.transport = transport  # type: ignore[assignment]
        lane = await _drive(stack, cycle, tokenizer, lane_on=lane_on, rid=f"r-{lane_on}")
        assert not transport.written_while_paused  # neither path writes on a paused connection
        assert cycle.response_complete
        bodies.append(_events(_body(transport.writes)))
        if lane is not None:
            assert lane.taken > 0
    assert bodies[0] == bodies[1]
    assert bodies[0][-2] == b"data: [DONE]"
    assert bodies[0][-1]  # the text


async def test_a_client_gone_mid_stream_cancels_the_worker_op(
    make_worker: WorkerFactory, make_stack: StackFactory, tokenizer: TextTokenizer
) -> None:
    w = await make_worker(Role.MIXED, completion=tuple(tokenizer.encode(TEXT)))
    hold = asyncio.Event()
    w.script.hold, w.script.hold_after = hold, 6  # tokens after the 6th never come
    w.script.token_delay_s = 0.01  # tokens 2-6 find the task parked (else they queue)
    stack = await make_stack(w)
    gen = stack.generator
    request = gen.build_request("gone", tokenizer.encode("Foxes"), GenerationParams(max_tokens=20))
    lane = FastLane()
    chunks = gen.stream(request, (), lane)
    first = await anext(chunks)
    fmt = wire.Formatter(chat=True, response_id="chatcmpl-x", created=1, model=MODEL)
    body = stream_body(fmt, first, chunks, include_usage=True, lane=lane)
    cycle, link = _Cycle(), ClientLink()
    task = asyncio.create_task(
        EdgeSseResponse(body, link, EdgeStream(cycle), None, hold_first=True, lane=lane)(
            {}, None, None
        )
    )
    # Tokens 2-6 are mid-stream chunks: the lane takes those that find the task parked.
    for _ in range(2000):
        if lane.taken >= 2 or task.done():
            break
        await asyncio.sleep(0.005)
    assert lane.taken >= 2
    assert not task.done()
    writes = len(cycle.transport.writes)
    cycle.disconnected = True  # what uvicorn's connection_lost does, then the edge's link
    link.lost()
    await task
    assert lane.out is None
    assert lane.sub is None
    await stack.dispatcher.drain_background()
    assert "gone" in w.cancelled
    hold.set()
    await asyncio.sleep(0.05)
    assert len(cycle.transport.writes) == writes  # nothing written after the client left


def test_the_switch_reads_its_variable() -> None:
    assert enabled_from_env({}) is True
    assert enabled_from_env({ENV: "1"}) is True
    assert enabled_from_env({ENV: "0"}) is False
    with pytest.raises(ValueError, match=ENV):
        enabled_from_env({ENV: "yes"})


async def test_a_failure_in_the_lane_fails_its_request_alone(
    make_worker: WorkerFactory, make_stack: StackFactory, tokenizer: TextTokenizer
) -> None:
    w = await make_worker(Role.MIXED, completion=tuple(tokenizer.encode(TEXT)))
    w.script.token_delay_s = _DELAY_S
    stack = await make_stack(w)
    gen = stack.generator
    request = gen.build_request("boom", tokenizer.encode("Foxes"), GenerationParams(max_tokens=20))
    lane = FastLane()
    chunks = gen.stream(request, (), lane)
    first = await anext(chunks)
    assert lane.detok is not None

    def boom(token_ids: Any) -> str:
        raise RuntimeError("scripted detokenizer failure")

    lane.detok.push = boom  # type: ignore[method-assign]
    fmt = wire.Formatter(chat=True, response_id="chatcmpl-x", created=1, model=MODEL)
    body = stream_body(fmt, first, chunks, include_usage=True, lane=lane)
    response = EdgeSseResponse(body, ClientLink(), EdgeStream(_Cycle()), None, lane=lane)
    with pytest.raises(RuntimeError, match="scripted detokenizer failure"):
        await response({}, None, None)
    await stack.dispatcher.drain_background()
    assert "boom" in w.cancelled
    # The worker's link still serves the next request, through the lane.
    cycle = _Cycle()
    after = await _drive(stack, cycle, tokenizer, lane_on=True, rid="after")
    assert after is not None
    assert after.taken > 0
    assert cycle.response_complete


def test_the_lanes_write_is_the_responses_framing() -> None:
    """The lane writes `fmt.delta_event(text)` framed as `EdgeSseResponse` frames a body part:
    for the same text, the same bytes as the task's path (`stream_body`'s plain delta)."""
    from splitserve.router.http_sse import _chunk
    from splitserve.router.openai_stream import sse

    cycle = _Cycle()
    fmt = wire.Formatter(chat=True, response_id="chatcmpl-x", created=1, model=MODEL)
    event = fmt.delta_event('a "quoted" é\n', with_usage=True)
    assert event == sse(fmt.chunk('a "quoted" é\n', None, with_usage=True))
    EdgeStream(cycle).write_chunk_now(event)
    assert cycle.transport.writes == [_chunk(event)]
    cycle.flow.write_paused = True
    assert not EdgeStream(cycle).writable
    cycle.flow.write_paused, cycle.disconnected = False, True
    assert not EdgeStream(cycle).writable
