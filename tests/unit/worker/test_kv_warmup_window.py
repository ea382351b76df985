"""The serving side of a pair's warm-up: while a peer warms up with it, a prefill worker
progresses NIXL (`nixl.WarmupWindow`), then goes idle again; `KvEndpoint(warm_up_ms)` opens it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import grpc
import pytest
from grpc import aio

from splitserve._gen.v1 import worker_pb2, worker_pb2_grpc
from splitserve.worker.kv_warm import KvWarmupServer, warmup_ms
from splitserve.worker.vllm_adapter.engine import (
    IDLE_WAIT_S,
    WARMUP_POLL_S,
    VllmEngine,
    VllmEngineConfig,
)
from splitserve.worker.vllm_adapter.nixl import WARM_NOTIF, WarmupWindow
from tests.fakes.clock import SleepingClock


class _Agent:
    """A nixl_agent's `get_new_notifs`: each call returns the next queued batch (or nothing)."""

    def __init__(self) -> None:
        self.batches: list[dict[str, list[bytes]]] = []
        self.calls = 0

    def get_new_notifs(self, backends: list[str] | None = None) -> dict[str, list[bytes]]:
        self.calls += 1
        return self.batches.pop(0) if self.batches else {}


def test_idle_without_a_window_nothing_is_polled() -> None:
    agent = _Agent()
    window = WarmupWindow(agent, SleepingClock())
    for _ in range(100):
        window.progress()
    assert agent.calls == 0
    assert (window.active, window.polls) == (False, 0)
    window.open(0)  # a plain lookup asks for no window
    window.progress()
    assert (agent.calls, window.opened) == (0, 0)


def test_a_window_progresses_until_the_warm_up_notification_then_stops() -> None:
    agent = _Agent()
    clock = SleepingClock()
    window = WarmupWindow(agent, clock)
    window.open(2.0)
    assert window.active
    window.progress()
    window.progress()
    assert agent.calls == 2  # progressing NIXL (the agent's notification read) while idle
    agent.batches.append({"decode-agent": [WARM_NOTIF]})
    window.progress()
    assert window.warm_notifs == 1
    assert not window.active
    calls = agent.calls
    for _ in range(50):
        window.progress()
    assert agent.calls == calls, "no polling once the peer's warm-up READ has notified"


def test_a_window_ends_at_its_time_without_a_notification() -> None:
    agent = _Agent()
    clock = SleepingClock()
    window = WarmupWindow(agent, clock)
    window.open(2.0)
    clock.t += 1.9
    window.progress()
    assert agent.calls == 1
    clock.t += 0.2
    assert not window.active
    window.progress()
    assert agent.calls == 1
    assert window.warm_notifs == 0


def test_two_peers_warming_at_once_keep_it_open_for_both() -> None:
    agent = _Agent()
    window = WarmupWindow(agent, SleepingClock())
    window.open(2.0)
    window.open(2.0)
    agent.batches.append({"d1": [WARM_NOTIF]})
    window.progress()
    assert window.active, "the second peer's READ has not notified yet"
    agent.batches.append({"d2": [WARM_NOTIF]})
    window.progress()
    assert not window.active
    assert (window.opened, window.warm_notifs) == (2, 2)


def test_requests_notifications_read_in_a_window_reach_vllm() -> None:
    agent = _Agent()
    window = WarmupWindow(agent, SleepingClock())
    assert agent.get_new_notifs == window.get_new_notifs  # vLLM's calls go through it
    window.open(2.0)
    agent.batches.append({"d1": [b"req-7:1", b"HB:req-8"], "d2": [b"req-9:1"]})
    window.progress()
    assert window.active, "no warm-up notification yet"
    agent.batches.append({"d1": [b"req-10:1"]})
    got = agent.get_new_notifs()  # what vLLM's `_get_new_notifs` calls
    assert got == {"d1": [b"req-7:1", b"HB:req-8", b"req-10:1"], "d2": [b"req-9:1"]}
    assert agent.get_new_notifs() == {}, "handed over once"


