"""`min_tokens` above the request's token limit is a 400 naming it, as vLLM's server refuses it
(`SamplingParams`: "min_tokens must be less than or equal to max_tokens").

Before, the router accepted it (200) and the vLLM worker clamped `min_tokens` to `max_tokens`:
the request ran as if `min_tokens` had not been sent as written.
"""

from __future__ import annotations

from typing import Any

import pytest

from splitserve.core.roles import Role
from tests.unit.router.conftest import MODEL, StackFactory, WorkerFactory

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


def _body(path: str) -> dict[str, Any]:
    if path == CHAT:
        return {"model": MODEL, "messages": [{"role": "user", "content": "x"}]}
    return {"model": MODEL, "prompt": "x"}


@pytest.mark.parametrize(
    ("path", "limits", "named"),
    [
        (COMPLETIONS, {"max_tokens": 3}, "max_tokens (3)"),
        (CHAT, {"max_tokens": 3}, "max_tokens (3)"),
        # max_completion_tokens wins over max_tokens: the limit the request runs under
        (CHAT, {"max_tokens": 50, "max_completion_tokens": 3}, "max_completion_tokens (3)"),
    ],
)
async def test_min_tokens_above_the_limit_is_a_400_naming_it(
    make_worker: WorkerFactory,
    make_stack: StackFactory,
    path: str,
    limits: dict[str, int],
    named: str,
) -> None:
    w = await make_worker(Role.MIXED)
    stack = await make_stack(w)
    async with stack.client() as client:
        r = await client.post(path, json={**_body(path), **limits, "min_tokens": 10})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "min_tokens"
    assert error["message"].startswith("min_tokens: ")
    assert named in error["message"]
    assert w.names() == []


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
async def test_min_tokens_up_to_the_limit_is_served(
    make_worker: WorkerFactory, make_stack: StackFactory, path: str
) -> None:
    w = await make_worker(Role.MIXED)
    stack = await make_stack(w)
    async with stack.client() as client:
        r = await client.post(path, json={**_body(path), "max_tokens": 3, "min_tokens": 3})
    assert r.status_code == 200, r.text
