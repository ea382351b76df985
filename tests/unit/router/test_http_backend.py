"""Stock vLLM servers as workers (`--backend`, `router.http_backend`), against fake servers that
speak vLLM's `kv_transfer_params` protocol (tests/fakes/fake_vllm_http.py): P/D through the
router equals aggregated token by token, the prefill's KV is pulled by the decode server, the
fallbacks, the load read from `/metrics`, and the configuration surface."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from click.testing import CliRunner
from pydantic import ValidationError

from splitserve._gen.v1 import common_pb2
from splitserve.api import v1alpha1 as v1
from splitserve.api.backends import BackendDiscoverySettings, HttpBackend, parse_backend_flag
from splitserve.api.router import PlacementSettings, RouterConfig, RouterFile
from splitserve.cli.main import cli
from splitserve.core.roles import Role
from splitserve.router.discovery import PodList
from splitserve.router.http_backend import protocol
from splitserve.router.server import RouterServer
from splitserve.router.tokenizer import TextTokenizer
from tests.fakes.fake_vllm_http import FakeVllm, next_token
from tests.fakes.ports import free_port_on_all
from tests.unit.router.conftest import FAST_POOL, MODEL, ServerFactory

FakeFactory = Callable[..., Coroutine[Any, Any, FakeVllm]]


@pytest.fixture
async def make_fake() -> AsyncIterator[FakeFactory]:
    started: list[FakeVllm] = []

    async def factory(**kwargs: Any) -> FakeVllm:
        fake = FakeVllm(**kwargs)
        await fake.start()
        started.append(fake)
        return fake

    yield factory
    for fake in started:
        await fake.stop()


async def _router(make_router: ServerFactory, *backends: str, **kw: Any) -> RouterServer:
    server = await make_router(backends=tuple(parse_backend_flag(b) for b in backends), **kw)
    want = len(backends)
    await server.pool.wait_for(lambda p: sum(v.ready for v in p.views()) == want, timeout_s=20)
    return server


async def _stream(server: RouterServer, prompt: str, **kw: Any) -> tuple[list[str], Any]:
    async with openai.AsyncOpenAI(
        base_url=f"http://127.0.0.1:{server.http_port}/v1", api_key="x", max_retries=0
    ) as client:
        stream = await client.completions.create(
            model=MODEL, prompt=prompt, stream=True, stream_options={"include_usage": True}, **kw
        )
        pieces: list[str] = []
        usage = None
        async for chunk in stream:
            pieces.extend(c.text for c in chunk.choices if c.text)
            usage = chunk.usage or usage
        return pieces, usage


def _expected(tokenizer: TextTokenizer, prompt: str, n: int, seed: int | None = None) -> str:
    context = list(tokenizer.encode(prompt))
    out = []
    for _ in range(n):
        out.append(next_token(context, seed))
        context.append(out[-1])
    return tokenizer.decode(out)


PROMPT = "Stock vLLM servers behind the router, prefill on one and decode on the other."


async def test_pd_on_stock_servers_equals_aggregated_token_by_token(
    make_fake: FakeFactory, make_router: ServerFactory, tokenizer: TextTokenizer
) -> None:
    p, d = await make_fake(model="served"), await make_fake(model="served")
    pd = await _router(make_router, f"prefill={p.url}", f"decode={d.url}")
    pd_pieces, pd_usage = await _stream(pd, PROMPT, max_tokens=12, temperature=0)
    assert p.calls == ["prefill"]
    assert d.calls == ["decode"]
    assert d.pulls == 1
    assert p.held == {}
    assert p.bodies[0]["max_tokens"] == 1
    assert p.bodies[0]["stream"] is False
    assert p.bodies[0]["kv_transfer_params"]["do_remote_decode"] is True
    assert d.bodies[0]["kv_transfer_params"]["remote_port"] == p.port
    assert pd.pool.view(p.url).role is Role.PREFILL

    a = await make_fake(model="served")
    agg = await _router(make_router, a.url)
    agg_pieces, agg_usage = await _stream(agg, PROMPT, max_tokens=12, temperature=0)
    assert a.calls == ["generate"]
    assert pd_pieces == agg_pieces  # token by token (one piece per token)
    assert "".join(pd_pieces) == _expected(tokenizer, PROMPT, 12)
    assert pd_usage.completion_tokens == agg_usage.completion_tokens == 12
    assert pd_usage.prompt_tokens == len(tokenizer.encode(PROMPT))


async def test_sampled_pd_uses_one_seed_on_both_halves(
    make_fake: FakeFactory, make_router: ServerFactory
) -> None:
    p, d = await make_fake(model="m"), await make_fake(model="m")
    pd = await _router(make_router, f"prefill={p.url}", f"decode={d.url}")
    pieces, usage = await _stream(pd, PROMPT, max_tokens=6, temperature=0.8)
    assert usage.completion_tokens == 6
    assert len(pieces) == 6
    assert p.bodies[0]["seed"] == d.bodies[0]["seed"]  # the decode's re-sample agrees
    assert d.calls == ["decode"]


async def test_a_negative_seed_reaches_vllm_serve_as_sent(
    make_fake: FakeFactory, make_router: ServerFactory
) -> None:
    """vLLM serve takes any int64 seed; the HTTP backend passes the client's, negative too
    (it was masked to 63 bits: -1 became 2**63 - 1, another random stream)."""
    p, d = await make_fake(model="m"), await make_fake(model="m")
    pd = await _router(make_router, f"prefill={p.url}", f"decode={d.url}")
    await _stream(pd, PROMPT, max_tokens=3, temperature=0.8, seed=-5)
    assert p.bodies[0]["seed"] == d.bodies[0]["seed"] == -5


async def test_prefill_failure_falls_back_to_aggregated_on_the_decode_server(
    make_fake: FakeFactory, make_router: ServerFactory, tokenizer: TextTokenizer
) -> None:
    p, d = await make_fake(fail_prefill=True), await make_fake()
    server = await _router(make_router, f"prefill={p.url}", f"decode={d.url}")
    pieces, _ = await _stream(server, PROMPT, max_tokens=5, temperature=0)
    assert p.calls == ["prefill"]
    assert d.calls == ["generate"]
    assert "".join(pieces) == _expected(tokenizer, PROMPT, 5)
    fallbacks = server.registry.get_sample_value(
        "splitserve_router_fallbacks_total", {"reason": "prefill_to_aggregated"}
    )
    assert fallbacks == 1


@pytest.mark.parametrize("how", ["event", "finish"])
async def test_failed_pull_regenerates_from_prompt_and_first_token(
    make_fake: FakeFactory, make_router: ServerFactory, tokenizer: TextTokenizer, how: str
) -> None:
    p, d = await make_fake(), await make_fake(fail_pulls=how)
    server = await _router(make_router, f"prefill={p.url}", f"decode={d.url}")
    pieces, usage = await _stream(server, PROMPT, max_tokens=5, temperature=0)
    assert d.calls == ["decode", "generate"]
    # The retry carries the prompt plus the token the client already has, and owes 4 more.
    assert d.bodies[1]["prompt"][-1] == next_token(list(tokenizer.encode(PROMPT)), None)
    assert d.bodies[1]["max_tokens"] == 4
    assert "".join(pieces) == _expected(tokenizer, PROMPT, 5)
    assert usage.completion_tokens == 5


async def test_a_decode_that_disagrees_with_its_prefill_is_not_streamed(
    make_fake: FakeFactory, make_router: ServerFactory, tokenizer: TextTokenizer
) -> None:
    p, d = await make_fake(), await make_fake(first_token_offset=1)
    server = await _router(make_router, f"prefill={p.url}", f"decode={d.url}")
    pieces, _ = await _stream(server, PROMPT, max_tokens=5, temperature=0)
    assert d.calls == ["decode", "generate"]
    assert "".join(pieces) == _expected(tokenizer, PROMPT, 5)


async def test_load_comes_from_the_servers_metrics(
    make_fake: FakeFactory, make_router: ServerFactory
) -> None:
    d = await make_fake(num_waiting=3)
    server = await _router(make_router, f"decode={d.url}")
    view = server.pool.view(d.url)
    assert view.role is Role.DECODE
    assert view.ready
    assert view.num_waiting == 3
    assert view.kv_total_blocks == 1000
    assert view.kv_block_size == 16
    assert server.pool.engines() == ["vllm-serve"]
    d.num_waiting = 0
    await server.pool.wait_for(lambda p: p.view(d.url).num_waiting == 0, timeout_s=20)


async def test_a_dead_backend_is_not_ready_and_gets_no_work(
    make_fake: FakeFactory, make_router: ServerFactory, tokenizer: TextTokenizer
) -> None:
    p, d = await make_fake(), await make_fake()
    server = await _router(
        make_router,
        f"prefill={p.url}",
        f"decode={d.url}",
        placement=PlacementSettings(disaggregation=v1.Disaggregation.AUTO),
    )
    await p.stop()
    await server.pool.wait_for(lambda pool: not pool.view(p.url).ready, timeout_s=20)
    pieces, _ = await _stream(server, PROMPT, max_tokens=4, temperature=0)
    assert d.calls == ["generate"]
    assert "".join(pieces) == _expected(tokenizer, PROMPT, 4)


async def test_the_servers_refusal_is_a_400_and_its_failure_a_503(
    make_fake: FakeFactory, make_router: ServerFactory
) -> None:
    d = await make_fake(max_model_len=40)
    server = await _router(make_router, f"decode={d.url}")
    with pytest.raises(openai.BadRequestError, match="maximum context length is 40"):
        await _stream(server, PROMPT, max_tokens=30)
    d.model = "renamed"  # the server no longer serves the model the router read: not the client's
    with pytest.raises(openai.InternalServerError, match="failed on every worker"):
        await _stream(server, PROMPT, max_tokens=4)


async def test_fields_the_backend_does_not_pass_are_refused_not_dropped(
    make_fake: FakeFactory, make_router: ServerFactory
) -> None:
    d = await make_fake()
    server = await _router(make_router, f"decode={d.url}")
    for extra in ({"logprobs": 2}, {"extra_body": {"structured_outputs": {"json_object": True}}}):
        with pytest.raises(openai.BadRequestError) as err:
            await _stream(server, PROMPT, max_tokens=4, **extra)
        body = err.value.body
        assert isinstance(body, dict)
        assert body["param"] in ("logprobs", "structured_outputs")
        assert "vllm-serve" in body["message"]
    assert d.calls == []  # refused before any backend saw it


# -- configuration -------------------------------------------------------------------------


def test_backend_flag_parsing() -> None:
    assert parse_backend_flag("http://h:1") == HttpBackend(url="http://h:1", role=Role.MIXED)
    assert parse_backend_flag("prefill=http://h:1/").role is Role.PREFILL
    assert parse_backend_flag("decode=https://h:1").url == "https://h:1"
    with pytest.raises(ValueError, match="unknown role 'fast'"):
        parse_backend_flag("fast=http://h:1")
    with pytest.raises(ValidationError, match="expected http://HOST:PORT"):
        parse_backend_flag("decode=h:1")
    with pytest.raises(ValidationError, match="without a path"):
        parse_backend_flag("http://h:1/v1")


def test_cli_refuses_a_bad_backend() -> None:
    result = CliRunner().invoke(cli, ["router", "serve", "--backend", "fast=http://h:1"])
    assert result.exit_code == 2
    assert "--backend" in result.output
    assert "unknown role 'fast'" in result.output


def test_router_yaml_backends() -> None:
    data = {
        "model": {"name": "m", "source": "/models/m"},
        "engine": {"kind": "vllm"},
        "backends": [{"url": "http://p:8000", "role": "prefill"}, {"url": "http://d:8000"}],
    }
    file, ignored = RouterFile.from_configmap(data)
    assert ignored == ()
    config = file.router_config()
    assert [(b.url, b.role) for b in config.backends] == [
        ("http://p:8000", Role.PREFILL),
        ("http://d:8000", Role.MIXED),
    ]
    # A newer operator's key is dropped and reported (router.yaml's rule); a bad value is fatal.
    _, ignored = RouterFile.from_configmap({**data, "backends": [{"url": "http://p:1", "w": 2}]})
    assert len(ignored) == 1
    assert "w" in ignored[0]
    with pytest.raises(ValidationError, match="expected http://HOST:PORT"):
        RouterFile.from_configmap({**data, "backends": [{"url": "p:1"}]})


# -- the protocol, pure --------------------------------------------------------------------

VLLM_METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny"} 2.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="tiny"} 5.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.25
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="0",num_gpu_blocks="1480"} 1.0
"""