def _engine(agent: _Agent, clock: SleepingClock) -> VllmEngine:
    engine = VllmEngine(VllmEngineConfig(model="m"))
    engine._warmup = WarmupWindow(agent, clock)
    return engine


def test_the_engine_thread_polls_closely_only_inside_a_window() -> None:
    agent = _Agent()
    clock = SleepingClock()
    engine = _engine(agent, clock)
    assert engine._idle_wait_s() == IDLE_WAIT_S
    assert engine._warmup is not None
    engine._warmup.open(2.0)
    assert engine._idle_wait_s() == WARMUP_POLL_S
    agent.batches.append({"d": [WARM_NOTIF]})
    engine._warmup.progress()
    assert engine._idle_wait_s() == IDLE_WAIT_S, "back to idle once the peer has notified"


def test_serve_kv_warmup_needs_a_started_engine_with_nixl() -> None:
    engine = VllmEngine(VllmEngineConfig(model="m"))
    assert isinstance(engine, KvWarmupServer)
    assert engine.serve_kv_warmup(2.0) is False  # not started: no NIXL worker to progress


def test_warmup_ms_from_the_environment() -> None:
    assert warmup_ms({}) == 2000
    assert warmup_ms({"SPLITSERVE_KV_WARMUP_MS": "0"}) == 0
    assert warmup_ms({"SPLITSERVE_KV_WARMUP_MS": "500"}) == 500
    for bad in ("-1", "1.5", "x", "10001"):
        with pytest.raises(ValueError, match="SPLITSERVE_KV_WARMUP_MS"):
            warmup_ms({"SPLITSERVE_KV_WARMUP_MS": bad})


class _ServingEngine:
    """A peer engine that records the warm-up windows it is asked for."""

    def __init__(self, engine_id: str) -> None:
        self.engine_id = engine_id
        self.windows: list[float] = []

    def kv_endpoint(self) -> tuple[str, dict[str, Any]] | None:
        return ("nixl", {"engine_id": self.engine_id})

    async def warm_kv(self, endpoint: Mapping[str, Any]) -> bool:
        return True

    def serve_kv_warmup(self, seconds: float) -> bool:
        self.windows.append(seconds)
        return True


async def test_warm_kv_asks_each_peer_to_progress_while_it_warms_up(serve: Any) -> None:
    prefill = _ServingEngine("p")
    p_addr = await serve(prefill)
    d_addr = await serve(_ServingEngine("d"))  # default: the environment's 2000 ms
    off_addr = await serve(_ServingEngine("d-off"), 0)
    async with aio.insecure_channel(d_addr) as channel:
        out = await worker_pb2_grpc.WorkerKvStub(channel).WarmKv(
            worker_pb2.WarmKvRequest(peers=[p_addr])
        )
        assert list(out.warmed) == [p_addr]
    assert prefill.windows == [2.0]
    async with aio.insecure_channel(off_addr) as channel:
        await worker_pb2_grpc.WorkerKvStub(channel).WarmKv(worker_pb2.WarmKvRequest(peers=[p_addr]))
    assert prefill.windows == [2.0], "SPLITSERVE_KV_WARMUP_MS=0 asks for no window"


async def test_a_plain_endpoint_lookup_opens_no_window_and_too_long_is_refused(
    serve: Any,
) -> None:
    prefill = _ServingEngine("p")
    p_addr = await serve(prefill)
    async with aio.insecure_channel(p_addr) as channel:
        stub = worker_pb2_grpc.WorkerKvStub(channel)
        await stub.KvEndpoint(worker_pb2.KvEndpointRequest())
        assert prefill.windows == []
        await stub.KvEndpoint(worker_pb2.KvEndpointRequest(warm_up_ms=250))
        assert prefill.windows == [0.25]
        with pytest.raises(aio.AioRpcError) as err:
            await stub.KvEndpoint(worker_pb2.KvEndpointRequest(warm_up_ms=10_001))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "warm_up_ms" in (err.value.details() or "")
    assert prefill.windows == [0.25]
