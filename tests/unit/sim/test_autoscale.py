"""The control loop in the simulator (sim.autoscale, sim.autoscale_eval): short workloads."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from splitserve.cli.sim import bundled_trace, sim
from splitserve.core.roles import Role
from splitserve.policy.planner.autoscaler import AutoscalerParams
from splitserve.sim import autoscale_eval
from splitserve.sim.autoscale import (
    Setup,
    peak_rate,
    reversals,
    run_autoscaled,
    run_static,
    step_workload,
)
from splitserve.sim.workload import WorkItem

PAIRS = [(1500, 200), (3000, 150), (800, 100)]
SETUP = Setup(
    params=AutoscalerParams(interval_s=10.0, scale_down_stabilization_s=60.0, horizon_s=20.0),
    startup_s=10.0,
)


def lines(kind: str) -> Iterable[str]:
    return bundled_trace(kind).read_text().splitlines()


def test_step_scales_up_within_two_ticks_and_back_down_without_oscillating() -> None:
    items = step_workload(PAIRS, 1.5, 5.0, 60.0, 120.0, 200.0, np.random.default_rng(1))
    r = run_autoscaled(items, SETUP, step_at_s=60.0)
    assert r.reaction_s is not None
    assert r.reaction_s <= 2 * SETUP.params.interval_s
    assert r.oscillations == 0
    counts = [sum(t.workers.values()) for t in r.ticks]
    assert max(counts) > counts[0]
    assert counts[-1] < max(counts)  # scaled back after the step
    for t in r.ticks:
        assert all(SETUP.min_replicas <= n <= SETUP.max_replicas for n in t.workers.values())
    static = run_static(items, SETUP, r.peak_workers)
    assert r.gpu_hours < static.gpu_hours


def test_peak_rate_is_the_busiest_sub_window() -> None:
    # 30 s window at t=100 in 10 s sub-windows: (70, 80] 1, (80, 90] 0, (90, 100] 5 arrivals.
    arrivals = [75.0, 91.0, 92.0, 95.0, 99.0, 100.0]
    assert peak_rate(arrivals, 100.0, 30.0, 10.0) == 0.5
    assert peak_rate([], 100.0, 30.0, 10.0) == 0.0
    # A span shorter than one sub-window is one sub-window.
    assert peak_rate([99.0], 100.0, 5.0, 10.0) == 0.1


def test_burst_headroom_reacts_to_a_step_on_the_first_tick() -> None:
    """With `burst_weight` 1 the first tick after a step sizes for the busiest 10 s (the step's
    full rate) rather than the 30 s mean that holds a third of it."""
    items = step_workload(PAIRS, 1.0, 5.0, 60.0, 120.0, 200.0, np.random.default_rng(2))
    reacts = {}
    for w in (0.0, 1.0):
        params = AutoscalerParams(
            interval_s=10.0, scale_down_stabilization_s=60.0, horizon_s=20.0, burst_weight=w
        )
        setup = Setup(params=params, startup_s=10.0, flipping=False)
        r = run_autoscaled(items, setup, step_at_s=60.0)
        assert r.oscillations == 0
        reacts[w] = r.reaction_s
    assert reacts[1.0] is not None
    assert reacts[1.0] <= 10.0
    assert reacts[0.0] is None or reacts[0.0] >= reacts[1.0]


def test_reversals_counts_direction_changes_within_a_window() -> None:
    assert reversals([1, 2, 3, 2, 2, 2], window_ticks=3) == 1
    assert reversals([1, 2, 2, 2, 2, 1], window_ticks=3) == 0
    assert reversals([3, 2, 3], window_ticks=5) == 1


def test_eval_report_has_every_column_and_a_png() -> None:
    scenario = autoscale_eval.build_scenario("step-5x", lines, quick=True)
    short = autoscale_eval.Scenario(scenario.name, scenario.items[:300], 120.0, scenario.note)
    heard: list[str] = []
    e = autoscale_eval.evaluate(short, SETUP, search=False, progress=heard.append)
    # Each run is announced as it starts (a full-length evaluation prints its report minutes
    # later; `sim autoscale` writes these to stderr meanwhile).
    assert [h.split(": ")[1].split(" ")[0] for h in heard] == [
        "the",
        "static-peak",
        "static-planned",
        "oracle",
    ]
    assert heard[0] == "step-5x: the loop (300 requests)"
    md = autoscale_eval.markdown([e], SETUP)
    assert "| step-5x | autoscaled |" in md
    assert "| step-5x | static-peak |" in md
    png = autoscale_eval.plot_png(e)
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert e.static_peak.peak_workers == e.autoscaled.peak_workers
    assert set(e.autoscaled.peak_workers) == {Role.PREFILL, Role.DECODE}


def test_cli_reports_each_run_as_it_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    def fake_run(names: object, lines: object, **kw: Any) -> autoscale_eval.Report:
        kw["progress"]("step-5x: the loop (10 requests)")
        return autoscale_eval.Report("| the report |")

    monkeypatch.setattr(autoscale_eval, "run", fake_run)
    result = CliRunner().invoke(sim, ["autoscale", "--scenario", "step-5x", "--no-search"])
    assert result.exit_code == 0, result.output
    assert "s] step-5x: the loop (10 requests)" in result.stderr
    assert "the loop" not in result.stdout
    assert "| the report |" in result.stdout


def test_cli_rejects_unknown_scenario() -> None:
    result = CliRunner().invoke(sim, ["autoscale", "--scenario", "nope"])
    assert result.exit_code != 0
    assert "nope" in result.output


@pytest.mark.parametrize(("flag", "value"), [("--scenario", "step-5x"), ("--variant", "no burst")])
def test_cli_refuses_a_repeated_name(
    flag: str, value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--scenario step-5x --scenario step-5x` ran and printed the scenario twice."""

    def no_run(*_: object, **__: object) -> autoscale_eval.Report:
        raise AssertionError("the evaluation ran")

    monkeypatch.setattr(autoscale_eval, "run", no_run)
    monkeypatch.setattr(autoscale_eval, "run_ablation", no_run, raising=False)
    argv = ["autoscale", "--ablation", flag, value, flag, value]
    result = CliRunner().invoke(sim, argv)
    assert result.exit_code == 2, result.output
    assert flag in result.output
    assert "twice" in result.output


