"""vLLM's `include_stop_str_in_output` and `skip_special_tokens` act on the router's text.

Before: both were refused as unknown fields (400), so a client written for `vllm serve` that
sets them could not run against splitserve. vLLM's semantics: `include_stop_str_in_output`
keeps the stop string, or the stop token's text, at the end of the answer (`stop_reason` names
it either way); `skip_special_tokens: false` keeps special tokens' text (end of text, ...) in
the answer; neither changes the tokens or the usage.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from splitserve.core.roles import Role
from splitserve.router.tokenizer import TextTokenizer
from tests.unit.router.conftest import MODEL, StackFactory, WorkerFactory


async def _texts(
    make_worker: WorkerFactory,
    make_stack: StackFactory,
    completion: list[int],
    extra: dict[str, Any],
    route: str = "/v1/completions",
) -> tuple[str, str, Any]:
    """The answer's text without streaming, streamed, and the choice's stop_reason."""
    w = await make_worker(Role.MIXED, completion=completion)
    stack = await make_stack(w)
    if route == "/v1/completions":
        body: dict[str, Any] = {"model": MODEL, "prompt": "Say it", "max_tokens": 30, **extra}
    else:
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": "Say it"}],
            "max_tokens": 30,
            **extra,
        }
    async with stack.client() as client:
        r = await client.post(route, json=body)
        assert r.status_code == 200, r.text
        s = await client.post(route, json={**body, "stream": True})
        assert s.status_code == 200, s.text
    choice = r.json()["choices"][0]
    whole = choice["text"] if "text" in choice else choice["message"]["content"]
    streamed = ""
    for line in s.text.splitlines():
        if line.startswith("data: {"):
            for c in json.loads(line[6:])["choices"]:
                streamed += c.get("text") or (c.get("delta") or {}).get("content") or ""
    return whole, streamed, choice["stop_reason"]


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
async def test_include_stop_str_in_output_keeps_the_stop_string(
    make_worker: WorkerFactory, make_stack: StackFactory, tokenizer: TextTokenizer, route: str
) -> None:
    completion = tokenizer.encode("Hello world. And more!", add_special_tokens=False)
    cut = await _texts(make_worker, make_stack, completion, {"stop": ["."]}, route)
    kept = await _texts(
        make_worker,
        make_stack,
        completion,
        {"stop": ["."], "include_stop_str_in_output": True},
        route,
    )
    assert cut == ("Hello world", "Hello world", ".")
    assert kept == ("Hello world.", "Hello world.", ".")


async def test_include_stop_str_in_output_keeps_the_stop_token_s_text(
    make_worker: WorkerFactory, make_stack: StackFactory, tokenizer: TextTokenizer
) -> None:
    completion = tokenizer.encode("Hello world! And more", add_special_tokens=False)
    [bang] = tokenizer.encode("!", add_special_tokens=False)
    assert bang in completion
    ask = {"stop_token_ids": [bang]}
    cut = await _texts(make_worker, make_stack, completion, ask)
    kept = await _texts(
        make_worker, make_stack, completion, {**ask, "include_stop_str_in_output": True}
    )
    assert cut == ("Hello world", "Hello world", bang)
    assert kept == ("Hello world!", "Hello world!", bang)


async def test_skip_special_tokens_false_keeps_their_text(
    make_worker: WorkerFactory, make_stack: StackFactory, tokenizer: TextTokenizer
) -> None:
    eos = tokenizer.stop_token_ids[0]
    eos_text = tokenizer.decode([eos], skip_special_tokens=False)
    completion = [
        *tokenizer.encode("Hi", add_special_tokens=False),
        eos,
        *tokenizer.encode(" there", add_special_tokens=False),
    ]
    ask = {"ignore_eos": True}  # the end-of-text token does not end the answer
    skipped = await _texts(make_worker, make_stack, completion, ask)
    kept = await _texts(make_worker, make_stack, completion, {**ask, "skip_special_tokens": False})
    assert skipped[:2] == ("Hi there", "Hi there")
    assert kept[:2] == (f"Hi{eos_text} there", f"Hi{eos_text} there")


@pytest.mark.parametrize("field", ["include_stop_str_in_output", "skip_special_tokens"])
async def test_the_fields_are_booleans(
    make_worker: WorkerFactory, make_stack: StackFactory, field: str
) -> None:
    w = await make_worker(Role.MIXED)
    stack = await make_stack(w)
    async with stack.client() as client:
        r = await client.post(
            "/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 3, field: "yes"}
        )
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == field


def _events(text: str) -> list[dict[str, Any]]:
    return [json.loads(x[6:]) for x in text.splitlines() if x.startswith("data: {")]


@pytest.mark.parametrize("chat", [False, True])
async def test_return_token_ids_gives_the_prompt_s_and_the_answer_s_ids(
    make_worker: WorkerFactory, make_stack: StackFactory, tokenizer: TextTokenizer, chat: bool
) -> None:
    """vLLM's `return_token_ids` (RL frameworks read it): the prompt's ids (on the choice for
    completions, at the top for chat; in a stream on the first chunk only) and the answer's ids,
    the stop token included (a stream: each chunk's own). Without it neither is sent."""
    completion = [*tokenizer.encode("Hello world. And more", add_special_tokens=False)]
    eos = tokenizer.stop_token_ids[0]
    w = await make_worker(Role.MIXED, completion=[*completion, eos, 7, 7])
    stack = await make_stack(w)
    if chat:
        route = "/v1/chat/completions"
        body: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}]}
    else:
        route = "/v1/completions"
        body = {"model": MODEL, "prompt": "Say it"}
    body |= {"max_tokens": 30, "stop": ["."], "return_token_ids": True}
    async with stack.client() as client:
        r = await client.post(route, json=body)
        s = await client.post(route, json={**body, "stream": True})
        plain = await client.post(route, json={**body, "return_token_ids": False, "stream": True})
        plain_whole = await client.post(route, json={**body, "return_token_ids": False})
    assert r.status_code == s.status_code == 200, (r.text, s.text)
    [gen] = w.requests("Generate")[:1]
    prompt = list(gen.prompt_token_ids)
    answer = completion[: completion.index(tokenizer.encode(".", add_special_tokens=False)[0]) + 1]
    whole = r.json()
    choice = whole["choices"][0]
    assert choice["token_ids"] == answer  # up to the token that completed the stop string
    assert (whole if chat else choice)["prompt_token_ids"] == prompt
    events = _events(s.text)
    first, *rest = events
    holder = first if chat else first["choices"][0]
    assert holder["prompt_token_ids"] == prompt
    assert all("prompt_token_ids" not in e and "prompt_token_ids" not in e["choices"][0]
               for e in rest)  # fmt: skip
    assert [t for e in events for t in e["choices"][0].get("token_ids") or ()] == answer
    for e in [*_events(plain.text), plain_whole.json()]:
        assert "prompt_token_ids" not in e
        assert "token_ids" not in e["choices"][0]
        assert "prompt_token_ids" not in e["choices"][0]


