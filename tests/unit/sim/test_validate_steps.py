"""`sim validate --run-steps`: a replay priced by the recorded workers' own steps.

Invariants: the steps CSV `record_run --steps-out` writes parses back exactly, and malformed
logs are refused with the line; a model of the fitted form is recovered from its own steps; a
worker that slowed down mid-run shows that slowdown in its speed factor; a run recorded on a
"machine" whose speed changed mid-run (the ground truth: a simulation with a per-pool speed,
its steps captured as a worker would report them) replays within 2 % at p50 / p90 once
calibrated from its steps, while the same model without the speed factor, or the cluster's own
model, misses by far more; roles must match the cluster's pools.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from splitserve.cli.sim import sim
from splitserve.core.perf.protocol import BatchShape, LatencyModel
from splitserve.core.perf.roofline import RooflineModel
from splitserve.core.perf.samples import steps_csv
from splitserve.core.perf.shapes import HARDWARE, MODELS
from splitserve.sim.cluster import ClusterSpec, simulate
from splitserve.sim.config import ClusterConfig, cluster_spec
from splitserve.sim.validate import parse_recording, replay
from splitserve.sim.validate_steps import (
    RunModel,
    RunStep,
    calibrate,
    continues,
    fit_pool,
    parse_steps_csv,
    request_overheads,
    run_speed,
    with_busy_gaps,
)
from splitserve.sim.workload import WorkItem

MIXED = {
    "name": "agg",
    "model": "tiny",
    "hardware": "a100-80g",
    "pools": [{"name": "mixed", "role": "mixed", "replicas": 1}],
}
PD = {
    **MIXED,
    "name": "pd",
    "pools": [
        {"name": "prefill", "role": "prefill", "replicas": 1},
        {"name": "decode", "role": "decode", "replicas": 1},
    ],
}
T0 = 700.0
"""The run's clock at its first arrival."""
PRIOR: LatencyModel = RooflineModel(MODELS["tiny"], HARDWARE["a100-80g"])
TRUTH = (4e-3, 2e-5, 1e-8, 6e-3, 1e-6, 4e-4)
"""The "live" engine's step time (`COEFF_NAMES` order): milliseconds per step, like the CPU
workers."""


def _truth() -> RunModel:
    return RunModel(TRUTH, PRIOR)


Speed = Callable[[float], float]


def _slow_after(t_s: float, factor: float) -> Speed:
    return lambda now: 1.0 if now < t_s else factor


class _Recorder:
    """Captures each step as a worker reports it: the model's price is noted when the cluster
    asks for it, the speed factor and start when it asks for the pool's speed (right after)."""

    def __init__(self, model: LatencyModel, speed: Speed) -> None:
        self.model = model
        self.speed = speed
        self.steps: list[RunStep] = []
        self._last: tuple[BatchShape, float] | None = None

    @property
    def ready(self) -> bool:
        return True

    def step_s(self, batch: BatchShape) -> float:
        price = self.model.step_s(batch)
        self._last = (batch, price)
        return price

    def kv_transfer_s(self, num_bytes: int) -> float:
        return self.model.kv_transfer_s(num_bytes)

    def __call__(self, now: float) -> float:
        f = self.speed(now)
        assert self._last is not None
        batch, price = self._last
        if not batch.is_empty:  # a worker reports only steps that ran tokens
            self.steps.append(RunStep(T0 + now, price * f, batch))
        return f


def _items(n: int = 120) -> tuple[WorkItem, ...]:
    return tuple(WorkItem(0.25 * i, 40 + (37 * i) % 400, 4 + (i % 13)) for i in range(n))


def _record(
    cfg: Mapping[str, object], speeds: Mapping[str, Speed]
) -> tuple[list[str], dict[str, list[RunStep]]]:
    """A "live" run: the truth model on every pool, each pool at its speed over time; the
    router-side recording and each worker's steps (`<role>-0`)."""
    import dataclasses

    spec = cluster_spec(ClusterConfig.model_validate(cfg))
    recorders = {}
    pools = []
    for pool in spec.pools:
        rec = _Recorder(_truth(), speeds[str(pool.name)])
        recorders[f"{pool.role.value}-0"] = rec
        pools.append(
            dataclasses.replace(pool, worker=dataclasses.replace(pool.worker, latency=rec))
        )
    live = dataclasses.replace(spec, pools=tuple(pools))
    by_pool = {str(p.name): recorders[f"{p.role.value}-0"] for p in spec.pools}
    result = simulate(live, _items(), max_repeat=1, pool_speed=by_pool)
    lines = []
    for r in result.requests:
        assert r.ttft_s is not None
        assert r.e2e_s is not None
        lines.append(
            json.dumps(
                {
                    "id": r.id,
                    "arrival_s": T0 + r.arrival_s,
                    "prompt_tokens": r.num_prompt_tokens,
                    "output_tokens": r.num_output_tokens,
                    "ttft_s": r.ttft_s,
                    "latency_s": r.e2e_s,
                }
            )
        )
    return lines, {name: rec.steps for name, rec in recorders.items()}


