"""Completions' `echo`: the prompt's text before the answer's, as vLLM and OpenAI write it
(before: refused, "echo is not supported"). With log probabilities it stays a 400 (those of the
prompt are not computed)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from splitserve.core.roles import Role
from splitserve.router.tokenizer import TextTokenizer
from tests.unit.router.conftest import MODEL, StackFactory, WorkerFactory


async def _both(
    make_worker: WorkerFactory, make_stack: StackFactory, tokenizer: TextTokenizer,
    body: dict[str, Any],
) -> tuple[str, str, dict[str, Any]]:  # fmt: skip
    answer = tokenizer.encode(" and so on", add_special_tokens=False)
    w = await make_worker(Role.MIXED, completion=answer)
    stack = await make_stack(w)
    body = {"model": MODEL, "max_tokens": 20, "echo": True, **body}
    async with stack.client() as client:
        r = await client.post("/v1/completions", json=body)
        s = await client.post("/v1/completions", json={**body, "stream": True})
    assert r.status_code == s.status_code == 200, (r.text, s.text)
    streamed = "".join(
        json.loads(x[6:])["choices"][0]["text"]
        for x in s.text.splitlines()
        if x.startswith("data: {") and json.loads(x[6:])["choices"]
    )
    return r.json()["choices"][0]["text"], streamed, r.json()["usage"]


async def test_echo_puts_the_prompt_text_first(
    make_worker: WorkerFactory, make_stack: StackFactory, tokenizer: TextTokenizer
) -> None:
    whole, streamed, usage = await _both(make_worker, make_stack, tokenizer, {"prompt": "Once"})
    assert whole == streamed == "Once and so on"
    assert usage["completion_tokens"] == len(tokenizer.encode(" and so on"))


async def test_echo_of_a_token_prompt_decodes_it(
    make_worker: WorkerFactory, make_stack: StackFactory, tokenizer: TextTokenizer
) -> None:
    ids = tokenizer.encode("Once upon", add_special_tokens=False)
    whole, streamed, _ = await _both(make_worker, make_stack, tokenizer, {"prompt": ids})
    assert whole == streamed == "Once upon and so on"


async def test_echo_of_a_truncated_prompt_echoes_what_was_sent(
    make_worker: WorkerFactory, make_stack: StackFactory, tokenizer: TextTokenizer
) -> None:
    ids = tokenizer.encode("Once upon a time", add_special_tokens=False)
    body = {"prompt": "Once upon a time", "truncate_prompt_tokens": 2}
    whole, _, _ = await _both(make_worker, make_stack, tokenizer, body)
    assert whole == tokenizer.decode(ids[-2:]) + " and so on"


@pytest.mark.parametrize("engine", ["vllm", "sim"])
async def test_echo_with_logprobs_is_refused(
    make_worker: WorkerFactory, make_stack: StackFactory, engine: str
) -> None:
    w = await make_worker(Role.MIXED, engine=engine)
    stack = await make_stack(w)
    body = {"model": MODEL, "prompt": "x", "max_tokens": 2, "echo": True, "logprobs": 1}
    async with stack.client() as client:
        r = await client.post("/v1/completions", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] in {"echo", "logprobs"}
