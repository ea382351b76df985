"""`sim validate --run-steps` with the P/D hand-off the decode worker logged (`kv_pulls.jsonl`).

Invariants: the pull log parses back and malformed lines are refused with the line; each
request's hand-off is split into the router-to-worker dispatch, the engine's admission (not
charged) and the pull, and the charge is dispatch + pull; the decode model prices a request's
transfer as the hand-off measured for its size (the median for a size not seen, the link
without a table); a P/D run whose hand-offs vary per request in a way no link model follows
(the ground truth: a simulation whose decode worker's transfer time is an arbitrary function
of the bytes) replays its TPOT within 2 % at p50 / p90 with the measured hand-off and misses
by more than 10 % without it; the worker's log writes what it was given.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from splitserve.cli.sim import sim
from splitserve.core.perf.protocol import BatchShape
from splitserve.core.perf.samples import steps_csv
from splitserve.sim.cluster import KvOverlap, simulate
from splitserve.sim.config import ClusterConfig, cluster_spec
from splitserve.sim.engine import Simulator
from splitserve.sim.validate import SideBySideTransfers, parse_recording, replay
from splitserve.sim.validate_steps import (
    KvPull,
    RunModel,
    RunStep,
    calibrate,
    handoffs,
    parse_kv_pulls,
)
from splitserve.worker.kv_pull_log import KvPullLog
from tests.unit.sim.test_validate_steps import PD, PRIOR, T0, _items, _Recorder, _truth


def _pull(rid: str, received: float | None, start: float, end: float, n: int = 64) -> str:
    row = {"id": rid, "received_s": received, "pull_start_s": start, "pull_end_s": end}
    return json.dumps({**row, "bytes": n})


def test_pull_log_round_trip_and_refusals(tmp_path: Path) -> None:
    log = KvPullLog(tmp_path / "p.jsonl")
    log.record("a", 10.0, 10.5, 0.25, 4096)
    log.record("b", None, 11.0, 0.0, 0)
    log.close()
    got = parse_kv_pulls((tmp_path / "p.jsonl").read_text().splitlines())
    assert got["a"] == KvPull("a", 10.0, 10.25, 10.5, 4096)
    assert got["b"] == KvPull("b", None, 11.0, 11.0, 0)
    with pytest.raises(ValueError, match="line 2: KeyError"):
        parse_kv_pulls([_pull("a", 1, 1, 2), json.dumps({"id": "b"})])
    with pytest.raises(ValueError, match="line 1: want pull_end_s >= pull_start_s"):
        parse_kv_pulls([_pull("a", 1, 2, 1)])
    with pytest.raises(ValueError, match="line 2: request 'a' pulled twice"):
        parse_kv_pulls([_pull("a", 1, 1, 2), _pull("a", 3, 3, 4)])
    with pytest.raises(ValueError, match="line 1: JSONDecodeError"):
        parse_kv_pulls(["{"])


def test_handoff_parts_charge_table_and_overlaps() -> None:
    pulls = parse_kv_pulls(
        [
            _pull("r1", 10.10, 10.11, 10.15),  # dispatch 10 ms, admit 10 ms, pull 40 ms
            _pull("r2", None, 10.16, 10.18),  # not seen arriving: dispatch 0, admit from 1st tok
            _pull("r3", 12.02, 12.02, 12.05),
            _pull("gone", 20.0, 20.0, 20.1),  # no such completed request
        ]
    )
    reqs = [
        ("r1", 10.0, 100, 0.09),  # first token 10.09
        ("r2", 10.1, 200, 0.04),  # first token 10.14: its hand-off overlaps r1's (to 10.15)
        ("r3", 11.9, 100, 0.10),  # first token 12.00
        ("r4", 13.0, 300, 0.05),  # aggregated: no pull
    ]
    h = handoffs(reqs, pulls)
    assert h.prompt_tokens == (100, 200, 100)
    assert h.dispatch_s == pytest.approx((0.01, 0.0, 0.02))
    assert h.admit_s == pytest.approx((0.01, 0.02, 0.0))
    assert h.pull_s == pytest.approx((0.04, 0.02, 0.03))
    assert h.charged_s == pytest.approx((0.05, 0.02, 0.05))
    assert h.unmatched == 1
    assert h.overlaps() == 1
    table = h.table(bytes_per_token=8)
    assert [b for b, _ in table] == [800, 1600]
    assert table[0][1] == pytest.approx(0.05)  # median of r1 and r3
    assert "charged (dispatch + pull)" in h.markdown()
    assert "1 overlapping" in h.markdown()
    empty = handoffs(reqs, {})
    assert empty.pull_s == ()
    assert "the link prices it" in empty.markdown()


def test_run_model_prices_transfers_from_the_table() -> None:
    model = RunModel(_truth().coeffs, PRIOR)
    assert model.kv_transfer_s(4096) == PRIOR.kv_transfer_s(4096)
    timed = dataclasses.replace(model, transfers=((100, 0.01), (200, 0.05), (400, 0.02)))
    assert timed.kv_transfer_s(200) == 0.05
    assert timed.kv_transfer_s(300) == 0.02  # a size no request had: the median
    assert timed.step_s(BatchShape((), (10,))) == model.step_s(BatchShape((), (10,)))


class _OddLink(_Recorder):
    """A decode worker whose hand-off takes 15-60 ms by an arbitrary function of the bytes."""

    def kv_transfer_s(self, num_bytes: int) -> float:
        return 0.015 + (num_bytes * 7919 % 1000) * 45e-6


class _SlowOddLink(_Recorder):
    """Hand-offs of 0.2-0.65 s, longer than the gap between arrivals: they overlap."""

    def kv_transfer_s(self, num_bytes: int) -> float:
        return 0.2 + (num_bytes * 7919 % 1000) * 45e-5


def _pd_run(
    link: type[_Recorder] = _OddLink, parallel: bool = False
) -> tuple[list[str], dict[str, list[RunStep]], list[str]]:
    """The "live" P/D run: router lines, worker steps, and the decode worker's pull log; with
    `parallel`, the live decode worker pulls side by side."""
    spec = cluster_spec(ClusterConfig.model_validate(PD))
    recorders = {
        "prefill-0": _Recorder(_truth(), lambda now: 1.0),
        "decode-0": link(_truth(), lambda now: 1.0),
    }
    pools = [
        dataclasses.replace(
            p, worker=dataclasses.replace(p.worker, latency=recorders[f"{p.role.value}-0"])
        )
        for p in spec.pools
    ]
    by_pool = {str(p.name): recorders[f"{p.role.value}-0"] for p in spec.pools}
    live = dataclasses.replace(spec, pools=tuple(pools))
    if parallel:
        loop = Simulator()
        world = SideBySideTransfers(live, _items(), 1, pool_speed=by_pool)
        world.start(loop)
        loop.run(world)
        result = world.result(loop)
    else:
        result = simulate(live, _items(), max_repeat=1, pool_speed=by_pool)
    lines, pulls = [], []
    for r in result.requests:
        assert r.ttft_s is not None
        assert r.e2e_s is not None
        assert r.kv_transfer_s is not None
        row = {"id": r.id, "arrival_s": T0 + r.arrival_s, "prompt_tokens": r.num_prompt_tokens}
        row |= {"output_tokens": r.num_output_tokens, "ttft_s": r.ttft_s, "latency_s": r.e2e_s}
        lines.append(json.dumps(row))
        first = T0 + r.arrival_s + r.ttft_s
        pulls.append(_pull(r.id, first, first, first + r.kv_transfer_s))
    return lines, {n: rec.steps for n, rec in recorders.items()}, pulls


def _tpot_errors(spec_lines: tuple[object, list[str]], **kw: object) -> list[float]:
    spec, lines = spec_lines
    v = replay(spec, parse_recording(lines), **kw)  # type: ignore[arg-type]
    return [r.rel_error for r in v.rows() if r.metric == "tpot_s" and r.quantile in (50, 90)]


def test_pd_run_with_per_request_handoffs_replays_its_tpot_from_the_log() -> None:
    lines, steps, pulls = _pd_run()
    spec = cluster_spec(ClusterConfig.model_validate(PD))
    rec = parse_recording(lines)
    end = max(r.arrival_s + r.latency_s for r in rec.requests)
    reqs = [(r.id, r.arrival_s, r.prompt_tokens, r.ttft_s) for r in rec.requests]
    measured = handoffs(reqs, parse_kv_pulls(pulls))
    assert len(measured.pull_s) == len(rec.requests)
    assert measured.unmatched == 0
    with_h = calibrate(spec, steps, T0, end, handoff=measured)
    errs = _tpot_errors((with_h.spec, lines), pool_speed=with_h.pool_speed)
    assert all(abs(e) < 0.02 for e in errs), errs
    without = calibrate(spec, steps, T0, end)
    errs = _tpot_errors((without.spec, lines), pool_speed=without.pool_speed)
    assert max(abs(e) for e in errs) > 0.10, errs
    layered = dataclasses.replace(spec, kv_overlap=KvOverlap.LAYER)
    with pytest.raises(ValueError, match="kv_overlap 'layer'"):
        calibrate(layered, steps, T0, end, handoff=measured)


def test_overlapping_handoffs_replay_side_by_side() -> None:
    lines, steps, pulls = _pd_run(_SlowOddLink, parallel=True)
    spec = cluster_spec(ClusterConfig.model_validate(PD))
    rec = parse_recording(lines)
    end = max(r.arrival_s + r.latency_s for r in rec.requests)
    reqs = [(r.id, r.arrival_s, r.prompt_tokens, r.ttft_s) for r in rec.requests]
    measured = handoffs(reqs, parse_kv_pulls(pulls))
    assert measured.overlaps() > 20
    cal = calibrate(spec, steps, T0, end, handoff=measured)
    assert cal.side_by_side_transfers
    kw = {"pool_speed": cal.pool_speed}
    errs = _tpot_errors((cal.spec, lines), side_by_side_transfers=True, **kw)
    assert all(abs(e) < 0.02 for e in errs), errs
    queued = _tpot_errors((cal.spec, lines), **kw)  # on the link, each overlap counts twice
    assert max(queued) > 0.10, queued


def test_cli_charges_the_handoff_and_switches_it_off(tmp_path: Path) -> None:
    lines, steps, pulls = _pd_run()
    (tmp_path / "run.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(PD))
    run_steps = tmp_path / "steps"
    run_steps.mkdir()
    for name, got in steps.items():
        rows = [(i, s.start_s, s.duration_s, s.batch) for i, s in enumerate(got, 1)]
        (run_steps / f"{name}.steps.csv").write_text("\n".join(steps_csv(rows)) + "\n")
    args = ["validate", str(tmp_path / "run.jsonl"), "--cluster", str(tmp_path / "c.yaml")]
    args += ["--run-steps", str(run_steps)]
    unrecorded = CliRunner().invoke(sim, args)
    assert unrecorded.exit_code == 0, unrecorded.output
    assert "not recorded (no kv_pulls.jsonl)" in unrecorded.output
    (run_steps / "kv_pulls.jsonl").write_text("\n".join(pulls) + "\n")
    on = CliRunner().invoke(sim, args)
    assert on.exit_code == 0, on.output
    assert "P/D hand-off per request (120 requests" in on.output
    off = CliRunner().invoke(sim, [*args, "--no-run-handoff"])
    assert off.exit_code == 0, off.output
    assert "hand-off" not in off.output
    (run_steps / "kv_pulls.jsonl").write_text(_pull("x", 1, 2, 1) + "\n")
    bad = CliRunner().invoke(sim, args)
    assert bad.exit_code != 0
    assert "kv_pulls.jsonl: kv pulls line 1" in bad.output
    alone = CliRunner().invoke(sim, [*args[:4], "--no-run-handoff"])
    assert alone.exit_code != 0
    assert "--no-run-handoff needs --run-steps" in alone.output
    assert "--no-run-speed" not in alone.output  # the flags given, not all five
    two = CliRunner().invoke(sim, [*args[:4], "--no-run-gaps", "--no-run-handoff"])
    assert two.exit_code != 0
    assert "--no-run-gaps, --no-run-handoff need --run-steps" in two.output
