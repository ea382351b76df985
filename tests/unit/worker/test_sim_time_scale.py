"""`--sim-time-scale 0`: a zero-delay simulated engine (issue 17 item 6)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from splitserve._gen.v1 import common_pb2, worker_pb2
from splitserve.cli.worker import worker
from splitserve.core.errors import ConfigError
from splitserve.core.perf import BatchShape
from splitserve.core.roles import Role
from splitserve.worker.runtime import WorkerConfig, _ReleaseClient, build_sim_engine
from splitserve.worker.sim_engine import SimEngine, ZeroDelay
from tests.unit.worker.conftest import WorkerFactory


async def test_zero_scale_prices_every_step_at_zero_and_still_generates(
    make_worker: WorkerFactory,
) -> None:
    w = await make_worker(Role.MIXED, sim_time_scale=0.0)
    engine = w.service.engine
    assert isinstance(engine, SimEngine)
    assert isinstance(engine.latency, ZeroDelay)
    assert engine.latency.step_s(BatchShape(((4096, 0),), (8,) * 64)) == 0.0
    assert engine.latency.kv_transfer_s(1 << 30) == 0.0
    req = worker_pb2.GenerateRequest(
        request_id="z",
        prompt_token_ids=list(range(16, 48)),
        sampling=common_pb2.SamplingParams(max_tokens=16, ignore_eos=True),
    )
    tokens = [t async for c in w.stub.Generate(req) for t in c.token_ids]
    assert len(tokens) == 16


def test_zero_scale_keeps_the_kv_cache_size() -> None:
    def blocks(scale: float) -> int:
        engine = build_sim_engine(WorkerConfig(sim_time_scale=scale), "a:1", _ReleaseClient())
        return engine.config.num_kv_blocks

    assert blocks(0.0) == blocks(1.0)


def test_negative_scale_is_refused() -> None:
    with pytest.raises(ConfigError, match="sim_time_scale"):
        build_sim_engine(WorkerConfig(sim_time_scale=-1.0), "a:1", _ReleaseClient())
    result = CliRunner().invoke(worker, ["serve", "--sim-time-scale", "-1"])
    assert result.exit_code == 2
    assert "--sim-time-scale" in result.output
