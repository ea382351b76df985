"""vLLM's `truncate_prompt_tokens` and `return_tokens_as_token_ids` (before: refused as
unknown fields)."""

from __future__ import annotations

from typing import Any

import pytest

from splitserve.core.roles import Role
from splitserve.router.tokenizer import TextTokenizer
from tests.unit.router.conftest import MODEL, StackFactory, WorkerFactory

TEXT = "Once upon a time there was a router that read every field it was sent"


async def _post(
    make_worker: WorkerFactory, make_stack: StackFactory, body: dict[str, Any], **kw: Any
) -> tuple[int, Any, list[int]]:
    w = await make_worker(Role.MIXED, engine="vllm")
    stack = await make_stack(w, **kw)
    route = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    async with stack.client() as client:
        r = await client.post(route, json={"model": MODEL, "max_tokens": 3, **body})
    sent = w.requests("Generate")
    return r.status_code, r.json(), list(sent[0].prompt_token_ids) if sent else []


@pytest.mark.parametrize("chat", [False, True])
async def test_truncate_prompt_tokens_keeps_the_last_k(
    make_worker: WorkerFactory, make_stack: StackFactory, tokenizer: TextTokenizer, chat: bool
) -> None:
    body: dict[str, Any] = (
        {"messages": [{"role": "user", "content": TEXT}]} if chat else {"prompt": TEXT}
    )
    status, _, whole = await _post(make_worker, make_stack, body)
    assert status == 200
    status, answer, cut = await _post(
        make_worker, make_stack, {**body, "truncate_prompt_tokens": 5}
    )
    assert status == 200, answer
    assert cut == whole[-5:]
    assert answer["usage"]["prompt_tokens"] == 5


@pytest.mark.parametrize(
    ("k", "why"), [(0, "truncate_prompt_tokens"), (-2, "truncate_prompt_tokens")]
)
async def test_truncate_prompt_tokens_out_of_range_is_400(
    make_worker: WorkerFactory, make_stack: StackFactory, k: int, why: str
) -> None:
    status, answer, _ = await _post(
        make_worker, make_stack, {"prompt": TEXT, "truncate_prompt_tokens": k}
    )
    assert status == 400, answer
    assert answer["error"]["param"] == why


async def test_truncate_prompt_tokens_above_the_context_is_400_and_minus_one_is_the_context(
    make_worker: WorkerFactory, make_stack: StackFactory
) -> None:
    status, answer, _ = await _post(
        make_worker, make_stack, {"prompt": TEXT, "truncate_prompt_tokens": 100}, max_model_len=64
    )
    assert status == 400, answer
    assert answer["error"]["param"] == "truncate_prompt_tokens"
    assert "max_model_len" in answer["error"]["message"]
    long = " ".join([TEXT] * 10)
    status, answer, sent = await _post(
        make_worker,
        make_stack,
        {"prompt": long, "truncate_prompt_tokens": -1, "max_tokens": None},
        max_model_len=64,
    )
    # -1: the context's length, as vLLM: no room is left for an answer, a 400
    assert status == 400, answer
    assert sent == []
    status, answer, short = await _post(
        make_worker, make_stack, {"prompt": TEXT, "truncate_prompt_tokens": -1}, max_model_len=64
    )
    assert status == 200, answer
    assert answer["usage"]["prompt_tokens"] == len(short) < 64


async def test_return_tokens_as_token_ids_writes_ids_in_logprobs(
    make_worker: WorkerFactory, make_stack: StackFactory
) -> None:
    body = {"prompt": "x", "logprobs": 1, "return_tokens_as_token_ids": True}
    status, answer, _ = await _post(make_worker, make_stack, body)
    assert status == 200, answer
    lp = answer["choices"][0]["logprobs"]
    assert lp["tokens"]
    assert all(t.startswith("token_id:") and t[9:].isdigit() for t in lp["tokens"])
    assert all(k.startswith("token_id:") for top in lp["top_logprobs"] for k in top)
    chat = {"messages": [{"role": "user", "content": "x"}], "logprobs": True, "top_logprobs": 2,
            "return_tokens_as_token_ids": True}  # fmt: skip
    status, answer, _ = await _post(make_worker, make_stack, chat)
    assert status == 200, answer
    content = answer["choices"][0]["logprobs"]["content"]
    assert all(c["token"].startswith("token_id:") for c in content)
    assert all(t["token"].startswith("token_id:") for c in content for t in c["top_logprobs"])


async def test_return_tokens_as_token_ids_without_logprobs_is_400(
    make_worker: WorkerFactory, make_stack: StackFactory
) -> None:
    status, answer, _ = await _post(
        make_worker, make_stack, {"prompt": "x", "return_tokens_as_token_ids": True}
    )
    assert status == 400, answer
    assert answer["error"]["param"] == "return_tokens_as_token_ids"
