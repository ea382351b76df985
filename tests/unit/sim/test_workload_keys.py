"""A scenario's workload keys act or are refused, and a trace replays as written.

Invariants:
- a workload key that the workload's `arrival` (or a length's `kind`, or a `preset`) does not
  read is refused naming it, before the run (each was silently ignored: two runs printed the
  same); a key left at its default is not "written";
- the dumped scenario (`config.yaml`) loads again and runs the same workload;
- a trace workload replays every row unless `trace.max_requests` caps it (it was cut to the
  500 of `num_requests`' default);
- a trace's arrival times count from its earliest row, whatever the rows' order (a row stamped
  before the first was refused as `arrival_s must be >= 0`);
- a trace `sim run` cannot read is a usage error naming `workload.trace.path`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from pydantic import ValidationError

from splitserve.api.validation import one_line
from splitserve.cli.sim import sim
from splitserve.core.errors import ConfigError
from splitserve.sim import runner
from splitserve.sim.config import ScenarioConfig, WorkloadConfig, build_workload
from splitserve.sim.workload import parse_azure_trace

DOCS = Path(__file__).resolve().parents[3] / "docs"

BASE: dict[str, Any] = {
    "name": "keys",
    "model": "tiny",
    "hardware": "a100-80g",
    "pools": [
        {"name": "prefill", "role": "prefill", "replicas": 1},
        {"name": "decode", "role": "decode", "replicas": 1},
    ],
    "slo_classes": [{"name": "default", "ttft_ms": 50, "tpot_ms": 20}],
}
FIXED = {"kind": "fixed", "tokens": 8}
POISSON = {"arrival": "poisson", "rate_per_s": 20.0, "num_requests": 20}
TRACE_ONLY = {"arrival": "trace", "trace": {"path": "t.csv"}}
HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
UNSORTED = HEADER + (
    "2023-11-16 18:15:48.0000000,300,30\n"
    "2023-11-16 18:15:47.0000000,200,20\n"
    "2023-11-16 18:15:49.0000000,400,40\n"
)


def _long_trace(rows: int) -> list[str]:
    return [HEADER] + [
        f"2023-11-16 {18 + i // 3600:02d}:{i // 60 % 60:02d}:{i % 60:02d}.0,50,5\n"
        for i in range(rows)
    ]


@pytest.mark.parametrize(
    ("workload", "named"),
    [
        (  # the preset won, prompt and output were ignored
            {**POISSON, "preset": "sharegpt", "prompt": {"kind": "fixed", "tokens": 4000}},
            "workload.prompt",
        ),
        ({**POISSON, "preset": "sharegpt", "output": FIXED}, "workload.output"),
        ({**POISSON, "preset": "sharegpt", "trace": {"path": "t.csv"}}, "workload.trace"),
        ({**POISSON, "preset": "sharegpt", "cv": 2}, "workload.cv=2"),
        ({**POISSON, "preset": "sharegpt", "cv": 1}, "workload.cv=1"),  # the default, written
        ({**TRACE_ONLY, "preset": "longbench"}, "workload.preset='longbench'"),
        ({**TRACE_ONLY, "prompt": FIXED, "output": FIXED}, "workload.prompt"),
        ({**TRACE_ONLY, "seed": 5}, "workload.seed=5"),  # a replay draws nothing at random
        ({**TRACE_ONLY, "cv": 9}, "workload.cv=9"),
        ({**TRACE_ONLY, "num_requests": 10}, "trace.max_requests"),
        (  # the rate rescales the timestamps whatever their scale
            {**TRACE_ONLY, "rate_per_s": 3, "trace": {"path": "t.csv", "time_scale": 2}},
            "trace.time_scale",
        ),
        (
            {**POISSON, "prompt": {**FIXED, "median_tokens": 5000, "sigma": 3}, "output": FIXED},
            "workload.prompt.median_tokens=5000",
        ),
        (
            {**POISSON, "prompt": {**FIXED, "sigma": 3}, "output": FIXED},
            "workload.prompt.sigma=3",
        ),
        (
            {**POISSON, "prompt": FIXED, "output": {**FIXED, "low_tokens": 1}},
            "workload.output.low_tokens=1",
        ),
        (
            {
                **POISSON,
                "prompt": {"kind": "uniform", "low_tokens": 1, "high_tokens": 9, "max_tokens": 4},
                "output": FIXED,
            },
            "workload.prompt.max_tokens=4",
        ),
        (
            {
                **POISSON,
                "prompt": {"kind": "lognormal", "median_tokens": 9, "tokens": 4},
                "output": FIXED,
            },
            "workload.prompt.tokens=4",
        ),
    ],
)
def test_a_key_that_would_not_act_is_refused_naming_it(
    workload: dict[str, Any], named: str
) -> None:
    with pytest.raises(ValidationError) as caught:
        ScenarioConfig.model_validate({**BASE, "workload": workload})
    said = one_line(caught.value)
    assert named in said
    assert "does not apply" in said or "not both" in said


def test_sim_run_refuses_it_before_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def started(*_: object, **__: object) -> None:
        raise AssertionError("the run started")

    monkeypatch.setattr(runner, "run_scenario", started)
    cfg = tmp_path / "s.yaml"
    cfg.write_text(yaml.safe_dump({**BASE, "workload": {**POISSON, "preset": "sharegpt", "cv": 2}}))
    res = CliRunner().invoke(sim, ["run", str(cfg)])
    assert res.exit_code == 2, res.output
    assert "workload.cv=2: cv does not apply to poisson arrivals" in res.output
    assert "Traceback" not in res.output


@pytest.mark.parametrize(
    "workload",
    [
        {**POISSON, "preset": "sharegpt", "seed": 3},
        {**POISSON, "arrival": "gamma", "cv": 2, "preset": "humaneval"},
        {**POISSON, "preset": None, "prompt": FIXED, "output": FIXED},
        {
            **POISSON,
            "prompt": {"kind": "lognormal", "median_tokens": 50, "sigma": 0.5, "max_tokens": 90},
            "output": {"kind": "uniform", "low_tokens": 2, "high_tokens": 9},
        },
        {**TRACE_ONLY, "rate_per_s": 3, "slo_class": "default"},
        {"arrival": "trace", "trace": {"path": "t.csv", "time_scale": 0.5, "max_requests": 2}},
    ],
)
def test_keys_that_act_load_and_the_dump_loads_again(
    tmp_path: Path, workload: dict[str, Any]
) -> None:
    cfg = ScenarioConfig.model_validate({**BASE, "workload": workload})
    again = ScenarioConfig.model_validate(
        yaml.safe_load(yaml.safe_dump(cfg.model_dump(mode="json")))
    )
    (tmp_path / "t.csv").write_text(UNSORTED)
    lines = (tmp_path / "t.csv").read_text().splitlines() if cfg.workload.trace else None
    assert build_workload(again.workload, lines) == build_workload(cfg.workload, lines)


def test_the_dump_leaves_out_the_keys_that_do_not_act() -> None:
    cfg = ScenarioConfig.model_validate({**BASE, "workload": {**TRACE_ONLY, "rate_per_s": 3}})
    work = cfg.model_dump(mode="json")["workload"]
    assert set(work) == {"arrival", "rate_per_s", "trace", "slo_class"}
    assert "time_scale" not in work["trace"]
    fixed = WorkloadConfig.model_validate({**POISSON, "prompt": FIXED, "output": FIXED})
    assert fixed.model_dump()["prompt"] == FIXED


def test_a_trace_replays_every_row_by_default() -> None:
    # was `trace.max_requests or num_requests`: cut to num_requests' default 500
    lines = _long_trace(700)
    w = WorkloadConfig.model_validate(TRACE_ONLY)
    assert len(build_workload(w, lines)) == 700
    capped = WorkloadConfig.model_validate(
        {"arrival": "trace", "trace": {"path": "t.csv", "max_requests": 600}}
    )
    assert len(build_workload(capped, lines)) == 600


def test_an_unsorted_trace_counts_from_its_earliest_row() -> None:
    # was `arrival_s must be >= 0, got -1.0`: times were measured from the first row
    items = parse_azure_trace(UNSORTED.splitlines())
    assert [(w.arrival_s, w.num_prompt_tokens) for w in items] == [
        (0.0, 200),
        (1.0, 300),
        (2.0, 400),
    ]
    half = parse_azure_trace(UNSORTED.splitlines(), time_scale=0.5)
    assert [w.arrival_s for w in half] == [0.0, 0.5, 1.0]


def test_sim_run_replays_an_unsorted_trace(tmp_path: Path) -> None:
    (tmp_path / "t.csv").write_text(UNSORTED)
    cfg = tmp_path / "s.yaml"
    cfg.write_text(yaml.safe_dump({**BASE, "workload": TRACE_ONLY}))
    res = CliRunner().invoke(sim, ["run", str(cfg)])
    assert res.exit_code == 0, res.output
    assert re.search(r"^\| 3 \| 3 \|", res.output, re.MULTILINE), res.output


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (HEADER + "yesterday,1,2\n", "line 2: TIMESTAMP 'yesterday' is not a time"),
        (HEADER + "2023-11-16 18:15:48.0,0,5\n", "no request in the trace"),  # ran empty, exit 0
    ],
)
def test_sim_run_names_a_trace_it_cannot_replay(tmp_path: Path, text: str, says: str) -> None:
    (tmp_path / "t.csv").write_text(text)
    cfg = tmp_path / "s.yaml"
    cfg.write_text(yaml.safe_dump({**BASE, "workload": TRACE_ONLY}))
    res = CliRunner().invoke(sim, ["run", str(cfg)])
    assert res.exit_code == 2, res.output
    assert "workload.trace.path 't.csv'" in res.output
    assert says in res.output
    with pytest.raises(ConfigError, match=r"workload\.trace\.path"):
        build_workload(WorkloadConfig.model_validate(TRACE_ONLY), text.splitlines())


@pytest.mark.parametrize("doc", ["simulator.md", "profiling.md"])
def test_the_documented_scenarios_load(doc: str) -> None:
    blocks = re.findall(r"```yaml\n(.*?)```", (DOCS / doc).read_text(), re.DOTALL)
    scenarios = [b for b in blocks if "\nworkload:" in b]
    assert scenarios
    for block in scenarios:
        ScenarioConfig.model_validate(yaml.safe_load(block))
