"""A completion ended by one of `stop_token_ids` leaves that token's text out, as vLLM does.

vLLM's detokenizer drops the last token's text when a request is stop-terminated (an
end-of-text or a `stop_token_ids` token; `include_stop_str_in_output` off, its default): the
token still counts in `usage.completion_tokens`. Found by the new-user probe of
docs/openai-api.md: the router used to send the stop token's text."""

from __future__ import annotations

import json
from typing import Any

import pytest

from splitserve.core.roles import Role
from splitserve.router.tokenizer import TextTokenizer
from tests.unit.router.conftest import MODEL, StackFactory, WorkerFactory

COMPLETION = (300, 301, 302, 303, 304, 305)


def _streamed(body: str) -> tuple[str, Any, str | None]:
    text, usage, reason = "", None, None
    for line in body.splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        event = json.loads(line.removeprefix("data: "))
        for choice in event.get("choices") or ():
            text += choice.get("text") or ""
            reason = choice.get("finish_reason") or reason
        usage = event.get("usage") or usage
    return text, usage, reason


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("pd", [False, True], ids=["aggregated", "pd"])
@pytest.mark.parametrize("stop_at", [0, 3])
async def test_the_stop_tokens_text_is_left_out(
    make_worker: WorkerFactory,
    make_stack: StackFactory,
    tokenizer: TextTokenizer,
    stream: bool,
    pd: bool,
    stop_at: int,
) -> None:
    script = {"completion": COMPLETION}
    if pd:
        workers = [await make_worker(Role.PREFILL, **script), await make_worker(**script)]
    else:
        workers = [await make_worker(Role.MIXED, **script)]
    stack = await make_stack(*workers)
    body: dict[str, Any] = {
        "model": MODEL,
        "prompt": "Once upon a time there was a long prompt",
        "max_tokens": 6,
        "stop_token_ids": [COMPLETION[stop_at]],
    }
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    async with stack.client() as client:
        r = await client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    if stream:
        text, usage, reason = _streamed(r.text)
    else:
        [choice] = r.json()["choices"]
        text, usage, reason = choice["text"], r.json()["usage"], choice["finish_reason"]
    assert reason == "stop"
    assert text == tokenizer.decode(COMPLETION[:stop_at])
    assert usage["completion_tokens"] == stop_at + 1  # the stop token is generated, and counted


async def test_a_completion_that_ends_without_a_stop_token_keeps_its_last_text(
    make_worker: WorkerFactory, make_stack: StackFactory, tokenizer: TextTokenizer
) -> None:
    stack = await make_stack(await make_worker(Role.MIXED, completion=COMPLETION))
    async with stack.client() as client:
        r = await client.post(
            "/v1/completions", json={"model": MODEL, "prompt": "Hi", "max_tokens": 3}
        )
    assert r.json()["choices"][0]["text"] == tokenizer.decode(COMPLETION[:3])
