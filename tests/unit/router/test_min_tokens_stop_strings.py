"""`min_tokens` holds off stop strings too, as vLLM: a stop string is matched only once the
answer has more than `min_tokens` tokens, and only where it ends in the text after them.

Found by a new-user probe: with `stop` matching the answer's first token, `min_tokens: 10` ended
the answer after 1 token with `finish_reason: stop` and empty content, on every engine (the
router matches stop strings). Also: the usage of an answer ended by a stop string counts the
tokens up to the one that completed it; before, every token of the chunk it came in counted
(here, where the fake worker's tokens arrive together, all 17).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from splitserve.core.roles import Role
from splitserve.router.tokenizer import TextTokenizer
from tests.unit.router.conftest import MODEL, StackFactory, WorkerFactory

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
ANSWER = " alpha beta alpha gamma delta epsilon"


def _body(path: str, **fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"model": MODEL, "max_tokens": 64, **fields}
    if path == CHAT:
        return {**base, "messages": [{"role": "user", "content": "x"}]}
    return {**base, "prompt": "x"}


def _text(path: str, answer: dict[str, Any]) -> str:
    choice = answer["choices"][0]
    return str(choice["message"]["content"] if path == CHAT else choice["text"])


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
@pytest.mark.parametrize("stream", [False, True])
async def test_min_tokens_holds_off_stop_strings(
    make_worker: WorkerFactory,
    make_stack: StackFactory,
    tokenizer: TextTokenizer,
    path: str,
    stream: bool,
) -> None:
    ids = tokenizer.encode(ANSWER)

    def expected(stop: str, min_tokens: int) -> tuple[str, str, int]:
        """vLLM's reading, token by token: the answer ends at the first token after the first
        `min_tokens` whose text completes `stop` ending past theirs; its usage counts up to it."""
        guard = len(tokenizer.decode(ids[:min_tokens]))
        for k in range(max(1, min_tokens + 1), len(ids) + 1):
            text = tokenizer.decode(ids[:k])
            at = text.find(stop, max(0, guard - len(stop) + 1))
            if at >= 0:
                return text[:at], "stop", k
        return ANSWER, "stop", len(ids)

    w = await make_worker(Role.MIXED, completion=ids)
    stack = await make_stack(w)

    async def ask(**fields: Any) -> tuple[str, str, int]:
        async with stack.client() as client:
            if not stream:
                r = await client.post(path, json=_body(path, **fields))
                assert r.status_code == 200, r.text
                answer = r.json()
                return (
                    _text(path, answer),
                    answer["choices"][0]["finish_reason"],
                    answer["usage"]["completion_tokens"],
                )
            body = _body(path, stream=True, stream_options={"include_usage": True}, **fields)
            text, reason, used = "", "", -1
            async with client.stream("POST", path, json=body) as r:
                assert r.status_code == 200
                async for line in r.aiter_lines():
                    if not line.startswith("data: {"):
                        continue
                    event = json.loads(line[6:])
                    for choice in event["choices"]:
                        delta = choice.get("delta", {}).get("content") if path == CHAT else None
                        text += (delta if path == CHAT else choice.get("text")) or ""
                        reason = choice.get("finish_reason") or reason
                    if event.get("usage"):
                        used = event["usage"]["completion_tokens"]
            return text, reason, used

    # without min_tokens the first " alpha" ends the answer (usage: the tokens up to it)
    assert await ask(stop=[" alpha"]) == expected(" alpha", 0) == ("", "stop", 3)
    # guarded up to " al": the first " alpha" still ends after the guarded text, and ends it
    assert await ask(stop=[" alpha"], min_tokens=1) == expected(" alpha", 1) == ("", "stop", 3)
    # guarded through the first " alpha" (3 tokens): the second one ends it
    assert await ask(stop=[" alpha"], min_tokens=3) == expected(" alpha", 3)
    assert expected(" alpha", 3) == (" alpha beta", "stop", 8)
    # a stop string only inside the guarded text never ends it
    assert await ask(stop=[" beta"], min_tokens=5) == expected(" beta", 5)
    assert expected(" beta", 5) == (ANSWER, "stop", len(ids))
