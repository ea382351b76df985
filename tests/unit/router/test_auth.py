"""Issue 19 item 1: API keys and tenants on a real router (HTTP and gRPC ports)."""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path

import grpc
import httpx
import pytest
from grpc import aio

from splitserve._gen.v1 import router_pb2, router_pb2_grpc
from splitserve.api.auth import AuthSettings
from splitserve.api.router import SloSettings
from splitserve.api.v1alpha1 import SloClassSpec
from splitserve.core.roles import Role
from splitserve.router.auth import key_sha256_hex
from splitserve.router.server import RouterServer
from tests.unit.router.conftest import MODEL, ServerFactory, WorkerFactory

KEY = "sk-test-0123456789"
TEAM_A = "sk-team-a-0123456789"
TEAM_B = "sk-team-b-0123456789"
CLASSES = SloSettings(
    classes=(
        SloClassSpec(name="interactive", ttft_ms=2000, tpot_ms=200),
        SloClassSpec(name="batch", ttft_ms=20000, tpot_ms=2000),
    )
)
KEYS_YAML = f"""
tenants:
  - name: team-a
    keys: ["{TEAM_A}"]
    sloClasses: [batch]
    models: [{MODEL}]
    requestsPerMinute: 2
  - name: team-b
    keySha256: ["{hashlib.sha256(TEAM_B.encode()).hexdigest()}"]
    models: [another-model]
"""


def _url(server: RouterServer, path: str) -> str:
    return f"http://127.0.0.1:{server.http_port}{path}"


def _body(**extra: object) -> dict[str, object]:
    return {"model": MODEL, "prompt": "hello", "max_tokens": 4, **extra}


async def test_no_key_and_wrong_key_are_401_health_and_metrics_stay_open(
    make_worker: WorkerFactory, make_router: ServerFactory
) -> None:
    m = await make_worker(Role.MIXED)
    server = await make_router(m.address, auth=AuthSettings(key_sha256=(key_sha256_hex(KEY),)))
    async with httpx.AsyncClient() as client:
        r = await client.post(_url(server, "/v1/completions"), json=_body())
        assert r.status_code == 401
        assert r.json()["error"]["code"] == "missing_api_key"
        assert r.headers["www-authenticate"].startswith("Bearer")
        r = await client.post(
            _url(server, "/v1/completions"),
            json=_body(),
            headers={"authorization": "Bearer sk-wrong-0123456789"},
        )
        assert r.status_code == 401
        assert r.json()["error"]["code"] == "invalid_api_key"
        assert "sk-wrong" not in r.text
        r = await client.get(_url(server, "/v1/models"))
        assert r.status_code == 401
        for path in ("/health", "/metrics"):
            assert (await client.get(_url(server, path))).status_code == 200
        r = await client.post(
            _url(server, "/v1/completions"),
            json=_body(),
            headers={"authorization": f"Bearer {KEY}"},
        )
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] >= 1
    assert len(m.requests("Generate")) == 1


async def test_tenants_classes_models_and_rate_limits(
    make_worker: WorkerFactory, make_router: ServerFactory, tmp_path: Path
) -> None:
    m = await make_worker(Role.MIXED)
    keys = tmp_path / "keys.yaml"
    keys.write_text(KEYS_YAML)
    server = await make_router(m.address, auth=AuthSettings(key_file=str(keys)), slo=CLASSES)
    a = {"authorization": f"Bearer {TEAM_A}"}
    b = {"authorization": f"Bearer {TEAM_B}"}
    url = _url(server, "/v1/completions")
    async with httpx.AsyncClient() as client:
        r = await client.post(url, json=_body(), headers={**a, "x-slo-class": "interactive"})
        assert r.status_code == 403
        assert r.json()["error"]["code"] == "slo_class_not_allowed"
        r = await client.post(url, json=_body(), headers=b)
        assert r.status_code == 403
        assert r.json()["error"]["code"] == "model_not_allowed"
        r = await client.post(url, json=_body(), headers=a)  # no header: the tenant's class
        assert r.status_code == 200, r.text
        r = await client.post(url, json=_body(), headers={**a, "x-slo-class": "batch"})
        assert r.status_code == 200, r.text
        r = await client.post(url, json=_body(), headers=a)
        assert r.status_code == 429
        assert int(r.headers["retry-after"]) >= 1
        assert r.json()["error"]["code"] == "rate_limit_exceeded"
        assert r.json()["error"]["type"] == "requests"  # requestsPerMinute (OpenAI's type)
    batch = server.registry.get_sample_value(
        "splitserve_router_requests_total",
        {"outcome": "ok", "path": "aggregated", "slo_class": "batch"},
    )
    assert batch == 2


