"""An empty `x-slo-class` header is a 400 naming it, as an unknown class is.

Before the fix an empty header was read as "no header" and the request ran in the default class
(or, behind API keys, in the tenant's first class), with nothing telling the client.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from splitserve.api.auth import AuthSettings
from splitserve.core.roles import Role
from tests.unit.router.conftest import MODEL, ServerFactory, StackFactory, WorkerFactory
from tests.unit.router.test_auth import CLASSES, KEYS_YAML, TEAM_A

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


def _body(path: str) -> dict[str, object]:
    if path == CHAT:
        return {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
    return {"model": MODEL, "prompt": "x", "max_tokens": 2}


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
@pytest.mark.parametrize("value", ["", " ", "nope"])
async def test_an_empty_or_unknown_class_is_a_400_naming_the_header(
    make_worker: WorkerFactory, make_stack: StackFactory, path: str, value: str
) -> None:
    w = await make_worker(Role.MIXED)
    stack = await make_stack(w)
    async with stack.client() as client:
        r = await client.post(path, json=_body(path), headers={"x-slo-class": value})
        ok = await client.post(path, json=_body(path))  # no header: the default class
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "x-slo-class"
    assert error["message"].startswith("x-slo-class: ")
    assert "known classes: default" in error["message"]
    assert ok.status_code == 200, ok.text


async def test_behind_api_keys_an_empty_class_is_a_400_not_the_tenants_class(
    make_worker: WorkerFactory, make_router: ServerFactory, tmp_path: Path
) -> None:
    m = await make_worker(Role.MIXED)
    keys = tmp_path / "keys.yaml"
    keys.write_text(KEYS_YAML)
    server = await make_router(m.address, auth=AuthSettings(key_file=str(keys)), slo=CLASSES)
    url = f"http://127.0.0.1:{server.http_port}{COMPLETIONS}"
    auth = {"authorization": f"Bearer {TEAM_A}"}
    async with httpx.AsyncClient() as client:
        r = await client.post(url, json=_body(COMPLETIONS), headers={**auth, "x-slo-class": ""})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "x-slo-class"
