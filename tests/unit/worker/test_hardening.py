"""Worker-side bad input and resource bounds (issue 12): clear INVALID_ARGUMENT / ABORTED answers,
never UNKNOWN, and KV handles checked like a real engine checks them (item 7).

Over a real SimEngine behind a real grpc.aio server (tests/unit/worker/conftest.py).
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from splitserve._gen.v1 import common_pb2, worker_pb2
from splitserve.core.ids import RequestId
from splitserve.core.kv import KvHandle
from splitserve.core.roles import Role
from splitserve.worker.runtime import ReleaseError, _ReleaseClient
from tests.unit.worker.conftest import RunningWorker, WorkerFactory

PROMPT = list(range(20, 84))


def sampling(max_tokens: int = 6, **kw: float) -> common_pb2.SamplingParams:
    """`ignore_eos`: answers run to `max_tokens`, as these tests count on."""
    params = common_pb2.SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    for name, value in kw.items():
        setattr(params, name, value)
    return params


async def _finish(call: Any) -> None:
    if isinstance(call, grpc.aio.UnaryStreamCall):
        while await call.read() is not grpc.aio.EOF:
            pass
    else:
        await call


async def _status(call: Any) -> tuple[grpc.StatusCode, str]:
    """The error status of a unary call or a stream (read to its end)."""
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await _finish(call)
    return info.value.code(), info.value.details() or ""


async def _prefill(p: RunningWorker, rid: str, prompt: list[int] = PROMPT) -> Any:
    return await p.stub.Prefill(
        worker_pb2.PrefillRequest(request_id=rid, prompt_token_ids=prompt, sampling=sampling())
    )


def _decode(d: RunningWorker, rid: str, pre: Any, prompt: list[int] = PROMPT) -> Any:
    return d.stub.Decode(
        worker_pb2.DecodeRequest(
            request_id=rid,
            prompt_token_ids=prompt,
            first_token_id=pre.first_token_id,
            sampling=sampling(),
            kv=pre.kv,
        )
    )


# -- context limit ---------------------------------------------------------------------------


async def test_a_100k_token_prompt_beyond_the_context_limit_is_invalid_argument(
    make_worker: WorkerFactory,
) -> None:
    w = await make_worker(Role.MIXED, sim_max_model_len=4096, sim_num_kv_blocks=8192)
    huge = [21] * 100_000
    code, details = await _status(
        w.stub.Prefill(
            worker_pb2.PrefillRequest(request_id="big", prompt_token_ids=huge, sampling=sampling())
        )
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "max_model_len 4096" in details
    assert "100000" in details
    code, details = await _status(
        w.stub.Generate(
            worker_pb2.GenerateRequest(request_id="g", prompt_token_ids=huge, sampling=sampling())
        )
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert w.service.engine.in_flight == 0  # nothing was queued


async def test_prompt_plus_max_tokens_is_checked_for_generate(make_worker: WorkerFactory) -> None:
    w = await make_worker(Role.MIXED, sim_max_model_len=100)
    code, details = await _status(
        w.stub.Generate(
            worker_pb2.GenerateRequest(
                request_id="g", prompt_token_ids=PROMPT, sampling=sampling(max_tokens=50)
            )
        )
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "max_tokens (50)" in details
    # At the limit exactly it runs.
    ok = w.stub.Generate(
        worker_pb2.GenerateRequest(
            request_id="g2", prompt_token_ids=PROMPT, sampling=sampling(max_tokens=36)
        )
    )
    n = 0
    while (chunk := await ok.read()) is not grpc.aio.EOF:
        n += len(chunk.token_ids)
    assert n == 36


async def test_an_empty_prompt_is_invalid_argument(make_worker: WorkerFactory) -> None:
    w = await make_worker(Role.MIXED)
    code, details = await _status(
        w.stub.Prefill(worker_pb2.PrefillRequest(request_id="e", sampling=sampling()))
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "prompt_token_ids" in details


# -- sampling values ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", -1.0),
        ("temperature", float("nan")),
        ("temperature", float("inf")),
        ("top_p", 1.5),
        ("top_p", -0.5),
        ("top_p", float("nan")),
    ],
)
@pytest.mark.parametrize("rpc", ["Prefill", "Generate"])
async def test_bad_sampling_values_are_invalid_argument_naming_the_field(
    make_worker: WorkerFactory, field: str, value: float, rpc: str
) -> None:
    w = await make_worker(Role.MIXED)
    params = sampling(6, **{field: value})
    if rpc == "Prefill":
        call: Any = w.stub.Prefill(
            worker_pb2.PrefillRequest(request_id="s", prompt_token_ids=PROMPT, sampling=params)
        )
    else:
        call = w.stub.Generate(
            worker_pb2.GenerateRequest(request_id="s", prompt_token_ids=PROMPT, sampling=params)
        )
    code, details = await _status(call)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert field in details


# -- WatchLoad interval ---------------------------------------------------------------------------


@pytest.mark.parametrize("interval_s", [1e-9, 0.001, -1.0, float("nan"), 1e9])
async def test_watch_load_refuses_an_interval_that_would_pin_a_core(
    make_worker: WorkerFactory, interval_s: float
) -> None:
    w = await make_worker(Role.MIXED)
    call = w.stub.WatchLoad(worker_pb2.WatchLoadRequest(interval_s=interval_s))
    code, details = await _status(call)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "interval_s" in details


async def test_watch_load_at_the_floor_still_streams(make_worker: WorkerFactory) -> None:
    w = await make_worker(Role.MIXED)
    call = w.stub.WatchLoad(worker_pb2.WatchLoadRequest(interval_s=0.01))
    first = await call.read()
    second = await call.read()
    call.cancel()
    assert second.seq > first.seq


# -- KV handles (item 7) --------------------------------------------------------------------------


async def test_a_handle_of_another_transport_or_length_is_refused(
    make_worker: WorkerFactory,
) -> None:
    p = await make_worker(Role.PREFILL)
    d = await make_worker(Role.DECODE)
    pre = await _prefill(p, "a")
    pre.kv.transport = "nixl"
    code, details = await _status(_decode(d, "a", pre))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "kv.transport" in details
    pre.kv.transport = "sim"
    code, details = await _status(_decode(d, "a", pre, prompt=PROMPT[:-1]))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "kv.num_tokens" in details


@pytest.mark.parametrize("params_json", ["{not json", "[1, 2]", "5"])
async def test_a_handle_whose_params_are_no_json_object_is_refused(
    make_worker: WorkerFactory, params_json: str
) -> None:
    """It was UNKNOWN ("Unexpected JSONDecodeError") with a traceback in the worker's log."""
    p = await make_worker(Role.PREFILL)
    d = await make_worker(Role.DECODE)
    pre = await _prefill(p, "a")
    pre.kv.params_json = params_json
    code, details = await _status(_decode(d, "a", pre))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "kv.params_json" in details
    assert d.service.engine.in_flight == 0


