"""Request fields below their minimum (or above their maximum) are a 400 naming the field.

Before the fix `best_of: 0` was served (200), and `logprobs: -1`, `logprobs: 21` or
`top_logprobs: 21` were refused as "not supported by the engine" instead of as out of range.
"""

from __future__ import annotations

from typing import Any

import pytest

from splitserve.core.roles import Role
from tests.unit.router.conftest import MODEL, StackFactory, WorkerFactory

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


@pytest.mark.parametrize(
    ("path", "extra", "param", "words"),
    [
        (COMPLETIONS, {"best_of": 0}, "best_of", "greater than or equal to 1"),
        (COMPLETIONS, {"best_of": -3}, "best_of", "greater than or equal to 1"),
        (COMPLETIONS, {"logprobs": -1}, "logprobs", "greater than or equal to 0"),
        (COMPLETIONS, {"logprobs": 21}, "logprobs", "less than or equal to 20"),
        (COMPLETIONS, {"n": 0}, "n", "greater than or equal to 1"),
        (COMPLETIONS, {"max_tokens": 0}, "max_tokens", "greater than or equal to 1"),
        (COMPLETIONS, {"min_tokens": -1}, "min_tokens", "greater than or equal to 0"),
        (COMPLETIONS, {"top_k": -2}, "top_k", "greater than or equal to -1"),
        (CHAT, {"top_logprobs": -1}, "top_logprobs", "greater than or equal to 0"),
        (CHAT, {"top_logprobs": 21}, "top_logprobs", "less than or equal to 20"),
        (CHAT, {"max_completion_tokens": 0}, "max_completion_tokens", "greater than or equal"),
        (CHAT, {"n": -1}, "n", "greater than or equal to 1"),
    ],
)
async def test_an_integer_out_of_range_is_a_400_naming_it(
    make_worker: WorkerFactory,
    make_stack: StackFactory,
    path: str,
    extra: dict[str, Any],
    param: str,
    words: str,
) -> None:
    w = await make_worker(Role.MIXED)
    stack = await make_stack(w)
    if path == CHAT:
        body: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": "x"}]}
    else:
        body = {"model": MODEL, "prompt": "x"}
    async with stack.client() as client:
        r = await client.post(path, json={**body, "max_tokens": 2, **extra})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param
    assert error["message"].startswith(f"{param}: ")
    assert words in error["message"]
    assert w.names() == []
