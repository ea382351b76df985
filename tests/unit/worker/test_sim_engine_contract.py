"""The simulated engine against the `Engine` protocol: no path ignores what it is given, and the
optional early-decode preparation is part of the protocol (the server called it through
`getattr` and `type: ignore` before).

Before: `build_sim_engine` with engine arguments only logged "the sim engine ignores engine
arguments" and went on; `SimEngine` had no `prepare_decode` / `discard_prepared`."""

from __future__ import annotations

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
