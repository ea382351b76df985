"""The margin ablation (`sim.autoscale_ablation`, `sim autoscale --ablation`): each variant
changes what it says, every row is held against the same yardstick, oscillations are counted
over the evaluated policy's window. Short synthetic workloads."""

from __future__ import annotations

import math
from dataclasses import fields

import numpy as np
import pytest
from click.testing import CliRunner

from splitserve.cli.sim import sim
from splitserve.core.roles import Role
from splitserve.sim import autoscale_ablation as ab
from splitserve.sim.autoscale import RunResult, Setup, Tick, step_workload
from splitserve.sim.autoscale_eval import Scenario

PAIRS = [(1500, 200), (3000, 150), (800, 100)]


def _changed(a: Setup, b: Setup) -> set[str]:
    out = {
        f.name
        for f in fields(Setup)
        if f.name != "params" and getattr(a, f.name) != getattr(b, f.name)
    }
    return out | {
        f.name for f in fields(a.params) if getattr(a.params, f.name) != getattr(b.params, f.name)
    }


@pytest.mark.parametrize(
    ("name", "changed"),
    [
        ("evaluated", set()),
        ("no burst", {"burst_weight"}),
        ("half burst", {"burst_weight"}),
        ("no tail sizing", {"ttft_tail_fraction"}),
        ("no band", {"scale_down_utilization"}),
        ("half band", {"scale_down_utilization"}),
        ("no feedback", {"min_samples", "queue_per_worker"}),
        ("no settle", {"feedback_settle"}),
        ("half stabilization", {"scale_down_stabilization_s"}),
        ("no backoff", {"reversal_backoff"}),
        ("no trend", {"forecast_beta"}),
        ("no occupancy floor", {"occupancy_floor"}),
        ("min 0", {"min_replicas"}),
        (
            "lean",
            {
                "burst_weight",
                "ttft_tail_fraction",
                "scale_down_utilization",
                "min_samples",
                "queue_per_worker",
            },
        ),
        ("full burst", {"burst_poisson"}),
        ("noise band", {"band_z"}),
    ],
)
def test_each_variant_changes_one_margin(name: str, changed: set[str]) -> None:
    base = Setup()
    assert _changed(base, ab.variant(name).apply(base)) == changed


def test_the_margins_values() -> None:
    base = Setup()
    p = base.params
    assert ab.variant("half burst").apply(base).params.burst_weight == p.burst_weight / 2
    half = ab.variant("half band").apply(base).params
    assert p.target_utilization - half.scale_down_utilization == pytest.approx(
        (p.target_utilization - p.scale_down_utilization) / 2
    )
    assert ab.variant("no band").apply(base).params.scale_down_utilization == (p.target_utilization)
    assert math.isinf(ab.variant("no feedback").apply(base).params.queue_per_worker)
    with pytest.raises(ValueError, match="unknown variant 'nope'"):
        ab.variant("nope")


def test_oscillations_use_the_given_window_not_the_variants() -> None:
    sizes = [1, 2, 2, 1, 1, 1, 1, 1, 2]  # up, down 2 ticks later, up 5 ticks after that
    ticks = tuple(
        Tick(10.0 * i, 1.0, {Role.PREFILL: n, Role.DECODE: 1}, None) for i, n in enumerate(sizes)
    )
    r = RunResult("x", (), 0.0, 0, 0, 0, ticks)
    assert ab.oscillations(r, 120.0, 10.0) == 2
    assert ab.oscillations(r, 40.0, 10.0) == 1
    assert ab.oscillations(r, 20.0, 10.0) == 0


def test_ablate_holds_every_variant_against_one_yardstick() -> None:
    items = step_workload(PAIRS, 1.0, 4.0, 60.0, 90.0, 90.0, np.random.default_rng(4))
    scenario = Scenario("tiny-step", items, 60.0)
    setup = Setup(startup_s=10.0)
    runs = [ab.variant("evaluated"), ab.variant("no settle"), ab.variant("no burst")]
    yard, rows = ab.ablate(scenario, setup, runs)
    assert yard is not None
    assert [r.variant.name for r in rows] == ["evaluated", "no settle", "no burst"]
    assert {r.yardstick_gpu_hours for r in rows} == {yard.result.gpu_hours}
    for r in rows:
        assert r.ratio == pytest.approx(r.result.gpu_hours / yard.result.gpu_hours)
    text = ab.markdown([(yard, rows)])
    assert "**tiny-step** (static-planned " in text
    assert text.count("| no settle | feedback_settle off |") == 1
    # no yardstick: no ratio
    _, bare = ab.ablate(scenario, setup, runs[:1], planned=False)
    assert bare[0].ratio is None
    assert "| - |" in ab.markdown([(None, bare)])


def test_cli_refuses_what_the_ablation_does_not_use() -> None:
    runner = CliRunner()
    for args in (
        ["autoscale", "--variant", "no burst"],
        ["autoscale", "--ablation", "--shortfall"],
        ["autoscale", "--ablation", "--no-search"],
        ["autoscale", "--ablation", "--burst-weight", "0.5"],
    ):
        r = runner.invoke(sim, args)
        assert r.exit_code == 2, args
    bad = runner.invoke(sim, ["autoscale", "--ablation", "--variant", "nope"])
    assert bad.exit_code == 2
    assert "unknown variant 'nope'" in bad.output
