"""`reactive_shortfall`: the share of requests arriving while the need exceeds what a loop with a
given reaction lag could have started (an estimate of what is physically possible)."""

from __future__ import annotations

from splitserve.policy.planner.aladdin import AladdinPerfModel
from splitserve.sim.autoscale_eval import reactive_shortfall
from splitserve.sim.workload import WorkItem

PERF = AladdinPerfModel(k1=1e-3, c1=0.0)  # 1,000 prompt tokens: 1 s of prefill


def surge() -> list[WorkItem]:
    """1 req/s for 200 s, then 6 req/s for 30 s (need 1 -> 8 workers), then quiet."""
    items = [WorkItem(float(t), 1000, 10) for t in range(200)]
    items += [WorkItem(200 + i / 6, 1000, 10) for i in range(180)]
    return items


def test_no_lag_no_shortfall() -> None:
    assert reactive_shortfall(surge(), PERF, lag_s=0, hold_s=120) == 0.0


def test_a_surge_shorter_than_the_lag_is_mostly_at_risk() -> None:
    # floor 2: what the steady 1 req/s needs at 80 % (else the loop's own start-up counts too)
    share = reactive_shortfall(surge(), PERF, lag_s=30, hold_s=120, floor=2)
    surge_share = 180 / 380
    assert 0.9 * surge_share <= share <= surge_share


def test_longer_lag_never_helps_and_a_peak_floor_removes_the_risk() -> None:
    items = surge()
    shares = [reactive_shortfall(items, PERF, lag_s=lag, hold_s=120) for lag in (0, 5, 10, 30)]
    assert shares == sorted(shares)
    assert reactive_shortfall(items, PERF, lag_s=30, hold_s=120, floor=8) == 0.0


def test_cli_prints_the_table_without_simulating() -> None:
    from click.testing import CliRunner

    from splitserve.cli.sim import sim

    result = CliRunner().invoke(
        sim, ["autoscale", "--quick", "--shortfall", "--scenario", "step-5x"]
    )
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[0].startswith("| scenario | lag 0 s |")
    assert "| step-5x | 0.0% |" in result.output
    bad = CliRunner().invoke(sim, ["autoscale", "--shortfall", "--no-search"])
    assert bad.exit_code == 2
