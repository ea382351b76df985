"""Completions' `echo` and vLLM's `prompt_logprobs` (before: refused, "echo is not supported",
and an unknown field): the prompt's text before the answer's; with `logprobs`, the prompt's
log probabilities first, as vLLM writes them (what lm-eval's loglikelihood tasks read)."""

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


async def test_echo_with_logprobs_opens_the_logprobs_with_the_prompt(
    make_worker: WorkerFactory, make_stack: StackFactory, tokenizer: TextTokenizer
) -> None:
    """What lm-eval's loglikelihood tasks send (a token prompt, `echo`, `logprobs: 1`,
    `max_tokens: 1`): `logprobs` covers the prompt's tokens then the answer's, the first
    position null, as vLLM writes it; the engine is asked for the prompt's log probabilities."""
    answer = tokenizer.encode(" and so on", add_special_tokens=False)
    w = await make_worker(Role.MIXED, completion=answer, engine="vllm")
    stack = await make_stack(w)
    ids = tokenizer.encode("Once upon a time", add_special_tokens=False)
    body = {"model": MODEL, "prompt": [ids], "max_tokens": 1, "echo": True, "logprobs": 1}
    async with stack.client() as client:
        r = await client.post("/v1/completions", json=body)
        s = await client.post("/v1/completions", json={**body, "stream": True})
    assert r.status_code == 200, r.text
    [gen] = w.requests("Generate")
    assert gen.sampling.prompt_logprobs
    assert gen.sampling.prompt_top_logprobs == 1
    choice = r.json()["choices"][0]
    lp = choice["logprobs"]
    n = len(ids)
    assert choice["text"] == tokenizer.decode(ids) + tokenizer.decode(answer[:1])
    assert lp["tokens"] == [
        tokenizer.decode([t], skip_special_tokens=False) for t in [*ids, answer[0]]
    ]
    assert lp["token_logprobs"][0] is None
    assert lp["top_logprobs"][0] is None
    # the fake worker's prompt token at position i: -2 - i / 100
    assert lp["token_logprobs"][1:n] == pytest.approx([-2 - i / 100 for i in range(1, n)])
    assert all(len(top) == 2 for top in lp["top_logprobs"][1:n])  # the token + 1, as vLLM
    assert lp["token_logprobs"][n] == pytest.approx(-1 - answer[0] / 100)  # the answer's
    assert lp["text_offset"][0] == 0
    assert "prompt_logprobs" not in choice
    assert s.status_code == 400  # not streamed
    assert s.json()["error"]["param"] == "echo"


@pytest.mark.parametrize("chat", [False, True])
async def test_prompt_logprobs_as_vllm_writes_them(
    make_worker: WorkerFactory, make_stack: StackFactory, tokenizer: TextTokenizer, chat: bool
) -> None:
    p = await make_worker(Role.PREFILL, engine="vllm")
    d = await make_worker(Role.DECODE, engine="vllm")
    stack = await make_stack(p, d)  # P/D: the prefill worker computes them
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 3, "prompt_logprobs": 2}
    if chat:
        route = "/v1/chat/completions"
        body["messages"] = [{"role": "user", "content": "Hi"}]
    else:
        route = "/v1/completions"
        body["prompt"] = "Once upon a time"
    async with stack.client() as client:
        r = await client.post(route, json=body)
        s = await client.post(route, json={**body, "stream": True})
    assert r.status_code == 200, r.text
    [pre] = p.requests("Prefill")
    assert pre.sampling.prompt_logprobs
    assert pre.sampling.prompt_top_logprobs == 2
    prompt = list(pre.prompt_token_ids)
    whole = r.json()
    got = (whole if chat else whole["choices"][0])["prompt_logprobs"]
    assert len(got) == len(prompt)
    assert got[0] is None
    for i, (token, entry) in enumerate(zip(prompt[1:], got[1:], strict=True), 1):
        first_id, first = next(iter(entry.items()))
        assert first_id == str(token)
        assert first["logprob"] == pytest.approx(-2 - i / 100)
        assert first["rank"] == 7
        assert first["decoded_token"] == tokenizer.decode([token], skip_special_tokens=False)
        assert [e["rank"] for e in list(entry.values())[1:]] == [1, 2][: len(entry) - 1]
    assert s.status_code == 400
    assert s.json()["error"]["param"] == "prompt_logprobs"


async def test_prompt_logprobs_on_the_simulated_engine_are_refused(
    make_worker: WorkerFactory, make_stack: StackFactory
) -> None:
    w = await make_worker(Role.MIXED, engine="sim")
    stack = await make_stack(w)
    async with stack.client() as client:
        r = await client.post(
            "/v1/completions",
            json={"model": MODEL, "prompt": "x", "max_tokens": 2, "prompt_logprobs": 1},
        )
        e = await client.post(
            "/v1/completions",
            json={"model": MODEL, "prompt": "x", "max_tokens": 2, "echo": True, "logprobs": 1},
        )
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "prompt_logprobs"
    assert e.status_code == 400, e.text
    assert e.json()["error"]["param"] == "logprobs"
