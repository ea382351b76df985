"""`reactive_shortfall`: the share of requests arriving while the need exceeds what a loop with a
given reaction lag could have started (an estimate of what is physically possible)."""

from __future__ import annotations

import numpy as np

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


def test_holding_longer_trades_capacity_for_fewer_requests_at_risk() -> None:
    from splitserve.sim.autoscale_eval import reactive_hold

    # three surges of growing size: a held peak covers a repeat, never a new record
    items = [WorkItem(float(t), 1000, 10) for t in range(900)]
    for start, rate in ((200, 4), (500, 4), (800, 8)):
        items += [WorkItem(start + i / rate, 1000, 10) for i in range(rate * 20)]
    items.sort(key=lambda w: w.arrival_s)
    rows = [reactive_hold(items, PERF, lag_s=20, hold_s=h, floor=2) for h in (60, 120, 400, 900)]
    shares = [r[0] for r in rows]
    workers = [r[1] for r in rows]
    assert shares == sorted(shares, reverse=True)
    assert workers == sorted(workers)
    assert shares[-1] > 0  # the record surge at 800 s is at risk whatever is held
    assert reactive_hold(items, PERF, 20, 400, floor=2)[0] < reactive_hold(items, PERF, 20, 60)[0]


def test_periodic_surges_are_forecast_by_their_period() -> None:
    from splitserve.sim.autoscale_eval import periodic_onset_forecasts

    # 1 req/s with a 20 s surge of 6 req/s every 300 s: the causal period is 300 s, no error
    items = [WorkItem(float(t), 1000, 10) for t in range(3000)]
    for start in range(100, 3000, 300):
        items += [WorkItem(start + i / 6, 1000, 10) for i in range(120)]
    items.sort(key=lambda w: w.arrival_s)
    rows = periodic_onset_forecasts(items)
    assert len(rows) >= 6
    assert all(r.period_s == 300.0 for r in rows)
    assert all(r.error_s == 0.0 for r in rows)
    assert all(r.acf > 0.5 for r in rows)
    # the same surges at random times: the forecast errs
    rng = np.random.default_rng(1)
    jit = [WorkItem(float(t), 1000, 10) for t in range(3000)]
    for start in np.sort(rng.uniform(0, 2900, 10)):
        jit += [WorkItem(float(start) + i / 6, 1000, 10) for i in range(120)]
    jit.sort(key=lambda w: w.arrival_s)
    assert np.median([r.error_s for r in periodic_onset_forecasts(jit)]) > 20.0