def test_load_report_from_vllm_metrics() -> None:
    r = protocol.load_report(VLLM_METRICS, worker_id="u", role=Role.DECODE, seq=3, model="tiny")
    assert (r.num_running, r.num_waiting) == (2, 5)
    assert (r.kv_blocks_total, r.kv_blocks_free, r.kv_block_size) == (1480, 1110, 16)
    assert r.role == common_pb2.ROLE_DECODE
    assert r.seq == 3
    assert r.engine == "vllm-serve"
    with pytest.raises(ValueError, match="not a vLLM server"):
        protocol.load_report("up 1\n", worker_id="u", role=Role.DECODE, seq=1, model="m")


def test_completion_body_passes_every_sampler_field() -> None:
    s = common_pb2.SamplingParams(
        max_tokens=9,
        temperature=0.5,
        top_p=0.9,
        stop_token_ids=[2],
        ignore_eos=True,
        top_k=5,
        min_p=0.1,
        presence_penalty=0.2,
        frequency_penalty=0.3,
        repetition_penalty=1.1,
        logit_bias={7: -1.0},
        min_tokens=2,
        bad_words=["x"],
        allowed_token_ids=[1, 2],
        seed=0,
        seeded=True,
    )
    body = protocol.completion_body("m", [1, 2], s, max_tokens=1, stream=False)
    assert body["seed"] == 0  # seed 0 is a seed
    for key, value in {
        "max_tokens": 1,
        "top_k": 5,
        "stop_token_ids": [2],
        "ignore_eos": True,
        "logit_bias": {"7": -1.0},
        "min_tokens": 2,
        "bad_words": ["x"],
        "allowed_token_ids": [1, 2],
        "return_token_ids": True,
    }.items():
        assert body[key] == value, key
    for key in ("min_p", "presence_penalty", "frequency_penalty", "repetition_penalty"):
        assert body[key] == pytest.approx(getattr(s, key))
    greedy = protocol.completion_body(
        "m", [1], common_pb2.SamplingParams(max_tokens=3), max_tokens=3, stream=True, seed=4
    )
    assert "seed" not in greedy
    assert greedy["top_p"] == 1.0
    assert greedy["temperature"] == 0


