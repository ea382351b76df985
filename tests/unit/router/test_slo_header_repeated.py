"""A repeated `x-slo-class`, `x-slo-ttft-ms` or `x-slo-tpot-ms` header is a 400 naming it.

Before the fix the router read the first value and dropped the others without a word:
`x-slo-class: interactive` and `x-slo-class: batch` ran as `interactive`, and
`x-slo-ttft-ms: 5000` with `x-slo-ttft-ms: 100000` (out of the class's range, a 400 alone)
ran with 5000 (seen on `splitserve up` with httpx).
"""

from __future__ import annotations

import pytest

from splitserve.api.router import SloSettings
from splitserve.api.v1alpha1 import SloClassSpec
from splitserve.core.roles import Role
from tests.unit.router.conftest import MODEL, StackFactory, WorkerFactory

BODY = {"model": MODEL, "prompt": "x", "max_tokens": 2}
# overrides allowed within 1/4x..4x: 500-8000 ms TTFT, 50-800 ms TPOT
SLO = SloSettings(
    classes=(SloClassSpec(name="chat", ttft_ms=2000, tpot_ms=200, allow_overrides=True),)
)


@pytest.mark.parametrize(
    ("name", "values"),
    [
        ("x-slo-class", ("chat", "chat")),
        ("x-slo-class", ("chat", "nope")),
        ("x-slo-ttft-ms", ("2000", "100000")),
        ("x-slo-tpot-ms", ("200", "200")),
    ],
)
async def test_a_repeated_slo_header_is_a_400_naming_it(
    make_worker: WorkerFactory, make_stack: StackFactory, name: str, values: tuple[str, str]
) -> None:
    w = await make_worker(Role.MIXED)
    stack = await make_stack(w, slo=SLO)
    async with stack.client() as client:
        r = await client.post(
            "/v1/completions", json=BODY, headers=[(name, value) for value in values]
        )
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == name
    assert error["message"].startswith(f"{name}: "), error["message"]
    assert "2 times" in error["message"]
    assert not w.requests("Generate")
