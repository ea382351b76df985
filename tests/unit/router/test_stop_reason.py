"""`stop_reason` on a choice, as vLLM's OpenAI server writes it: the stop string that ended the
answer, or the `stop_token_ids` token (its id), else null (a length cut, an end-of-text token).

Found comparing `make run` with `vllm serve` on the same requests: the router sent no
`stop_reason`, so a client reading it (vLLM's extension) saw null for every stop string."""

from __future__ import annotations

import json
from typing import Any

import pytest

from splitserve.core.roles import Role
from splitserve.router.tokenizer import TextTokenizer
from tests.unit.router.conftest import MODEL, StackFactory, WorkerFactory

TEXT = "Hello from the fake worker!"


def _final_choice(r: Any, stream: bool) -> dict[str, Any]:
    """The choice that carries the finish reason (the last one with a finish, streamed)."""
    if not stream:
        [choice] = r.json()["choices"]
        return dict(choice)
    final: dict[str, Any] = {}
    for line in r.text.splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        for choice in json.loads(line.removeprefix("data: ")).get("choices") or ():
            if choice.get("finish_reason"):
                final = choice
    return final


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("chat", [False, True], ids=["completion", "chat"])
@pytest.mark.parametrize("pd", [False, True], ids=["aggregated", "pd"])
@pytest.mark.parametrize(
    ("extra", "want_reason", "want"),
    [
        ({"stop": ["zzz", "fake"]}, "stop", "fake"),
        ({"max_tokens": 2}, "length", None),
        ({}, "stop", None),  # the answer ended by itself (end of text)
        ("stop_token", "stop", "stop_token"),
    ],
    ids=["stop-string", "length", "end-of-text", "stop-token-id"],
)
async def test_stop_reason_names_what_ended_the_answer(
    make_worker: WorkerFactory,
    make_stack: StackFactory,
    tokenizer: TextTokenizer,
    stream: bool,
    chat: bool,
    pd: bool,
    extra: Any,
    want_reason: str,
    want: Any,
) -> None:
    completion = tuple(tokenizer.encode(TEXT))
    if extra == "stop_token":  # the fourth token of the answer ends it
        extra, want = {"stop_token_ids": [completion[3]]}, completion[3]
    script = {"completion": completion}
    if pd:
        workers = [await make_worker(Role.PREFILL, **script), await make_worker(**script)]
    else:
        workers = [await make_worker(Role.MIXED, **script)]
    stack = await make_stack(*workers)
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 64, "stream": stream, **extra}
    if chat:
        body["messages"] = [{"role": "user", "content": "hi"}]
    else:
        body["prompt"] = "hi"
    async with stack.client() as client:
        r = await client.post("/v1/chat/completions" if chat else "/v1/completions", json=body)
    assert r.status_code == 200, r.text
    choice = _final_choice(r, stream)
    assert choice["finish_reason"] == want_reason
    assert "stop_reason" in choice
    assert choice["stop_reason"] == want
