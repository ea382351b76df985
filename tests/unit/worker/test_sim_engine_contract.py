"""The simulated engine against the `Engine` protocol: no path ignores what it is given, and the
optional early-decode preparation is part of the protocol (the server called it through
`getattr` and `type: ignore` before).

Before: `build_sim_engine` with engine arguments only logged "the sim engine ignores engine
arguments" and went on; `SimEngine` had no `prepare_decode` / `discard_prepared`."""

from __future__ import annotations

import asyncio
import gc
import logging

import pytest

from splitserve.core.errors import ConfigError
from splitserve.core.ids import RequestId
from splitserve.core.request import Request, SamplingSpec
from splitserve.worker.engine import Engine
from splitserve.worker.runtime import WorkerConfig, _ReleaseClient, build_sim_engine


def test_engine_arguments_are_refused_by_the_sim_engine_naming_them() -> None:
    cfg = WorkerConfig(engine_args=("--dtype", "float32", "--enforce-eager"))
    with pytest.raises(ConfigError, match="--dtype float32 --enforce-eager"):
        build_sim_engine(cfg, "127.0.0.1:1", _ReleaseClient())


def test_without_engine_arguments_the_sim_engine_builds() -> None:
    assert build_sim_engine(WorkerConfig(), "127.0.0.1:1", _ReleaseClient()).kind == "sim"


def test_the_sim_engine_prepares_nothing_for_an_early_decode() -> None:
    engine: Engine = build_sim_engine(WorkerConfig(), "127.0.0.1:1", _ReleaseClient())
    req = Request(RequestId("r"), (20, 21, 22), SamplingSpec(max_tokens=4), 0.0)
    assert engine.prepare_decode(req) is False
    engine.discard_prepared(req.id)  # a no-op, callable whatever was prepared
    assert engine.in_flight == 0


async def test_the_engine_stops_right_after_a_cancelled_prefill_woke_it() -> None:
    # Before: `_idle_wait` slept in `asyncio.wait_for(self._wake.wait(), 1.0)`. On Python 3.11,
    # `wait_for` swallows a cancellation that arrives once the awaited wait is already done, so
    # `stop()` right after a request woke the engine (here the caller's cancelled prefill) left
    # the loop running and `stop()` awaiting it forever: this test hung.
    engine = build_sim_engine(WorkerConfig(), "127.0.0.1:1", _ReleaseClient())
    await engine.start()
    req = Request(RequestId("r"), tuple(range(20, 60)), SamplingSpec(max_tokens=4), 0.0)
    task = asyncio.create_task(engine.prefill(req))
    await asyncio.sleep(0)  # the prefill is admitted; its step is not done
    assert engine.in_flight == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    async with asyncio.timeout(10) as guard:  # a guard against the hang, not a speed check
        await engine.stop()  # called in the same step as the await above: the racy moment
    assert not guard.expired()
    assert engine.in_flight == 0


async def test_a_prefill_cancelled_by_its_caller_leaves_no_unretrieved_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Before: the caller's cancellation (the router's client left) made `cancel` fail the
    # shielded `prefilled` future with EngineError("request cancelled") that nobody awaited, and
    # asyncio logged "Future exception was never retrieved" at ERROR for every such request.
    engine = build_sim_engine(WorkerConfig(), "127.0.0.1:1", _ReleaseClient())
    await engine.start()
    try:
        req = Request(RequestId("r"), tuple(range(20, 60)), SamplingSpec(max_tokens=4), 0.0)
        task = asyncio.create_task(engine.prefill(req))
        await asyncio.sleep(0)  # the prefill is admitted; its step is not done
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        del task
        with caplog.at_level(logging.ERROR, logger="asyncio"):
            gc.collect()  # an unretrieved exception is reported when its future is collected
    finally:
        await engine.stop()
    assert [r.getMessage() for r in caplog.records if r.name == "asyncio"] == []
