"""The Worker gRPC service over a real SimEngine: roles, P/D handoff, cancel, drain, load."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from splitserve._gen.v1 import common_pb2, worker_pb2
from splitserve.core.roles import Role
from tests.unit.worker.conftest import WorkerFactory

PROMPT = list(range(20, 84))


def sampling(max_tokens: int = 6) -> common_pb2.SamplingParams:
    """`ignore_eos`: these tests count on answers that run to `max_tokens` (the simulated
    engine otherwise ends them at a length drawn per prompt, `test_answer_end.py`)."""
    return common_pb2.SamplingParams(max_tokens=max_tokens, ignore_eos=True)


async def collect(call: Any) -> tuple[list[int], list[int]]:
    """Read a TokenChunk stream to its end (read() style, so it can follow earlier reads)."""
    tokens: list[int] = []
    reasons: list[int] = []
    while (chunk := await call.read()) is not grpc.aio.EOF:
        tokens += list(chunk.token_ids)
        reasons.append(chunk.finish_reason)
    return tokens, reasons


async def test_pd_handoff_matches_aggregated_and_releases_kv(make_worker: WorkerFactory) -> None:
    p = await make_worker(Role.PREFILL)
    d = await make_worker(Role.DECODE)
    pre = await p.stub.Prefill(
        worker_pb2.PrefillRequest(request_id="a", prompt_token_ids=PROMPT, sampling=sampling())
    )
    assert pre.kv.source_address == p.address
    assert pre.kv.num_tokens == len(PROMPT)
    assert pre.finish_reason == common_pb2.FINISH_REASON_UNSPECIFIED
    held = p.service.load_report()
    assert held.num_kv_held == 1
    assert held.kv_blocks_free < held.kv_blocks_total
    decode = d.stub.Decode(
        worker_pb2.DecodeRequest(
            request_id="a",
            prompt_token_ids=PROMPT,
            first_token_id=pre.first_token_id,
            sampling=sampling(),
            kv=pre.kv,
        )
    )
    tokens, reasons = await collect(decode)
    agg, _ = await collect(
        d.stub.Generate(
            worker_pb2.GenerateRequest(request_id="b", prompt_token_ids=PROMPT, sampling=sampling())
        )
    )
    assert [pre.first_token_id, *tokens] == agg
    assert len(agg) == 6
    assert reasons[-1] == common_pb2.FINISH_REASON_LENGTH
    after = p.service.load_report()  # the decode side told the prefill side to free its KV
    assert after.num_kv_held == 0
    assert after.kv_blocks_free == after.kv_blocks_total
    assert p.sample("splitserve_worker_requests_total", kind="prefill", outcome="ok") == 1
    assert d.sample("splitserve_worker_requests_total", kind="decode", outcome="ok") == 1
    assert d.sample("splitserve_worker_steps_total") >= 5  # one per decoded token at least


@pytest.mark.parametrize(
    ("role", "rpc"),
    [(Role.PREFILL, "Generate"), (Role.DECODE, "Prefill")],
    ids=["prefill-cannot-generate", "decode-cannot-prefill"],
)
async def test_roles_are_enforced(make_worker: WorkerFactory, role: Role, rpc: str) -> None:
    w = await make_worker(role)
    if rpc == "Generate":
        call = w.stub.Generate(
            worker_pb2.GenerateRequest(request_id="x", prompt_token_ids=PROMPT, sampling=sampling())
        )
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await collect(call)
    else:
        req = worker_pb2.PrefillRequest(
            request_id="x", prompt_token_ids=PROMPT, sampling=sampling()
        )
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await w.stub.Prefill(req)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION


async def test_set_role_at_run_time(make_worker: WorkerFactory) -> None:
    w = await make_worker(Role.PREFILL)
    resp = await w.stub.SetRole(worker_pb2.SetRoleRequest(role=common_pb2.ROLE_DECODE))
    assert (resp.previous, resp.current) == (common_pb2.ROLE_PREFILL, common_pb2.ROLE_DECODE)
    tokens, _ = await collect(
        w.stub.Generate(
            worker_pb2.GenerateRequest(
                request_id="x", prompt_token_ids=PROMPT, sampling=sampling(3)
            )
        )
    )
    assert len(tokens) == 3
    assert w.service.load_report().role == common_pb2.ROLE_DECODE
    assert w.sample("splitserve_worker_role", role="decode") == 1
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await w.stub.SetRole(worker_pb2.SetRoleRequest(role=common_pb2.ROLE_UNSPECIFIED))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_bad_input_is_rejected_without_side_effects(make_worker: WorkerFactory) -> None:
    w = await make_worker(Role.MIXED, sim_num_kv_blocks=4, block_size=16)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await collect(
            w.stub.Generate(
                worker_pb2.GenerateRequest(
                    request_id="big", prompt_token_ids=list(range(100)), sampling=sampling(10)
                )
            )
        )
    assert err.value.code() == grpc.StatusCode.OUT_OF_RANGE
    assert "at most 64" in (err.value.details() or "")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await collect(
            w.stub.Generate(
                worker_pb2.GenerateRequest(
                    request_id="empty", prompt_token_ids=[], sampling=sampling()
                )
            )
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    report = w.service.load_report()
    assert report.kv_blocks_free == report.kv_blocks_total
    assert w.service.engine.in_flight == 0


async def test_cancel_stops_a_running_stream(make_worker: WorkerFactory) -> None:
    w = await make_worker(Role.MIXED)
    call = w.stub.Generate(
        worker_pb2.GenerateRequest(
            request_id="long", prompt_token_ids=PROMPT, sampling=sampling(4000)
        )
    )
    first = await call.read()
    assert len(first.token_ids) == 1
    resp = await w.stub.Cancel(worker_pb2.CancelRequest(request_id="long"))
    assert resp.found
    _tokens, reasons = await collect(call)
    assert reasons[-1] == common_pb2.FINISH_REASON_CANCELLED
    assert w.service.engine.in_flight == 0
    assert not (await w.stub.Cancel(worker_pb2.CancelRequest(request_id="long"))).found


async def test_client_going_away_cancels_the_request(make_worker: WorkerFactory) -> None:
    w = await make_worker(Role.MIXED)
    call = w.stub.Generate(
        worker_pb2.GenerateRequest(
            request_id="gone", prompt_token_ids=PROMPT, sampling=sampling(4000)
        )
    )
    await call.read()
    call.cancel()
    for _ in range(200):
        if w.service.engine.in_flight == 0:
            break
        await asyncio.sleep(0.01)
    assert w.service.engine.in_flight == 0
    assert w.sample("splitserve_worker_requests_total", kind="generate", outcome="cancelled") == 1


async def test_drain_refuses_new_work_and_waits_for_in_flight(make_worker: WorkerFactory) -> None:
    w = await make_worker(Role.MIXED)
    call = w.stub.Generate(
        worker_pb2.GenerateRequest(request_id="a", prompt_token_ids=PROMPT, sampling=sampling(30))
    )
    await call.read()
    drained = await w.stub.Drain(worker_pb2.DrainRequest(wait=True, timeout_s=30))
    assert drained.draining
    assert drained.in_flight == 0
    _tokens, reasons = await collect(call)  # the in-flight request ran to completion
    assert reasons[-1] == common_pb2.FINISH_REASON_LENGTH
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await collect(
            w.stub.Generate(
                worker_pb2.GenerateRequest(
                    request_id="b", prompt_token_ids=PROMPT, sampling=sampling()
                )
            )
        )
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert w.service.load_report().draining
    resumed = await w.stub.Drain(worker_pb2.DrainRequest(resume=True))
    assert not resumed.draining


async def test_watch_load_pushes_reports_about_every_interval(make_worker: WorkerFactory) -> None:
    w = await make_worker(Role.DECODE)
    call = w.stub.WatchLoad(worker_pb2.WatchLoadRequest(interval_s=0.02))
    seqs = []
    async for report in call:
        seqs.append(report.seq)
        assert report.role == common_pb2.ROLE_DECODE
        assert report.kv_blocks_total == 512
        assert report.engine == "sim"
        if len(seqs) == 3:
            break
    call.cancel()
    assert seqs == sorted(seqs)
    assert len(set(seqs)) == 3


async def test_prefill_that_finishes_at_first_token_returns_no_handle(
    make_worker: WorkerFactory,
) -> None:
    p = await make_worker(Role.PREFILL)
    pre = await p.stub.Prefill(
        worker_pb2.PrefillRequest(request_id="a", prompt_token_ids=PROMPT, sampling=sampling(1))
    )
    assert not pre.HasField("kv")
    assert pre.finish_reason == common_pb2.FINISH_REASON_LENGTH
    assert p.service.load_report().num_kv_held == 0
