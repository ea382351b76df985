"""The `static-planned` yardstick: size for the busiest window with the planner's steady-state
model, check by simulation, grow until it meets (sim.autoscale_eval.planned_static)."""

from __future__ import annotations

import itertools
import math

import pytest

from splitserve.core.roles import Role
from splitserve.policy.planner.aladdin import LengthStats
from splitserve.policy.planner.autoscaler import Targets, work_by_role
from splitserve.sim import autoscale_eval
from splitserve.sim.autoscale import ROLES, Setup, run_static, with_class
from splitserve.sim.autoscale_eval import (
    PeakWindow,
    busiest_window,
    planned_pools,
    planned_static,
)
from splitserve.sim.workload import WorkItem

SETUP = Setup()
SCEN = autoscale_eval.Scenario("synthetic", ())


def test_busiest_window_finds_the_densest_stretch_and_its_mix() -> None:
    calm = [WorkItem(float(t), 1000, 100) for t in range(0, 300, 2)]  # 0.5 req/s
    busy = [WorkItem(400 + t / 4, 3000 if t % 2 else 1000, 20) for t in range(240)]  # 4 req/s
    items = calm + busy
    peak = busiest_window(items, 60.0)
    assert peak.start_s == pytest.approx(400.0)
    assert peak.requests == 240
    assert peak.rate_per_s == pytest.approx(4.0)
    assert peak.mean_prompt_tokens == pytest.approx(2000.0)
    assert peak.mean_output_tokens == pytest.approx(20.0)
    assert peak.prompt_cv2 == pytest.approx(0.25)  # ±1000 around 2000
    # the window length matters: over 10 minutes the calm part dilutes it
    assert busiest_window(items, 600.0).rate_per_s < peak.rate_per_s


def test_busiest_window_refuses_nothing_to_size() -> None:
    with pytest.raises(ValueError, match="no requests"):
        busiest_window([], 60.0)
    with pytest.raises(ValueError, match="window_s"):
        busiest_window([WorkItem(0.0, 10, 10)], 0.0)


def peak(rate: float, prompt: float = 1500.0, output: float = 200.0) -> PeakWindow:
    return PeakWindow(0.0, 60.0, round(rate * 60), prompt, output, 1.0)


def test_planned_pools_are_the_autoscalers_own_sizing_rounded_up() -> None:
    p = peak(6.0)
    c = SETUP.classes[0]
    work = work_by_role(
        ROLES,
        p.rate_per_s,
        LengthStats(p.mean_prompt_tokens, p.mean_output_tokens),
        SETUP.perf_model(),
        Targets(c.ttft_s, c.tpot_s, max(c.percentile, c.attainment)),
        SETUP.params,
        p.prompt_cv2,
    )
    want = {
        r: max(1, math.ceil(w / SETUP.params.target_utilization - 1e-9)) for r, w in work.items()
    }
    assert planned_pools(p, SETUP) == want
    assert want[Role.PREFILL] >= 2  # a real load, not the floor


def test_planned_pools_grow_with_the_rate_and_the_prompts() -> None:
    sizes = [planned_pools(peak(r), SETUP) for r in (0.5, 2.0, 8.0, 32.0)]
    for a, b in itertools.pairwise(sizes):
        assert all(b[r] >= a[r] for r in ROLES)
    assert sizes[-1][Role.PREFILL] > sizes[0][Role.PREFILL]
    longer = planned_pools(peak(8.0, prompt=4000.0), SETUP)
    assert longer[Role.PREFILL] > sizes[2][Role.PREFILL]


def test_sized_pools_that_meet_are_kept_as_they_are() -> None:
    items = with_class([WorkItem(t * 0.5, 1000, 50) for t in range(240)], "chat")  # 2 req/s
    pl = planned_static(items, SETUP, 0.99)
    assert pl.grown == ()
    assert dict(pl.result.peak_workers) == dict(pl.sized)
    assert pl.result.attainment >= 0.99
    assert pl.result.classes[0].requests == 240
    assert pl.result.label == "static-planned"


def test_a_surge_the_busiest_minute_averages_out_is_grown_until_it_meets() -> None:
    # 1 req/s, plus 40 long prompts in 4 s: the busiest minute averages the burst out, so its
    # sizing misses; the yardstick grows (first prefill: TTFT misses) until it meets.
    items = [WorkItem(float(t), 1000, 50) for t in range(120)]
    items += [WorkItem(60.0 + i * 0.1, 3000, 200) for i in range(40)]
    items = list(with_class(sorted(items, key=lambda w: w.arrival_s), "chat"))
    pl = planned_static(items, SETUP, 0.99)
    sized = run_static(items, SETUP, pl.sized)
    assert sized.attainment < 0.99
    assert pl.grown
    assert pl.grown[0].endswith("+1 prefill")
    assert pl.result.attainment >= 0.99
    assert pl.met
    for role in ROLES:
        added = sum(1 for g in pl.grown if g.endswith(f"+1 {role.value}"))
        assert pl.result.peak_workers[role] == pl.sized[role] + added


def test_report_shows_all_three_yardsticks() -> None:
    from tests.unit.sim.test_autoscale import SETUP as LOOP_SETUP
    from tests.unit.sim.test_autoscale import lines

    scenario = autoscale_eval.build_scenario("step-5x", lines, quick=True)
    short = autoscale_eval.Scenario(scenario.name, scenario.items[:300], 120.0, scenario.note)
    e = autoscale_eval.evaluate(short, LOOP_SETUP, search=False)
    assert e.static_planned is not None
    assert e.gpu_ratio_planned == pytest.approx(
        e.autoscaled.gpu_hours / e.static_planned.result.gpu_hours
    )
    md = autoscale_eval.markdown([e], LOOP_SETUP)
    assert "| vs static-planned | vs static-peak | vs static-best |" in md
    assert "| step-5x | static-planned |" in md
    assert "static-planned: busiest 60 s from" in md


def test_growth_stops_when_no_worker_helps_and_says_so() -> None:
    # 40 long prompts with 2-token outputs over 20 s: their TPOT is the KV pull before token 2
    # (0.13 s for 4,000 tokens over one link, above the 0.1 s target), which no worker of either
    # pool shortens. (With 10-token outputs, as before, it was the pulls queueing on one decode
    # worker's link because every decode share went to the same worker; decode reservations
    # spread them, and one more decode worker then met the target.)
    items = [WorkItem(float(t), 1000, 50) for t in range(120)]
    items += [WorkItem(60.0 + i * 0.5, 4000, 2) for i in range(40)]
    items = list(with_class(sorted(items, key=lambda w: w.arrival_s), "chat"))
    pl = planned_static(items, SETUP, 0.99)
    assert not pl.met
    assert pl.result.attainment < 0.99
    assert sum(pl.result.peak_workers.values()) < 2 * SETUP.max_replicas  # stopped, not capped
    more = {r: n + 2 for r, n in pl.result.peak_workers.items()}
    assert run_static(items, SETUP, more).attainment <= pl.result.attainment
    assert "growth stopped below the target" in autoscale_eval.markdown(
        [autoscale_eval.Evaluation(SCEN, pl.result, pl.result, None, pl)], SETUP
    )