async def test_router_stays_up_with_an_unreachable_backend(
    tokenizer: TextTokenizer, tokenizer_dir: Path
) -> None:
    config = RouterConfig(
        model_name=MODEL,
        tokenizer_dir=str(tokenizer_dir),
        http_host="127.0.0.1",
        http_port=0,
        grpc_port=None,
        pool=FAST_POOL,
        backends=(parse_backend_flag("decode=http://127.0.0.1:9"),),
    )
    server = RouterServer(config, tokenizer=tokenizer)
    await server.start()
    try:
        async with httpx.AsyncClient() as client:
            resp = await client.post(
                f"http://127.0.0.1:{server.http_port}/v1/completions",
                json={"model": MODEL, "prompt": "x", "max_tokens": 2},
            )
        assert resp.status_code == 503
        assert not server.pool.view("http://127.0.0.1:9").ready
    finally:
        await server.stop(grace_s=1)


# -- discovery from pod labels -------------------------------------------------------------


class _Pods:
    """A `PodSource` whose cluster is `pods`; each change ends the open watch (re-list)."""

    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self.pods = pods
        self.changed = asyncio.Event()

    async def list(self) -> PodList:
        return PodList(list(self.pods), "1")

    async def watch(self, resource_version: str) -> AsyncGenerator[dict[str, Any], None]:
        await self.changed.wait()
        self.changed.clear()
        return
        yield {}

    def set(self, pods: Sequence[dict[str, Any]]) -> None:
        self.pods = [*pods]
        self.changed.set()


