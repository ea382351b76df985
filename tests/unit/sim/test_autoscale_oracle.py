"""The oracle: a clairvoyant whole-worker schedule sized per interval with the static sizing
model, cold starts paid, no stabilization (sim.autoscale_eval.oracle), and its replay
(sim.autoscale.run_scheduled)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import numpy as np
import pytest
from click.testing import CliRunner

from splitserve.cli.sim import sim
from splitserve.core.roles import Role
from splitserve.sim import autoscale_eval
from splitserve.sim.autoscale import (
    ROLES,
    RunResult,
    Setup,
    run_scheduled,
    run_static,
    step_workload,
    with_class,
)
from splitserve.sim.autoscale_eval import (
    PeakWindow,
    Planned,
    interval_windows,
    oracle,
    oracle_gpu_seconds,
    oracle_schedule,
    planned_pools,
)
from splitserve.sim.workload import WorkItem

P, D = Role.PREFILL, Role.DECODE
SETUP = Setup()


def pools(p: int, d: int) -> dict[Role, int]:
    return {P: p, D: d}


def test_gpu_seconds_hand_computed() -> None:
    schedule = [pools(1, 1), pools(2, 3), pools(1, 1)]
    # 2 x 60 + 5 x 60 + 2 x 30 (the last interval ends at 150 s) = 480 worker-seconds;
    # the second interval adds 1 prefill + 2 decode, each paid 20 s early.
    assert oracle_gpu_seconds(schedule, 60.0, 150.0, 20.0) == (540.0, 60.0)
    # two GPUs per prefill worker: 3x60 + 7x60 + 3x30 = 690, cold (2 + 2) x 20 = 80
    assert oracle_gpu_seconds(schedule, 60.0, 150.0, 20.0, {P: 2, D: 1}) == (770.0, 80.0)
    # removing workers is free, re-adding pays again: 4x10 + 2x10 + 4x10 + 2 x 5
    assert oracle_gpu_seconds([pools(2, 2), pools(1, 1), pools(2, 2)], 10.0, 30.0, 5.0) == (
        110.0,
        10.0,
    )
    assert oracle_gpu_seconds([], 60.0, 100.0, 20.0) == (0.0, 0.0)


def test_the_step_scenarios_arithmetic_bound_is_two_thirds_of_static() -> None:
    # step-5x at its size: P1:D1 for 5 + 15 minutes, P2:D2 for 10, against static P2:D2 for 30
    schedule = [pools(1, 1)] * 5 + [pools(2, 2)] * 10 + [pools(1, 1)] * 15
    total, cold = oracle_gpu_seconds(schedule, 60.0, 1800.0, 0.0)
    assert total / (4 * 1800.0) == pytest.approx(2 / 3)
    with_cold, cold = oracle_gpu_seconds(schedule, 60.0, 1800.0, 20.0)
    assert cold == 40.0
    assert with_cold / (4 * 1800.0) > 0.6


def test_interval_windows_bucket_arrivals_and_rate_over_the_interval() -> None:
    items = [WorkItem(1.0, 100, 10), WorkItem(59.0, 300, 30), WorkItem(130.0, 200, 20)]
    ws = interval_windows(items, 60.0, 131.0)
    assert [w.requests for w in ws] == [2, 0, 1]
    assert [w.start_s for w in ws] == [0.0, 60.0, 120.0]
    assert ws[0].rate_per_s == pytest.approx(2 / 60)
    assert ws[0].mean_prompt_tokens == pytest.approx(200.0)
    assert ws[0].mean_output_tokens == pytest.approx(20.0)
    assert ws[0].prompt_cv2 == pytest.approx(0.25)
    # a last interval of 11 s still reads its one request per minute, not per 11 s
    assert ws[2].rate_per_s == pytest.approx(1 / 60)
    assert ws[1].rate_per_s == 0.0
    with pytest.raises(ValueError, match="interval_s"):
        interval_windows(items, 0.0, 10.0)


def _busy_then_calm() -> list[WorkItem]:
    busy = [WorkItem(i / 12, 1500, 200) for i in range(12 * 60)]  # 12 req/s for a minute
    calm = [WorkItem(60.0 + i, 1500, 200) for i in range(120)]  # then 1 req/s
    return list(with_class(busy + calm, "chat"))


def _calm_busy_calm() -> list[WorkItem]:
    calm = [WorkItem(float(i), 1500, 200) for i in range(60)]
    busy = [WorkItem(60.0 + i / 12, 1500, 200) for i in range(12 * 60)]
    after = [WorkItem(120.0 + i, 1500, 200) for i in range(60)]
    return list(with_class(calm + busy + after, "chat"))


def test_schedule_sizes_each_interval_and_scales_by_the_checks_growth() -> None:
    items = _busy_then_calm()
    schedule, scale = oracle_schedule(items, SETUP, 180.0, None, 60.0)
    busy = planned_pools(PeakWindow(0.0, 60.0, 720, 1500.0, 200.0, 0.0), SETUP)
    assert schedule[0] == busy
    assert busy[P] >= 3  # a real load
    assert schedule[1] == schedule[2] == pools(1, 1)
    assert scale == {P: 1.0, D: 1.0}
    # static-planned's check grew prefill by half over the biggest sizing: every interval's
    # prefill is scaled by 1.5 and rounded up; decode was not grown
    grown = {P: busy[P] + busy[P] // 2, D: busy[D]}
    result = RunResult("static-planned", (), 1.0, 0, 0, 0, peak_workers=grown)
    planned = Planned(PeakWindow(0.0, 60.0, 720, 1500.0, 200.0, 0.0), busy, result)
    schedule, scale = oracle_schedule(items, SETUP, 180.0, planned, 60.0)
    assert scale[P] == pytest.approx(grown[P] / busy[P])
    assert scale[D] == 1.0
    assert schedule[0] == grown
    assert schedule[1] == pools(2, 1)  # ceil(1 x 1.5)


def test_scheduled_run_on_a_constant_schedule_is_the_static_run() -> None:
    pairs = [(1500, 200), (3000, 150), (800, 100)]
    items = step_workload(pairs, 2.0, 1.0, 120.0, 0.0, 0.0, np.random.default_rng(3))
    static = run_static(items, SETUP, pools(2, 2))
    sched = run_scheduled(items, SETUP, [pools(2, 2)] * 3, 60.0)
    assert sched.attainment == static.attainment
    # the same workers for the same span, up to the 1 s checks
    assert sched.gpu_hours * 3600 == pytest.approx(static.gpu_hours * 3600, abs=4 * 1.0)
    with pytest.raises(ValueError, match="empty"):
        run_scheduled(items, SETUP, [], 60.0)


def test_scheduled_run_starts_workers_a_cold_start_early_and_drains_the_removed() -> None:
    items = _calm_busy_calm()
    peak = planned_pools(PeakWindow(0.0, 60.0, 720, 1500.0, 200.0, 0.0), SETUP)
    schedule = [pools(1, 1), peak, pools(1, 1)]
    r = run_scheduled(items, SETUP, schedule, 60.0)
    assert r.peak_workers == peak
    added = peak[P] - 1 + peak[D] - 1
    lower, cold = oracle_gpu_seconds(schedule, 60.0, items[-1].arrival_s, SETUP.startup_s)
    assert cold == added * SETUP.startup_s
    # the replay pays at least the analytic schedule (drains and the last requests' tail on top)
    assert r.gpu_hours * 3600 >= lower - 2.0
    # and less than holding the peak throughout
    static = run_static(items, SETUP, peak)
    assert r.gpu_hours < static.gpu_hours
    # the added workers serve from 60 s (started 20 s early): the burst is served as well as
    # by the static peak pools, give or take the calm minutes' single workers
    assert r.attainment >= static.attainment - 0.02
    late = run_scheduled(items, replace(SETUP, startup_s=60.0), schedule, 60.0)
    assert late.gpu_hours > r.gpu_hours  # each added worker paid 40 s more


def test_oracle_reports_its_ratio_and_simulated_attainment() -> None:
    items = _calm_busy_calm()
    o = oracle(items, SETUP, None, 60.0, simulate=True)
    assert o.simulated is not None
    assert 0.9 <= o.simulated.attainment <= 1.0
    assert len(o.schedule) == 3
    assert o.schedule[0] == o.schedule[2] == pools(1, 1)
    added = sum(o.schedule[1].values()) - 2
    assert o.cold_start_gpu_hours == pytest.approx(added * SETUP.startup_s / 3600)
    static_h = sum(o.schedule[1].values()) * o.end_s / 3600
    assert o.gpu_hours < static_h  # calm minutes are worth shrinking for


def _fake_eval(o: autoscale_eval.Oracle) -> autoscale_eval.Evaluation:
    def run(label: str, h: float, ps: Mapping[Role, int]) -> RunResult:
        return RunResult(label, (), h, 0, 0, 0, peak_workers=dict(ps))

    planned = Planned(
        PeakWindow(0.0, 60.0, 60, 1000.0, 100.0, 0.0),
        pools(2, 2),
        run("static-planned", 2.0, pools(2, 2)),
    )
    scen = autoscale_eval.Scenario("step-5x", ())
    return autoscale_eval.Evaluation(
        scen,
        run("autoscaled", 1.5, pools(2, 2)),
        run("static-peak", 2.0, pools(2, 2)),
        None,
        planned,
        o,
    )


def test_report_has_the_oracle_row_and_ratios() -> None:
    o = autoscale_eval.Oracle(60.0, (pools(1, 1), pools(2, 2)), {P: 1.0, D: 1.0}, 120.0, 1.2, 0.01)
    e = _fake_eval(o)
    assert e.oracle_ratio_planned == pytest.approx(0.6)
    assert e.gpu_ratio_oracle == pytest.approx(1.25)
    md = autoscale_eval.markdown([e], SETUP)
    assert "| vs static-best | vs oracle |" in md
    assert "| step-5x | oracle | P1-2:D1-2 | - | - | - | 1.20 | 0.60x |" in md  # no replay: no shed
    assert "| step-5x | 2.00 | 1.20 (0.01 cold starts) | 0.60x | 1.50 | 0.75x | 1.25x | - |" in md


def test_fleet_step_is_the_step_at_ten_times_the_rate() -> None:
    from tests.unit.sim.test_autoscale import lines

    small = autoscale_eval.build_scenario("step-5x", lines, quick=True)
    fleet = autoscale_eval.build_scenario("step-5x-fleet", lines, quick=True)
    assert fleet.step_at_s == small.step_at_s == 120.0
    before = sum(1 for w in fleet.items if w.arrival_s < 120.0)
    during = sum(1 for w in fleet.items if 120.0 <= w.arrival_s < 360.0)
    assert before / 120.0 == pytest.approx(10.0, rel=0.15)
    assert during / 240.0 == pytest.approx(50.0, rel=0.1)
    low = planned_pools(PeakWindow(0.0, 60.0, 600, 1075.0, 211.0, 1.0), SETUP)
    assert low == pools(3, 3)  # the low phase needs several workers per role
    assert fleet.initial == low  # the loop starts as a service running at the low rate
    assert small.initial is None
    with pytest.raises(ValueError, match="step-5x-fleet"):
        autoscale_eval.build_scenario("nope", lines)


def test_cli_diagnostics_reach_the_setup_and_are_refused_where_they_cannot_act(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[Setup] = []

    def fake_run(names: object, lines: object, setup: Setup | None = None, **kw: object) -> object:
        assert setup is not None
        seen.append(setup)
        return autoscale_eval.Report("ok")

    monkeypatch.setattr(autoscale_eval, "run", fake_run)
    out = CliRunner().invoke(
        sim,
        ["autoscale", "--scenario", "step-5x-fleet", "--cold-start", "0", "--stabilization", "60"],
    )
    assert out.exit_code == 0, out.output
    assert seen[0].startup_s == 0.0
    assert seen[0].params.scale_down_stabilization_s == 60.0
    assert seen[0].params.burst_weight == Setup().params.burst_weight
    for flag in ("--shortfall", "--ablation"):
        refused = CliRunner().invoke(sim, ["autoscale", flag, "--cold-start", "5"])
        assert refused.exit_code != 0
        assert "--cold-start" in refused.output
    assert set(ROLES) == {P, D}


@pytest.mark.parametrize(
    ("flag", "value"), [("--cold-start", "1e300"), ("--stabilization", "1e300")]
)
def test_diagnostic_times_beyond_an_hour_or_a_day_are_refused(
    flag: str, value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--cold-start 1e300` ran the evaluation and printed an oracle of 8e299 GPU-h and a
    300-digit ratio; now a cold start over an hour, or a stabilization window over a day (the
    operator's bound), is refused naming the flag, before anything runs."""

    def fake_run(*args: object, **kw: object) -> object:
        raise AssertionError("the evaluation ran")

    monkeypatch.setattr(autoscale_eval, "run", fake_run)
    out = CliRunner().invoke(sim, ["autoscale", "--scenario", "step-5x", flag, value])
    assert out.exit_code == 2, out.output
    assert f"Invalid value for '{flag}'" in out.output
    assert "range" in out.output