async def test_return_token_ids_with_a_stop_token_includes_it(
    make_worker: WorkerFactory, make_stack: StackFactory, tokenizer: TextTokenizer
) -> None:
    completion = tokenizer.encode("Hello world", add_special_tokens=False)
    eos = tokenizer.stop_token_ids[0]
    w = await make_worker(Role.MIXED, completion=[*completion, eos, 7])
    stack = await make_stack(w)
    body = {"model": MODEL, "prompt": "Say it", "max_tokens": 30, "return_token_ids": True}
    async with stack.client() as client:
        r = await client.post("/v1/completions", json=body)
        s = await client.post("/v1/completions", json={**body, "stream": True})
    assert r.json()["choices"][0]["token_ids"] == [*completion, eos]
    assert r.json()["choices"][0]["text"] == "Hello world"
    streamed = [t for e in _events(s.text) for t in e["choices"][0].get("token_ids") or ()]
    assert streamed == [*completion, eos]


@pytest.mark.parametrize(("priority", "status"), [(0, 200), (1, 400), (-5, 400)])
async def test_priority_zero_is_accepted_and_any_other_is_refused_naming_the_slo_header(
    make_worker: WorkerFactory, make_stack: StackFactory, priority: int, status: int
) -> None:
    """vLLM's `priority` orders requests only under its priority scheduler; splitserve orders
    them by SLO class. 0 (vLLM's default, which some clients always send) asks for nothing;
    another value is a 400 that says what to use instead (it was refused as unknown, even 0)."""
    w = await make_worker(Role.MIXED)
    stack = await make_stack(w)
    async with stack.client() as client:
        r = await client.post(
            "/v1/completions",
            json={"model": MODEL, "prompt": "x", "max_tokens": 3, "priority": priority},
        )
    assert r.status_code == status, r.text
    if status == 400:
        err = r.json()["error"]
        assert err["param"] == "priority"
        assert "x-slo-class" in err["message"]
