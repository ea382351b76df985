"""vLLM's chat-template request fields: `chat_template_kwargs`, `add_generation_prompt`,
`continue_final_message` (chat completions).

Before: all three were refused as unknown fields (400), so e.g. Qwen3's
`chat_template_kwargs: {"enable_thinking": false}` could not be sent. Now they act as in vLLM;
a template variable the served template does not read, or one the router sets itself, is a 400
naming it (it would be a silent no-op)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from splitserve.api.router_edge import EdgeSettings
from splitserve.core.roles import Role
from splitserve.router.tokenizer import TextTokenizer, build_default_tokenizer
from tests.unit.router.conftest import MODEL, StackFactory, WorkerFactory

THINK = "{% if enable_thinking is defined and not enable_thinking %}/no_think{% endif %}"


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> TextTokenizer:
    """The default tokenizer with a template that reads `enable_thinking` (as Qwen3's does)."""
    d = build_default_tokenizer(tmp_path_factory.mktemp("think"))
    template = Path(d) / "chat_template.jinja"
    template.write_text(template.read_text() + THINK)
    return TextTokenizer.from_dir(d)


async def _prompt(
    make_worker: WorkerFactory, make_stack: StackFactory, extra: dict[str, Any], messages: Any
) -> tuple[int, list[int], Any]:
    w = await make_worker(Role.MIXED)
    stack = await make_stack(w)
    body = {"model": MODEL, "messages": messages, "max_tokens": 2, **extra}
    async with stack.client() as client:
        r = await client.post("/v1/chat/completions", json=body)
    sent = w.requests("Generate")
    return r.status_code, list(sent[0].prompt_token_ids) if sent else [], r.json()


USER = [{"role": "user", "content": "Hello"}]


async def test_chat_template_kwargs_reach_the_template(
    make_worker: WorkerFactory, make_stack: StackFactory, tokenizer: TextTokenizer
) -> None:
    status, plain, _ = await _prompt(make_worker, make_stack, {}, USER)
    assert status == 200
    status, off, _ = await _prompt(
        make_worker, make_stack, {"chat_template_kwargs": {"enable_thinking": False}}, USER
    )
    assert status == 200
    text = tokenizer.decode(off, skip_special_tokens=False)
    assert text == tokenizer.decode(plain, skip_special_tokens=False) + "/no_think"


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"reasoning_effort": "low"}, "chat_template_kwargs.reasoning_effort"),
        ({"messages": []}, "chat_template_kwargs.messages"),
        ({"bos_token": "x"}, "chat_template_kwargs.bos_token"),
        ({"add_generation_prompt": False}, "chat_template_kwargs.add_generation_prompt"),
    ],
)
async def test_a_template_variable_it_does_not_read_or_that_the_router_sets_is_refused(
    make_worker: WorkerFactory, make_stack: StackFactory, kwargs: dict[str, Any], named: str
) -> None:
    status, _, body = await _prompt(make_worker, make_stack, {"chat_template_kwargs": kwargs}, USER)
    assert status == 400, body
    assert body["error"]["param"] == named


async def test_add_generation_prompt_false_leaves_out_the_assistant_header(
    make_worker: WorkerFactory, make_stack: StackFactory, tokenizer: TextTokenizer
) -> None:
    status, ids, _ = await _prompt(make_worker, make_stack, {"add_generation_prompt": False}, USER)
    assert status == 200
    assert ids == tokenizer.apply_chat_template(USER, add_generation_prompt=False)
    assert ids != tokenizer.apply_chat_template(USER)


async def test_continue_final_message_leaves_the_last_message_open(
    make_worker: WorkerFactory, make_stack: StackFactory, tokenizer: TextTokenizer
) -> None:
    messages = [*USER, {"role": "assistant", "content": "The answer is"}]
    ask = {"add_generation_prompt": False, "continue_final_message": True}
    status, ids, _ = await _prompt(make_worker, make_stack, ask, messages)
    assert status == 200
    text = tokenizer.decode(ids, skip_special_tokens=False)
    assert text.endswith("assistant<|end_header_id|>\n\nThe answer is"), text
    closed = tokenizer.decode(
        tokenizer.apply_chat_template(messages, add_generation_prompt=False),
        skip_special_tokens=False,
    )
    assert closed.startswith(text)
    assert len(closed) > len(text)


async def test_continue_final_message_with_the_generation_prompt_is_refused(
    make_worker: WorkerFactory, make_stack: StackFactory
) -> None:
    messages = [*USER, {"role": "assistant", "content": "The answer is"}]
    status, _, body = await _prompt(
        make_worker, make_stack, {"continue_final_message": True}, messages
    )
    assert status == 400, body
    assert body["error"]["param"] == "continue_final_message"
    assert "add_generation_prompt" in body["error"]["message"]


def test_an_open_final_message_that_spells_a_special_token_keeps_it_as_text(
    tokenizer: TextTokenizer,
) -> None:
    """The escaped path (a message spelling `<|eot_id|>`) leaves the final message open too,
    and the spelled token stays text, not the special token."""
    messages = [*USER, {"role": "assistant", "content": "Say <|eot_id|> then"}]
    ids = tokenizer.apply_chat_template(
        messages, add_generation_prompt=False, continue_final_message=True
    )
    eot = tokenizer.stop_token_ids[-1]
    assert tokenizer.decode(ids, skip_special_tokens=False).endswith("Say <|eot_id|> then")
    assert eot not in ids[-8:]


async def test_tokenize_takes_the_same_options(
    make_worker: WorkerFactory, make_stack: StackFactory, tokenizer: TextTokenizer
) -> None:
    w = await make_worker(Role.MIXED)
    stack = await make_stack(w)
    body = {"messages": USER, "chat_template_kwargs": {"enable_thinking": False}}
    async with stack.client() as client:
        r = await client.post("/tokenize", json=body)
        bad = await client.post("/tokenize", json={**body, "continue_final_message": True})
    assert r.status_code == 200, r.text
    assert tokenizer.decode(r.json()["tokens"]).endswith("/no_think")
    assert bad.status_code == 400
    assert bad.json()["error"]["param"] == "continue_final_message"


async def test_with_unknown_fields_allowed_a_variable_the_template_does_not_read_is_dropped(
    make_worker: WorkerFactory, make_stack: StackFactory
) -> None:
    """`edge.allow_unknown_fields` (for clients that send vendor extras to every model) drops
    such a variable as vLLM does; one the router sets is still a 400."""
    w = await make_worker(Role.MIXED)
    stack = await make_stack(w)
    stack.generator.edge = EdgeSettings(allow_unknown_fields=True)
    body = {"model": MODEL, "messages": USER, "max_tokens": 2}
    async with stack.client() as client:
        plain = await client.post("/v1/chat/completions", json=body)
        dropped = await client.post(
            "/v1/chat/completions", json={**body, "chat_template_kwargs": {"reasoning": "low"}}
        )
        reserved = await client.post(
            "/v1/chat/completions", json={**body, "chat_template_kwargs": {"messages": []}}
        )
    assert plain.status_code == dropped.status_code == 200, dropped.text
    first, second = w.requests("Generate")
    assert first.prompt_token_ids == second.prompt_token_ids
    assert reserved.status_code == 400
