"""`--sim-latency-model` picks how a simulated worker prices steps (roofline or GPU-measured)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from splitserve.cli.up import worker_args
from splitserve.cli.worker import worker
from splitserve.core.errors import ConfigError
from splitserve.core.perf import RooflineModel, VidurModel
from splitserve.core.perf.measured import MeasuredGpuModel
from splitserve.worker.runtime import WorkerConfig, _ReleaseClient, build_sim_engine


def test_default_is_the_roofline() -> None:
    engine = build_sim_engine(WorkerConfig(), "127.0.0.1:1", _ReleaseClient())
    assert isinstance(engine.latency, RooflineModel)


def test_a_gpu_measured_model_is_used_when_named() -> None:
    cfg = WorkerConfig(
        sim_latency_model="vidur-h100", sim_model_shape="llama-2-7b", sim_hardware="h100-80g"
    )
    engine = build_sim_engine(cfg, "127.0.0.1:1", _ReleaseClient())
    assert isinstance(engine.latency, VidurModel)
    assert engine.latency.gpu == "h100"


@pytest.mark.parametrize(
    ("name", "hardware", "match"),
    [("vidur-h100", "a100-80g", "measured on h100-80g"), ("warp", "a100-80g", "unknown latency")],
)
def test_bad_latency_model_is_refused(name: str, hardware: str, match: str) -> None:
    cfg = WorkerConfig(sim_latency_model=name, sim_hardware=hardware)
    with pytest.raises(ConfigError, match=match):
        build_sim_engine(cfg, "127.0.0.1:1", _ReleaseClient())


def test_up_passes_the_option_to_simulated_workers() -> None:
    opts = {
        "engine": "sim",
        "model": "m",
        "log_level": "info",
        "sim_shape": "llama-2-7b",
        "sim_hardware": "h100-80g",
        "sim_time_scale": 1.0,
        "sim_latency_model": "vidur-h100",
        "vocab_size": 4096,
        "first_token_id": 16,
        "sim_kv_blocks": None,
        "max_model_len": 4096,
        "eos_token_id": 1,
        "sim_answer_tokens": 128,
    }
    args = worker_args("prefill", "p0", opts)
    assert args[args.index("--sim-latency-model") + 1] == "vidur-h100"
    res = CliRunner().invoke(worker, ["serve", "--help"])
    assert "--sim-latency-model" in res.output


def test_a_splitserve_measured_h200_model_is_used_when_named() -> None:
    cfg = WorkerConfig(
        sim_latency_model="measured-h200", sim_model_shape="llama-3-8b", sim_hardware="h200"
    )
    engine = build_sim_engine(cfg, "127.0.0.1:1", _ReleaseClient())
    assert isinstance(engine.latency, MeasuredGpuModel)
    assert engine.latency.gpu == "h200"