async def test_an_unknown_handle_fails_the_decode_with_a_clear_error(
    make_worker: WorkerFactory,
) -> None:
    p = await make_worker(Role.PREFILL)
    d = await make_worker(Role.DECODE)
    pre = await _prefill(p, "a")
    pre.kv.source_request_id = "never-prefilled"
    code, details = await _status(_decode(d, "a", pre))
    assert code == grpc.StatusCode.ABORTED
    assert "not held by" in details
    assert "never-prefilled" in details
    assert d.service.engine.in_flight == 0
    assert d.sample("splitserve_worker_requests_total", kind="decode", outcome="rejected") == 1


async def test_a_released_handle_cannot_be_pulled_twice(make_worker: WorkerFactory) -> None:
    p = await make_worker(Role.PREFILL)
    d = await make_worker(Role.DECODE)
    pre = await _prefill(p, "a")
    first = _decode(d, "a", pre)
    while await first.read() is not grpc.aio.EOF:
        pass
    assert p.service.load_report().num_kv_held == 0  # the pull released it
    code, details = await _status(_decode(d, "a-again", pre))
    assert code == grpc.StatusCode.ABORTED
    assert "already released" in details


async def test_prefill_dies_while_holding_kv(make_worker: WorkerFactory) -> None:
    """The prefill worker holds the KV, then goes away before the decode worker pulls it: the
    decode fails with ABORTED naming the unreachable source (what the router turns into a
    Generate), and the decode worker is left clean."""
    p = await make_worker(Role.PREFILL)
    d = await make_worker(Role.DECODE)
    pre = await _prefill(p, "a")
    assert p.service.load_report().num_kv_held == 1
    await p.server.stop(None)  # the process is gone: nothing listens at its address
    code, details = await _status(_decode(d, "a", pre))
    assert code == grpc.StatusCode.ABORTED
    assert "unreachable" in details
    assert p.address in details
    assert d.service.engine.in_flight == 0
    report = d.service.load_report()
    assert report.kv_blocks_free == report.kv_blocks_total


# -- the decode worker's channel cache ------------------------------------------------------------


async def test_release_channels_are_a_bounded_lru_cache(make_worker: WorkerFactory) -> None:
    sources = [await make_worker(Role.PREFILL) for _ in range(3)]
    client = _ReleaseClient(max_channels=2)
    try:
        for i, w in enumerate(sources):
            pre = await _prefill(w, f"r{i}")
            kv = KvHandle("sim", w.address, RequestId(f"r{i}"), len(PROMPT), 0)
            assert await client(kv) is True
            assert pre.kv.source_address == w.address
            assert len(client) <= 2
        assert len(client) == 2
        # An unknown request at a live source: the source says so.
        assert await client(KvHandle("sim", sources[0].address, RequestId("x"), 1, 0)) is False
    finally:
        await client.close()
    with pytest.raises(ValueError, match="max_channels"):
        _ReleaseClient(max_channels=0)


async def test_many_sources_do_not_grow_the_cache(make_worker: WorkerFactory) -> None:
    client = _ReleaseClient(max_channels=4)
    try:
        # Addresses nobody listens on (gone prefill workers): each call fails, none is kept
        # beyond the bound.
        for port in range(1, 30):
            kv = KvHandle("sim", f"127.0.0.1:{port}", RequestId("r"), 1, 0)
            with pytest.raises(ReleaseError):
                await asyncio.wait_for(client(kv), 10)
            assert len(client) <= 4
    finally:
        await client.close()