async def test_key_file_is_reloaded_without_a_restart(
    make_worker: WorkerFactory, make_router: ServerFactory, tmp_path: Path
) -> None:
    m = await make_worker(Role.MIXED)
    keys = tmp_path / "keys.yaml"
    keys.write_text(KEYS_YAML)
    auth = AuthSettings(key_file=str(keys), reload_interval_s=0.01)
    server = await make_router(m.address, auth=auth, slo=CLASSES)
    url = _url(server, "/v1/models")
    new_key = "sk-rotated-0123456789"
    async with httpx.AsyncClient() as client:
        assert (await client.get(url, headers={"authorization": f"Bearer {TEAM_A}"})).is_success
        keys.write_text(f"tenants:\n  - name: team-a\n    keys: [{new_key}]\n")
        st = keys.stat()
        os.utime(keys, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
        assert server.keys is not None
        for _ in range(200):
            r = await client.get(url, headers={"authorization": f"Bearer {new_key}"})
            if r.status_code == 200:
                break
        assert r.status_code == 200
        r = await client.get(url, headers={"authorization": f"Bearer {TEAM_A}"})
        assert r.status_code == 401
        # A broken file keeps the keys loaded before.
        keys.write_text("tenants: [")
        os.utime(keys, ns=(st.st_atime_ns, st.st_mtime_ns + 2_000_000_000))
        for _ in range(20):
            r = await client.get(url, headers={"authorization": f"Bearer {new_key}"})
            assert r.status_code == 200
    assert server.keys.reloads == 1


async def test_grpc_generate_needs_a_key_and_respects_the_tenant(
    make_worker: WorkerFactory, make_router: ServerFactory, tmp_path: Path
) -> None:
    m = await make_worker(Role.MIXED)
    keys = tmp_path / "keys.yaml"
    keys.write_text(KEYS_YAML)
    server = await make_router(m.address, auth=AuthSettings(key_file=str(keys)), slo=CLASSES)
    req = router_pb2.RouterGenerateRequest(prompt_token_ids=router_pb2.TokenIds(ids=[1, 2]))
    async with aio.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        stub = router_pb2_grpc.RouterStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            [c async for c in stub.Generate(req)]
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        md = (("authorization", f"Bearer {TEAM_A}"),)
        bad = router_pb2.RouterGenerateRequest(
            prompt_token_ids=router_pb2.TokenIds(ids=[1, 2]), slo_class="interactive"
        )
        with pytest.raises(grpc.aio.AioRpcError) as err:
            [c async for c in stub.Generate(bad, metadata=md)]
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        chunks = [c async for c in stub.Generate(req, metadata=md)]
        assert chunks[-1].finish_reason != 0


async def test_an_open_router_warns_at_start(
    make_router: ServerFactory, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="splitserve.router.auth"):
        await make_router()
    assert any("no API keys configured" in r.getMessage() for r in caplog.records)


async def test_metrics_on_their_own_port(make_router: ServerFactory) -> None:
    server = await make_router(auth=AuthSettings(key_sha256=(key_sha256_hex(KEY),)), metrics_port=0)
    assert server.metrics_port is not None
    async with httpx.AsyncClient() as client:
        r = await client.get(f"http://127.0.0.1:{server.metrics_port}/metrics")
        assert r.status_code == 200
        assert "splitserve_router" in r.text
        assert (await client.get(_url(server, "/metrics"))).status_code == 401
        assert (await client.get(_url(server, "/health"))).status_code == 200


async def test_refused_bad_input_counts_against_the_rate_limit(
    make_worker: WorkerFactory, make_router: ServerFactory, tmp_path: Path
) -> None:
    """A tenant's request is charged when it is admitted, before the body is checked (as
    Envoy's rate limit filters count a request when its headers arrive): a 400 or 415 for bad
    input still uses one of its `requestsPerMinute`, so bad requests are not free."""
    m = await make_worker(Role.MIXED)
    keys = tmp_path / "keys.yaml"
    keys.write_text(KEYS_YAML)
    server = await make_router(m.address, auth=AuthSettings(key_file=str(keys)), slo=CLASSES)
    a = {"authorization": f"Bearer {TEAM_A}"}
    url = _url(server, "/v1/completions")
    async with httpx.AsyncClient() as client:
        r = await client.post(
            url, content=b"{not json", headers={**a, "content-type": "application/json"}
        )
        assert r.status_code == 400, r.text
        r = await client.post(
            url,
            content=b'{"model": "' + MODEL.encode() + b'"}',
            headers={**a, "content-type": "text/plain"},
        )
        assert r.status_code == 415, r.text
        r = await client.post(url, json=_body(), headers=a)
        assert r.status_code == 429, r.text
        assert r.json()["error"]["code"] == "rate_limit_exceeded"
    assert m.requests("Generate") == []


async def test_a_token_rate_limit_429_is_typed_tokens(
    make_worker: WorkerFactory, make_router: ServerFactory, tmp_path: Path
) -> None:
    """OpenAI types a token-rate 429 `tokens` (a request-rate one `requests`)."""
    m = await make_worker(Role.MIXED)
    keys = tmp_path / "keys.yaml"
    keys.write_text(f'tenants:\n  - name: t\n    keys: ["{KEY}"]\n    tokensPerMinute: 6\n')
    server = await make_router(m.address, auth=AuthSettings(key_file=str(keys)))
    h = {"authorization": f"Bearer {KEY}"}
    async with httpx.AsyncClient() as client:
        r = await client.post(_url(server, "/v1/completions"), json=_body(), headers=h)
        assert r.status_code == 200, r.text  # 4 of 6 tokens
        r = await client.post(_url(server, "/v1/completions"), json=_body(), headers=h)
        assert r.status_code == 429, r.text
        assert r.json()["error"]["type"] == "tokens"
        assert r.json()["error"]["code"] == "rate_limit_exceeded"
        assert int(r.headers["retry-after"]) >= 1


async def test_v1_models_lists_only_the_models_a_tenant_may_call(
    make_worker: WorkerFactory, make_router: ServerFactory, tmp_path: Path
) -> None:
    """A tenant whose `models` leave out the served model neither sees it in /v1/models nor
    finds it at /v1/models/{id} (404, as for a model that does not exist): it could only get
    403 calling it (user20b: it was listed)."""
    m = await make_worker(Role.MIXED)
    keys = tmp_path / "keys.yaml"
    keys.write_text(KEYS_YAML)
    server = await make_router(m.address, auth=AuthSettings(key_file=str(keys)), slo=CLASSES)
    a = {"authorization": f"Bearer {TEAM_A}"}  # models: [MODEL]
    b = {"authorization": f"Bearer {TEAM_B}"}  # models: [another-model]
    async with httpx.AsyncClient() as client:
        r = await client.get(_url(server, "/v1/models"), headers=a)
        assert [c["id"] for c in r.json()["data"]] == [MODEL]
        assert (await client.get(_url(server, f"/v1/models/{MODEL}"), headers=a)).status_code == 200
        r = await client.get(_url(server, "/v1/models"), headers=b)
        assert r.status_code == 200
        assert r.json() == {"object": "list", "data": []}
        r = await client.get(_url(server, f"/v1/models/{MODEL}"), headers=b)
        assert r.status_code == 404, r.text
        assert r.json()["error"]["code"] == "model_not_found"


async def test_grpc_generate_refuses_a_tenant_whose_models_leave_out_the_served_model(
    make_worker: WorkerFactory, make_router: ServerFactory, tmp_path: Path
) -> None:
    """gRPC requests name no model: the served one is theirs, and a tenant whose `models`
    leave it out is refused (PERMISSION_DENIED naming it) as over HTTP (it streamed)."""
    m = await make_worker(Role.MIXED)
    keys = tmp_path / "keys.yaml"
    keys.write_text(KEYS_YAML)
    server = await make_router(m.address, auth=AuthSettings(key_file=str(keys)), slo=CLASSES)
    req = router_pb2.RouterGenerateRequest(prompt_token_ids=router_pb2.TokenIds(ids=[1, 2]))
    async with aio.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        stub = router_pb2_grpc.RouterStub(channel)
        md = (("authorization", f"Bearer {TEAM_B}"),)  # models: [another-model]
        with pytest.raises(grpc.aio.AioRpcError) as err:
            [c async for c in stub.Generate(req, metadata=md)]
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert MODEL in (err.value.details() or "")
    assert m.requests("Generate") == []


async def test_tokenize_and_detokenize_follow_the_tenants_models_and_request_rate(
    make_worker: WorkerFactory, make_router: ServerFactory, tmp_path: Path
) -> None:
    """`/tokenize` and `/detokenize` (tokenizer CPU, at the client's cost) apply the tenant's
    `models` (the served one when the body names none; 403 as for completions) and count
    against its `requestsPerMinute` (they were 200 for any tenant, without limit)."""
    m = await make_worker(Role.MIXED)
    keys = tmp_path / "keys.yaml"
    keys.write_text(KEYS_YAML)
    server = await make_router(m.address, auth=AuthSettings(key_file=str(keys)), slo=CLASSES)
    a = {"authorization": f"Bearer {TEAM_A}"}  # models: [MODEL], 2 requests a minute
    b = {"authorization": f"Bearer {TEAM_B}"}  # models: [another-model]
    async with httpx.AsyncClient() as client:
        for path, body in (("/tokenize", {"prompt": "hi"}), ("/detokenize", {"tokens": [1]})):
            for named in ({}, {"model": MODEL}):
                r = await client.post(_url(server, path), json={**body, **named}, headers=b)
                assert r.status_code == 403, (path, named, r.text)
                assert r.json()["error"]["code"] == "model_not_allowed"
                assert MODEL in r.json()["error"]["message"]
        r = await client.post(_url(server, "/tokenize"), json={"prompt": "hi"}, headers=a)
        assert r.status_code == 200, r.text
        r = await client.post(_url(server, "/detokenize"), json={"tokens": [1]}, headers=a)
        assert r.status_code == 200, r.text
        r = await client.post(_url(server, "/tokenize"), json={"prompt": "hi"}, headers=a)
        assert r.status_code == 429, r.text
        assert r.json()["error"]["type"] == "requests"


@pytest.mark.parametrize("bad", [0, -5, 1.5, True, "8"])
async def test_an_invalid_max_tokens_is_the_apps_400_and_charges_no_tokens(
    make_worker: WorkerFactory, make_router: ServerFactory, tmp_path: Path, bad: object
) -> None:
    """`max_tokens: 0` (or -5, 1.5) was charged the router's default budget, and refused with a
    429 saying the request asks for that many tokens."""
    m = await make_worker(Role.MIXED)
    keys = tmp_path / "keys.yaml"
    keys.write_text(f'tenants:\n  - name: t\n    keys: ["{KEY}"]\n    tokensPerMinute: 10\n')
    server = await make_router(m.address, auth=AuthSettings(key_file=str(keys)))
    h = {"authorization": f"Bearer {KEY}"}
    url = _url(server, "/v1/completions")
    async with httpx.AsyncClient() as client:
        r = await client.post(url, json=_body(max_tokens=bad), headers=h)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == "max_tokens"
        r = await client.post(url, json=_body(max_tokens=10), headers=h)
        assert r.status_code == 200, r.text  # the bad request took none of the 10 tokens


async def test_a_refused_path_cannot_forge_a_log_line(
    make_router: ServerFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """A client without a key wrote a line of its own into the router's log with a `%0a` in
    the path (`refused GET /v1/x` + newline + a fake ERROR record)."""
    server = await make_router(auth=AuthSettings(key_sha256=(key_sha256_hex(KEY),)))
    forged = "2026-11-29 07:30:00,000 ERROR router splitserve.router.auth: FORGED"
    with caplog.at_level(logging.INFO, logger="splitserve.router.auth"):
        async with httpx.AsyncClient() as client:
            r = await client.get(_url(server, "/v1/x%0a" + forged.replace(" ", "%20")))
    assert r.status_code == 401
    refused = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert refused
    assert all("\n" not in m and "FORGED" in m for m in refused), refused