def _errors(spec: ClusterSpec, lines: Sequence[str], **kw: object) -> dict[tuple[str, int], float]:
    v = replay(spec, parse_recording(lines), **kw)  # type: ignore[arg-type]
    return {(r.metric, r.quantile): r.rel_error for r in v.rows() if r.quantile in (50, 90)}


def test_steps_csv_round_trip_and_refusals() -> None:
    steps = [
        (1, 10.5, 0.02, BatchShape(((128, 0), (64, 32)), (100, 7))),
        (3, 10.0, 0.01, BatchShape((), (5,))),
    ]
    parsed = parse_steps_csv(steps_csv(steps))
    assert parsed == (
        RunStep(10.0, 0.01, BatchShape((), (5,))),
        RunStep(10.5, 0.02, BatchShape(((128, 0), (64, 32)), (100, 7))),
    )
    with pytest.raises(ValueError, match="header"):
        parse_steps_csv(["1,2,3"])
    good = steps_csv(steps[:1])
    with pytest.raises(ValueError, match="line 2"):
        parse_steps_csv([good[0], good[1].replace("0.02", "-1")])
    with pytest.raises(ValueError, match="no step"):
        parse_steps_csv(good[:1])
    idle = steps_csv([(2, 9.0, 0.0, BatchShape()), (3, 9.5, 0.0, BatchShape((), (5,)))])
    assert parse_steps_csv([*good, *idle[1:]]) == parsed[1:]  # no work, no time: left out


def test_busy_gaps_join_a_step_to_the_next_only_when_it_carries_on() -> None:
    steps = [
        RunStep(0.0, 0.010, BatchShape(((100, 0),))),  # its next chunk starts at 100
        RunStep(0.012, 0.010, BatchShape(((50, 100),), (7,))),  # prefill done: decode at 150
        RunStep(0.030, 0.010, BatchShape((), (150, 8))),
        RunStep(2.000, 0.010, BatchShape((), (40,))),  # a new request after an idle second
        RunStep(2.011, 0.010, BatchShape((), (41,))),
    ]
    got = [round(s.duration_s, 6) for s in with_busy_gaps(steps)]
    assert got == [0.012, 0.018, 0.010, 0.011, 0.010]
    assert continues(BatchShape((), (5,)), BatchShape(((9, 6),)))  # a preempted one recomputed


def test_request_overheads_match_each_prompt_to_its_step() -> None:
    steps = [
        RunStep(10.003, 0.020, BatchShape(((100, 0),))),  # idle worker: dispatch 3 ms
        RunStep(10.023, 0.030, BatchShape(((200, 0),), (100,))),  # arrived while busy
        RunStep(20.000, 0.010, BatchShape((), (7,))),
    ]
    # (arrival, prompt, TTFT): first token 2 ms after its step's end; the second queued; the
    # third's prompt never ran on this worker.
    reqs = [(10.0, 100, 0.025), (10.01, 200, 0.045), (11.0, 300, 0.1)]
    got = request_overheads(reqs, steps)
    assert got.dispatch_s == pytest.approx((0.003,))
    assert got.return_s == pytest.approx((0.002, 0.002))
    assert got.unmatched == 1
    assert got.total_s == pytest.approx(0.005)
    assert got.first_dispatch_s == pytest.approx(0.003)
    assert got.cold_s == 0.0  # the first request's dispatch is the median: nothing extra


def test_the_first_requests_cold_dispatch_is_measured_apart() -> None:
    # Three requests at idle workers: the first waits 30 ms for its step (the cold path), the
    # others 3 ms; the cold part is its dispatch over the median (3 ms), for it alone.
    steps = [
        RunStep(10.030, 0.020, BatchShape(((100, 0),))),
        RunStep(11.003, 0.020, BatchShape(((200, 0),))),
        RunStep(12.003, 0.020, BatchShape(((300, 0),))),
    ]
    reqs = [(10.0, 100, 0.052), (11.0, 200, 0.025), (12.0, 300, 0.025)]
    got = request_overheads(reqs, steps)
    assert got.dispatch_s == pytest.approx((0.030, 0.003, 0.003))
    assert got.first_dispatch_s == pytest.approx(0.030)
    assert got.cold_s == pytest.approx(0.027)
    # A first request that queued behind a step is not a dispatch sample: nothing charged.
    busy = [RunStep(9.99, 0.05, BatchShape(((50, 0),))), *steps]
    assert request_overheads(reqs, busy).first_dispatch_s is None
    assert request_overheads(reqs, busy).cold_s == 0.0


