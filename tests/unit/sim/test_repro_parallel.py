"""`--jobs`: the reproductions' independent units run in worker processes with results identical
to one process (each unit seeds its own generators)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from splitserve.sim import runner
from splitserve.sim.reproductions import alise, bros, distserve
from splitserve.sim.reproductions.common import latency_source, parallel, parallel_map
from splitserve.sim.workload import Fixed

Unit = tuple[Callable[..., object], tuple[tuple[object, ...], ...]]


def _calls() -> list[Unit]:
    lengths = (Fixed(512), Fixed(64))
    span = (30, 5.0)
    return [
        (
            distserve._search_unit,
            (
                (0, 0, "vllm", lengths, span, 0.3, distserve._SLO),
                (1, 1, "distserve", lengths, span, 0.3, distserve._SLO),
            ),
        ),
        (
            bros.run,
            (
                (bros.VLLM, bros.DATASETS[0], 3.0, 10.0),
                (bros.BROS, bros.DATASETS[0], 3.0, 10.0),
            ),
        ),
        (
            alise.run,
            tuple(
                (alise.systems(alise.SHAREGPT)[name], alise.SHAREGPT, 1.0, 20.0)
                for name in ("vLLM", "ALISE")
            ),
        ),
    ]


def test_workers_give_the_same_results_as_one_process() -> None:
    with latency_source("gpu"):
        alone = [parallel_map(fn, list(calls)) for fn, calls in _calls()]
        with parallel(2):
            spread = [parallel_map(fn, list(calls)) for fn, calls in _calls()]
    assert spread == alone
    assert all(len(found) == 2 for found in alone)


def test_latency_source_reaches_the_workers() -> None:
    unit = (1, 1, "distserve", (Fixed(512), Fixed(64)), (30, 5.0), 0.3, distserve._SLO)
    with latency_source("gpu"), parallel(2):
        gpu = parallel_map(distserve._search_unit, [unit])
    with latency_source("roofline"), parallel(2):
        roofline = parallel_map(distserve._search_unit, [unit])
    assert gpu != roofline


def test_jobs_refused_where_it_cannot_act(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="--jobs 2: tetriinfer"):
        runner.run_reproduction("tetriinfer", True, tmp_path, jobs=2)
    with pytest.raises(ValueError, match="jobs must be at least 1"), parallel(0):
        pass


def test_cli_refuses_jobs_it_cannot_use() -> None:
    from click.testing import CliRunner

    from splitserve.cli.sim import sim

    res = CliRunner().invoke(sim, ["reproduce", "tetriinfer", "--quick", "--jobs", "2"])
    assert res.exit_code != 0
    assert "--jobs acts on alise, bros, distserve" in res.output
    res = CliRunner().invoke(sim, ["reproduce", "distserve", "--quick", "--jobs", "0"])
    assert res.exit_code == 2
    assert "--jobs" in res.output