def _pod(name: str, ip: str, role: str, *, ready: bool = True) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ns", "labels": {"app": "vllm", "role": role}},
        "status": {
            "podIP": ip,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


async def test_stock_servers_discovered_from_pod_labels(
    make_fake: FakeFactory, tokenizer: TextTokenizer, tokenizer_dir: Path
) -> None:
    port = free_port_on_all(["127.0.0.1", "127.0.0.2"])
    p = await make_fake(host="127.0.0.1", port=port)
    d = await make_fake(host="127.0.0.2", port=port)
    source = _Pods([_pod("p", "127.0.0.1", "prefill"), _pod("d", "127.0.0.2", "decode")])
    config = RouterConfig(
        model_name=MODEL,
        tokenizer_dir=str(tokenizer_dir),
        http_host="127.0.0.1",
        http_port=0,
        grpc_port=None,
        pool=FAST_POOL,
        backend_discovery=BackendDiscoverySettings(
            namespace="ns", selector="app=vllm", role_label="role", http_port=port
        ),
    )
    server = RouterServer(config, tokenizer=tokenizer, pod_source=source)
    await server.start()
    try:
        pool = server.pool
        await pool.wait_for(lambda v: sum(x.ready for x in v.views()) == 2, timeout_s=20)
        assert pool.view(p.url).role is Role.PREFILL
        assert pool.view(d.url).role is Role.DECODE
        pieces, _ = await _stream(server, PROMPT, max_tokens=5, temperature=0)
        assert p.calls == ["prefill"]
        assert d.calls == ["decode"]
        assert "".join(pieces) == _expected(tokenizer, PROMPT, 5)
        # The prefill pod turns unready (fenced), then its role label flips to decode.
        source.set(
            [_pod("p", "127.0.0.1", "prefill", ready=False), _pod("d", "127.0.0.2", "decode")]
        )
        await pool.wait_for(lambda v: v.view(p.url).fenced, timeout_s=20)
        await _stream(server, PROMPT, max_tokens=3, temperature=0)
        assert d.calls == ["decode", "generate"]
        source.set([_pod("p", "127.0.0.1", "decode"), _pod("d", "127.0.0.2", "decode")])
        await pool.wait_for(
            lambda v: v.view(p.url).role is Role.DECODE and not v.view(p.url).fenced, timeout_s=20
        )
        source.set([_pod("d", "127.0.0.2", "decode")])
        await pool.wait_for(lambda v: p.url not in v.ids(), timeout_s=20)
    finally:
        await server.stop(grace_s=1)