def test_fit_recovers_the_model_and_a_mid_run_slowdown() -> None:
    truth = _truth()
    shapes = [
        BatchShape(((n, 0),), tuple(range(100, 100 + 10 * b, 10)))
        if n
        else BatchShape((), tuple(range(100, 100 + 10 * b, 10)))
        for n, b in [(0, 1), (0, 4), (64, 0), (256, 0), (128, 2), (0, 9), (512, 0), (32, 3)]
    ]
    steps = [
        RunStep(float(i) * 0.05, truth.step_s(b) * (1.0 if i < 400 else 3.0), b)
        for i, b in enumerate(shapes * 100)
    ]
    fit = fit_pool("mixed", {"mixed-0": steps}, PRIOR)
    assert fit.mape_timed < 0.01
    assert fit.mape_model > 0.3  # one model cannot be right before and after the slowdown
    (speed,) = fit.speeds
    assert speed.factor(40.0) / speed.factor(5.0) == pytest.approx(3.0, rel=0.01)
    for b in shapes:  # the model carries the run's typical (median) speed
        assert fit.model.step_s(b) / truth.step_s(b) == pytest.approx(
            speed.factor(5.0) ** -1, rel=0.02
        )


def test_pricing_factor_is_the_step_that_started_nearest() -> None:
    steps = [RunStep(0.0, 0.5, BatchShape((), (1,))), RunStep(0.51, 0.1, BatchShape((), (2,)))]
    model = RunModel((0.0, 0.0, 0.0, 0.1, 0.0, 0.0), PRIOR)  # every decode step 0.1 s
    one = run_speed(steps, model, nearest=1)
    assert one.factor(0.2) == pytest.approx(5.0)  # the first (stalled) step
    assert one.factor(0.49) == pytest.approx(1.0)  # a step starting now matches the second
    assert run_speed(steps, model, nearest=2).factor(0.45) == pytest.approx(3.0)


@pytest.mark.parametrize("cfg", [MIXED, PD], ids=["aggregated", "pd"])
def test_run_that_slowed_down_replays_within_2_percent_from_its_steps(
    cfg: Mapping[str, object],
) -> None:
    pools = cfg["pools"]
    assert isinstance(pools, list)
    names = [str(p["name"]) for p in pools]
    speeds = {name: _slow_after(12.0 + 4 * i, 2.5 + i) for i, name in enumerate(names)}
    lines, steps = _record(cfg, speeds)
    spec = cluster_spec(ClusterConfig.model_validate(cfg))  # priced by the roofline (wrong)
    rec = parse_recording(lines)
    end = max(r.arrival_s + r.latency_s for r in rec.requests)
    timed = calibrate(spec, steps, T0, end, timed=True)
    calibrated = _errors(timed.spec, lines, pool_speed=timed.pool_speed)
    assert all(abs(e) < 0.02 for e in calibrated.values()), calibrated
    untimed = calibrate(spec, steps, T0, end, timed=False)
    assert max(abs(e) for e in _errors(untimed.spec, lines).values()) > 0.2
    assert max(abs(e) for e in _errors(spec, lines).values()) > 0.5


def test_roles_must_match_the_pools() -> None:
    spec = cluster_spec(ClusterConfig.model_validate(PD))
    one = {"prefill-0": [RunStep(0.0, 0.01, BatchShape(((8, 0),)))]}
    with pytest.raises(ValueError, match="decode"):
        calibrate(spec, one, 0.0, 1.0)
    with pytest.raises(ValueError, match="mixed"):
        calibrate(spec, {**one, "decode-0": one["prefill-0"], "mixed-0": []}, 0.0, 1.0)


def test_cli_reports_the_fit_and_refuses_both_speed_sources(tmp_path: Path) -> None:
    lines, steps = _record(MIXED, {"mixed": _slow_after(10.0, 2.0)})
    (tmp_path / "run.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(MIXED))
    run_steps = tmp_path / "steps"
    run_steps.mkdir()
    for name, got in steps.items():
        rows = [(i, s.start_s, s.duration_s, s.batch) for i, s in enumerate(got, 1)]
        (run_steps / f"{name}.steps.csv").write_text("\n".join(steps_csv(rows)) + "\n")
    args = ["validate", str(tmp_path / "run.jsonl"), "--cluster", str(tmp_path / "c.yaml")]
    out = CliRunner().invoke(sim, [*args, "--run-steps", str(run_steps)])
    assert out.exit_code == 0, out.output
    assert "own worker steps" in out.output
    assert "| mixed | mixed-0 |" in out.output
    probe = tmp_path / "speed.jsonl"
    probe.write_text(json.dumps({"t_s": T0, "probe_s": 0.002}) + "\n")
    both = CliRunner().invoke(
        sim, [*args, "--run-steps", str(run_steps), "--speed-trace", str(probe)]
    )
    assert both.exit_code != 0
    assert "not both" in both.output
    gapless = CliRunner().invoke(sim, [*args, "--run-steps", str(run_steps), "--no-run-gaps"])
    assert gapless.exit_code == 0, gapless.output
    assert "engine.step() only" in gapless.output
    assert "outside the steps" in gapless.output
    alone = CliRunner().invoke(sim, [*args, "--no-run-speed"])
    assert alone.exit_code != 0
    assert "--run-steps" in alone.output
