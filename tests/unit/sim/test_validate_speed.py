"""`sim validate --speed-trace`: the machine's speed during a recorded run scales the replay.

Invariants: a run recorded on a machine running at half speed (every step twice as long) replays
with zero error on the full-speed model once the speed trace says so, and with a large error
without it; the factor is the probe's median near a time over its median in the reference
window; malformed traces are refused with the line number.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from splitserve.cli.sim import sim
from splitserve.sim.cluster import simulate
from splitserve.sim.config import ClusterConfig, cluster_spec
from splitserve.sim.speed import parse_speed_trace
from splitserve.sim.validate import parse_recording, replay
from splitserve.sim.workload import WorkItem

MIXED = {
    "name": "agg",
    "model": "tiny",
    "hardware": "a100-80g",
    "pools": [{"name": "mixed", "role": "mixed", "replicas": 1}],
}
T0 = 500.0
"""The recording's clock at its first arrival (only differences count)."""


def _recording(scale: float, n: int = 40) -> list[str]:
    cfg = ClusterConfig.model_validate({**MIXED, "time_scale": scale})
    items = tuple(WorkItem(0.02 * i, 30 + 11 * i, 2 + (i % 7)) for i in range(n))
    lines = []
    for r in simulate(cluster_spec(cfg), items).requests:
        assert r.ttft_s is not None
        assert r.e2e_s is not None
        row = {
            "id": r.id,
            "arrival_s": T0 + r.arrival_s,
            "prompt_tokens": r.num_prompt_tokens,
            "output_tokens": r.num_output_tokens,
            "ttft_s": r.ttft_s,
            "latency_s": r.e2e_s,
        }
        lines.append(json.dumps(row))
    return lines


def _trace(run_probe_s: float, ref_probe_s: float, until_s: float = 60.0) -> list[str]:
    """Probes every 0.1 s from the first arrival: `run_probe_s` during the run, then a
    reference window (the profile) at `ref_probe_s`."""
    lines = [
        json.dumps({"t_s": T0 + 0.1 * i, "probe_s": run_probe_s}) for i in range(int(until_s * 10))
    ]
    ref0 = T0 + until_s + 1
    lines += [json.dumps({"t_s": ref0 + 0.1 * i, "probe_s": ref_probe_s}) for i in range(50)]
    lines.append(json.dumps({"reference_start_s": ref0, "reference_end_s": ref0 + 5}))
    return lines


def test_half_speed_run_replays_exactly_with_its_speed_trace() -> None:
    spec = cluster_spec(ClusterConfig.model_validate(MIXED))
    rec = parse_recording(_recording(2.0))
    plain = replay(spec, rec)
    ttft50 = next(r for r in plain.rows() if r.metric == "ttft_s" and r.quantile == 50)
    assert ttft50.rel_error < -0.3  # the full-speed model is too fast without the trace
    scaled = replay(spec, rec, parse_speed_trace(_trace(0.004, 0.002)))
    for row in scaled.rows():
        assert row.rel_error == pytest.approx(0.0, abs=1e-6), row


def test_factor_is_the_local_median_over_the_reference() -> None:
    lines = [json.dumps({"t_s": float(t), "probe_s": p}) for t, p in [(0, 1), (1, 3), (2, 3)]]
    lines += [json.dumps({"t_s": 10.0, "probe_s": 2.0})]
    lines += [json.dumps({"reference_start_s": 9.5, "reference_end_s": 10.5})]
    trace = parse_speed_trace(lines)
    assert trace.reference_s == 2.0
    assert trace.factor(1.5) == pytest.approx(1.5)  # probes at 1 and 2 in ± 0.5 s
    assert trace.factor(5.0) == pytest.approx(1.5)  # none in the window: the nearest (t=2 -> 3)
    no_ref = parse_speed_trace(lines[:-1])
    assert no_ref.reference_s == 2.5  # the whole trace's median
    f = trace.step_function(origin_s=0.0, bin_s=1.0)
    assert f(0.2) == pytest.approx(trace.factor(0.5))
    assert f(1e6) == f.values[-1]


@pytest.mark.parametrize(
    ("lines", "match"),
    [
        ([], "no probes"),
        (["{nope"], "line 1: not JSON"),
        (['{"t_s": 1}'], "line 1: needs numbers"),
        (['{"t_s": 1, "probe_s": 0}'], "probe_s must be a finite number > 0"),
        (['{"t_s": 1, "probe_s": 1}', '{"reference_start_s": 5}'], "line 2: needs"),
        (
            ['{"t_s": 1, "probe_s": 1}', '{"reference_start_s": 5, "reference_end_s": 6}'],
            "no probe inside the reference window",
        ),
        # NaN / Infinity parse as JSON numbers: a NaN probe priced every step NaN (a report of
        # '-' and '+nan %' with no error), a NaN time sorted anywhere
        (['{"t_s": 1, "probe_s": NaN}'], "line 1: probe_s must be a finite number > 0"),
        (['{"t_s": 1, "probe_s": Infinity}'], "line 1: probe_s must be a finite number > 0"),
        (['{"t_s": NaN, "probe_s": 1}'], "line 1: t_s must be a finite number"),
        (
            ['{"t_s": 1, "probe_s": 1}', '{"reference_start_s": NaN, "reference_end_s": 6}'],
            "line 2: reference_start_s and reference_end_s must be finite",
        ),
        (
            ['{"t_s": 1, "probe_s": 1}', '{"reference_start_s": 6, "reference_end_s": 0}'],
            "line 2: reference_start_s 6.0 is after reference_end_s 0.0",
        ),
    ],
)
def test_bad_speed_traces_are_refused(lines: list[str], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        parse_speed_trace(lines)


def test_cli_speed_trace(tmp_path: Path) -> None:
    (tmp_path / "run.jsonl").write_text("\n".join(_recording(2.0)) + "\n")
    (tmp_path / "speed.jsonl").write_text("\n".join(_trace(0.004, 0.002)) + "\n")
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(MIXED))
    args = ["validate", str(tmp_path / "run.jsonl"), "--cluster", str(tmp_path / "c.yaml")]
    out = CliRunner().invoke(sim, [*args, "--speed-trace", str(tmp_path / "speed.jsonl")])
    assert out.exit_code == 0, out.output
    assert "scaled by the machine's speed from speed.jsonl" in out.output
    assert "| no |" not in out.output
    (tmp_path / "bad.jsonl").write_text('{"t_s": 1}\n')
    bad = CliRunner().invoke(sim, [*args, "--speed-trace", str(tmp_path / "bad.jsonl")])
    assert bad.exit_code != 0
    assert "needs numbers t_s and probe_s" in bad.output
