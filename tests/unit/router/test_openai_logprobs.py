"""`logprobs` / `top_logprobs`: the router asks the workers for them (prefill and decode alike),
writes them as vLLM's OpenAI server does (chat and completions, streamed and whole), the
official client parses them, and engines that cannot honour them refuse with a 400."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from splitserve.core.request import TokenLogprobs
from splitserve.core.roles import Role
from splitserve.router.logprobs import LogprobsFormatter
from splitserve.router.tokenizer import TextTokenizer
from tests.unit.router.conftest import MODEL, ServerFactory, StackFactory, WorkerFactory

CHAT: list[Any] = [{"role": "user", "content": "Hi there"}]
TEXT = "The quick brown fox jumps over the lazy dog."


class _Ids:
    """A tokenizer whose token k decodes to "t<k>" (k < 3: "é", several bytes)."""

    def decode(self, token_ids: Any, *, skip_special_tokens: bool = True) -> str:
        assert not skip_special_tokens  # vLLM's decoded_token keeps special tokens
        [t] = token_ids
        return "é" if t < 3 else f"t{t}"


def test_chat_shape_is_vllms() -> None:
    fmt = LogprobsFormatter(_Ids(), chat=True, top=2)
    body = fmt.body(
        [7, 1],
        [
            TokenLogprobs((7, 3, 4), (-1.5, -0.1, -0.2), 3),
            TokenLogprobs((1, 3), (float("-inf"), -0.1), 1),
        ],
    )
    first, second = body["content"]
    assert first == {
        "token": "t7",
        "logprob": -1.5,
        "bytes": list(b"t7"),
        # As vLLM: the position's first `top_logprobs` entries, the sampled token first.
        "top_logprobs": [
            {"token": "t7", "logprob": -1.5, "bytes": list(b"t7")},
            {"token": "t3", "logprob": -0.1, "bytes": list(b"t3")},
        ],
    }
    assert second["logprob"] == -9999.0  # -inf is written as vLLM writes it
    assert second["bytes"] == list("é".encode())


def test_completion_shape_is_vllms() -> None:
    fmt = LogprobsFormatter(_Ids(), chat=False, top=1)
    lps = [TokenLogprobs((7, 3, 4), (-1.5, -0.1, -0.2), 3), TokenLogprobs((3,), (-0.1,), 1)]
    body = fmt.body([7, 3], lps)
    assert body == {
        "text_offset": [0, 2],
        "token_logprobs": [-1.5, -0.1],
        "tokens": ["t7", "t3"],
        # vLLM's completions write up to `logprobs` + 1 entries (the sampled token and k more).
        "top_logprobs": [{"t7": -1.5, "t3": -0.1}, {"t3": -0.1}],
    }
    # Streamed: each chunk's offsets start where the text sent so far ends.
    assert fmt.body([4], [TokenLogprobs((4,), (-0.3,), 1)], text_start=10)["text_offset"] == [10]
    with pytest.raises(ValueError, match="2 tokens but 1"):
        fmt.body([7, 3], lps[:1])


def _vllm_workers(make_worker: WorkerFactory, tokenizer: TextTokenizer) -> Any:
    async def start(*roles: Role) -> list[Any]:
        out = []
        for role in roles:
            w = await make_worker(role, engine="vllm")
            w.script.completion = tuple(tokenizer.encode(TEXT))
            out.append(w)
        return out

    return start


def _events(body: str) -> list[Any]:
    return [
        json.loads(line[6:])
        for line in body.splitlines()
        if line.startswith("data: ") and line != "data: [DONE]"
    ]


async def test_chat_logprobs_aggregated(
    make_worker: WorkerFactory, make_stack: StackFactory, tokenizer: TextTokenizer
) -> None:
    [w] = await _vllm_workers(make_worker, tokenizer)(Role.MIXED)
    stack = await make_stack(w)
    body = {"model": MODEL, "messages": CHAT, "max_tokens": 5, "logprobs": True}
    async with stack.client() as client:
        whole = await client.post("/v1/chat/completions", json={**body, "top_logprobs": 2})
        bare = await client.post("/v1/chat/completions", json=body)
        card = (await client.get("/v1/models")).json()["data"][0]
    assert card["permission"][0]["allow_logprobs"] is True  # vLLM workers: allowed
    assert whole.status_code == 200, whole.text
    [gen, gen_bare] = w.requests("Generate")
    assert gen.sampling.logprobs
    assert gen.sampling.top_logprobs == 2
    assert gen_bare.sampling.logprobs
    assert gen_bare.sampling.top_logprobs == 0
    choice = whole.json()["choices"][0]
    content = choice["logprobs"]["content"]
    ids = tokenizer.encode(TEXT)[:5]
    assert [c["token"] for c in content] == [
        tokenizer.decode([t], skip_special_tokens=False) for t in ids
    ]
    assert "".join(c["token"] for c in content) == choice["message"]["content"]
    assert [c["logprob"] for c in content] == pytest.approx([-1 - t / 100 for t in ids])
    assert all(len(c["top_logprobs"]) == 2 for c in content)
    assert all(c["top_logprobs"][0]["token"] == c["token"] for c in content)
    # logprobs with top_logprobs 0 (the default): the sampled token's only.
    bare_content = bare.json()["choices"][0]["logprobs"]["content"]
    assert len(bare_content) == 5
    assert all(c["top_logprobs"] == [] for c in bare_content)


async def test_completion_logprobs_pd_streamed_carry_the_first_token(
    make_worker: WorkerFactory, make_stack: StackFactory, tokenizer: TextTokenizer
) -> None:
    p, d = await _vllm_workers(make_worker, tokenizer)(Role.PREFILL, Role.DECODE)
    stack = await make_stack(p, d)
    body = {"model": MODEL, "prompt": "Once", "max_tokens": 6, "logprobs": 1}
    async with stack.client() as client:
        streamed = await client.post("/v1/completions", json={**body, "stream": True})
        whole = await client.post("/v1/completions", json=body)
    assert streamed.status_code == 200, streamed.text
    for name in ("Prefill", "Decode"):
        for req in p.requests(name) + d.requests(name):
            assert req.sampling.logprobs
            assert req.sampling.top_logprobs == 1
    ids = tokenizer.encode(TEXT)[:6]
    tokens: list[str] = []
    text = ""
    for event in _events(streamed.text):
        choice = event["choices"][0]
        lp = choice["logprobs"]
        if lp is None:
            continue
        assert lp["text_offset"][0] == len(text)
        text += choice["text"]
        tokens += lp["tokens"]
    first = tokenizer.decode([ids[0]], skip_special_tokens=False)
    assert tokens[0] == first  # the prefill worker's token, with its log probabilities
    assert len(tokens) == 6
    w = whole.json()["choices"][0]["logprobs"]
    assert w["tokens"] == tokens
    assert w["token_logprobs"] == pytest.approx([-1 - t / 100 for t in ids])
    assert all(len(top) == 2 for top in w["top_logprobs"])  # k + 1, as vLLM


@pytest.mark.parametrize(
    ("route", "extra", "param"),
    [
        ("chat", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ("chat", {"top_logprobs": 2}, "top_logprobs"),
        ("completion", {"logprobs": 21}, "logprobs"),
        ("completion", {"logprobs": -1}, "logprobs"),
    ],
)
async def test_bad_logprobs_are_400(
    make_worker: WorkerFactory,
    make_stack: StackFactory,
    tokenizer: TextTokenizer,
    route: str,
    extra: dict[str, Any],
    param: str,
) -> None:
    [w] = await _vllm_workers(make_worker, tokenizer)(Role.MIXED)
    stack = await make_stack(w)
    if route == "chat":
        path, body = "/v1/chat/completions", {"model": MODEL, "messages": CHAT, **extra}
    else:
        path, body = "/v1/completions", {"model": MODEL, "prompt": "Hi", **extra}
    async with stack.client() as client:
        r = await client.post(path, json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    assert not w.requests("Generate")


async def test_the_simulated_engine_refuses_logprobs(
    make_worker: WorkerFactory, make_stack: StackFactory
) -> None:
    w = await make_worker(Role.MIXED, engine="sim")
    stack = await make_stack(w)
    async with stack.client() as client:
        r = await client.post(
            "/v1/completions", json={"model": MODEL, "prompt": "Hi", "logprobs": 0}
        )
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "logprobs"
    assert "sim engine" in err["message"]
    assert not w.requests("Generate")


async def test_official_client_parses_logprobs(
    make_worker: WorkerFactory, make_router: ServerFactory, tokenizer: TextTokenizer
) -> None:
    p, d = await _vllm_workers(make_worker, tokenizer)(Role.PREFILL, Role.DECODE)
    server = await make_router(p.address, d.address)
    client = openai.AsyncOpenAI(
        base_url=f"http://127.0.0.1:{server.http_port}/v1", api_key="unused", max_retries=0
    )
    async with client:
        chat = await client.chat.completions.create(
            model=MODEL,
            messages=CHAT,
            max_tokens=4,
            logprobs=True,
            top_logprobs=3,
        )
        stream = await client.chat.completions.create(
            model=MODEL,
            messages=CHAT,
            max_tokens=4,
            logprobs=True,
            stream=True,
        )
        streamed = [c async for c in stream]
        comp = await client.completions.create(model=MODEL, prompt="Hi", max_tokens=4, logprobs=2)
    assert chat.choices[0].logprobs is not None
    content = chat.choices[0].logprobs.content
    assert content is not None
    assert len(content) == 4
    assert len(content[0].top_logprobs) == 3
    streamed_tokens = [
        c.token
        for chunk in streamed
        if chunk.choices and chunk.choices[0].logprobs and chunk.choices[0].logprobs.content
        for c in chunk.choices[0].logprobs.content
    ]
    assert streamed_tokens == [c.token for c in content]
    lp = comp.choices[0].logprobs
    assert lp is not None
    assert lp.tokens is not None
    assert len(lp.tokens) == 4