def test_cli_burst_weight_acts_and_shortfall_refuses_it() -> None:
    out = CliRunner().invoke(
        sim,
        ["autoscale", "--scenario", "step-5x", "--quick", "--no-search", "--burst-weight", "0"],
    )
    assert out.exit_code == 0, out.output
    assert "burst weight 0," in out.output
    assert "after warm-up" in out.output
    refused = CliRunner().invoke(
        sim, ["autoscale", "--quick", "--shortfall", "--burst-weight", "0.5"]
    )
    assert refused.exit_code != 0
    assert "--burst-weight" in refused.output


def test_cli_admission_flags_act_and_are_refused_where_they_cannot() -> None:
    base = ["autoscale", "--scenario", "step-5x", "--quick", "--no-search"]
    gate = CliRunner().invoke(sim, base)
    assert gate.exit_code == 0, gate.output
    assert "no class sheddable: queued requests wait however late" in gate.output
    off = CliRunner().invoke(sim, [*base, "--no-admission"])
    assert off.exit_code == 0, off.output
    assert "no admission gate (every request placed at arrival)" in off.output
    shed = CliRunner().invoke(sim, [*base, "--sheddable"])
    assert shed.exit_code == 0, shed.output
    assert "class `chat` sheddable" in shed.output
    for bad in (
        ["--sheddable", "--no-admission"],
        ["--no-admission", "--shortfall"],
        ["--sheddable", "--ablation"],
    ):
        refused = CliRunner().invoke(sim, [*base, *bad])
        assert refused.exit_code != 0, bad
        assert "--no-admission" in refused.output or "--sheddable" in refused.output


def test_warm_attainment_counts_only_requests_after_the_warm_up() -> None:
    items = step_workload(PAIRS, 1.0, 1.0, 100.0, 0.0, 0.0, np.random.default_rng(3))
    early = [w for w in items if w.arrival_s < 40.0]
    r = run_static(items, replace(SETUP, warmup_s=40.0), {Role.PREFILL: 2, Role.DECODE: 2})
    assert r.warm_attainment is not None
    assert early  # the warm-up excludes some requests
    none_after = run_static(early, replace(SETUP, warmup_s=1e9), {Role.PREFILL: 1, Role.DECODE: 1})
    assert none_after.warm_attainment is None


def test_before_the_first_finish_the_loop_sees_no_output_length_and_acts_on_the_queue() -> None:
    """The simulated loop sees what the live one sees: an output length only once a request
    finished (the router counts it at the finish). Before, the simulator gave the loop the true
    output lengths of requests still in flight, so the state the live loop is in before the
    first finish ("no request finished yet") was never simulated. A burst of long requests at
    the start: nothing finishes by the first tick, the router's queue is long, and the loop
    scales prefill on it and says so."""
    items = tuple(WorkItem(0.1 * i, 4000, 800) for i in range(30))
    r = run_autoscaled(items, SETUP)
    first = r.ticks[0]
    assert first.attainment is None  # nothing finished in the first window
    assert any(
        a.startswith("prefill 1 -> ") and "no request finished yet" in a for a in first.actions
    ), first.actions
    # No output length: decode is sized by what its workers hold, not by a guessed length.
    decode = [a for a in first.actions if a.startswith("decode ")]
    assert all("decode workers hold" in a for a in decode), decode


def test_quick_help_gives_minutes_not_seconds() -> None:
    # said "seconds, for checks": --quick --out takes about 93 s on 2 cores, step-5x-fleet 415 s
    text = " ".join(CliRunner().invoke(sim, ["autoscale", "--help"]).output.split())
    assert "seconds, for checks" not in text
    assert "about 1.5 min for the four scenarios" in text
