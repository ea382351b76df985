"""`splitserve sim validate`: the recording format, the replay and its error report.

Invariants: a recording made from a simulation replays on the same cluster with zero error; the
router's request log is a valid recording; JSON lines and CSV read the same; rows that are not
`ok` are replayed as load when they made a token, else skipped and counted; malformed rows fail
with the line number.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from splitserve.cli.sim import sim
from splitserve.router.request_log import RequestLog
from splitserve.sim.cluster import simulate
from splitserve.sim.config import ClusterConfig, cluster_spec
from splitserve.sim.validate import parse_recording, per_request_errors, replay
from splitserve.sim.workload import WorkItem

CLUSTER = {
    "name": "pd",
    "model": "tiny",
    "hardware": "a100-80g",
    "pools": [
        {"name": "prefill", "role": "prefill", "replicas": 1},
        {"name": "decode", "role": "decode", "replicas": 1},
    ],
}


def _recording_of(cfg: ClusterConfig, n: int = 30) -> list[str]:
    items = tuple(WorkItem(0.05 * i, 20 + 7 * i, 1 + (i % 9)) for i in range(n))
    result = simulate(cluster_spec(cfg), items)
    lines = []
    for r in result.requests:
        assert r.ttft_s is not None
        assert r.e2e_s is not None
        lines.append(
            json.dumps(
                {
                    "id": r.id,
                    "arrival_s": 100.0 + r.arrival_s,  # an offset clock: only differences count
                    "prompt_tokens": r.num_prompt_tokens,
                    "output_tokens": r.num_output_tokens,
                    "ttft_s": r.ttft_s,
                    "tpot_s": r.tpot_s,
                    "latency_s": r.e2e_s,
                    "outcome": "ok",
                }
            )
        )
    return lines


def test_a_simulated_recording_replays_with_zero_error() -> None:
    cfg = ClusterConfig.model_validate(CLUSTER)
    v = replay(cluster_spec(cfg), parse_recording(_recording_of(cfg)))
    assert len(v.pairs) == 30
    for row in v.rows():
        assert row.rel_error == pytest.approx(0.0, abs=1e-9)
    assert max(abs(e) for e in per_request_errors(v, "ttft_s")) < 1e-9


def test_the_first_requests_extra_goes_to_it_alone() -> None:
    cfg = ClusterConfig.model_validate(CLUSTER)
    rec = parse_recording(_recording_of(cfg))
    base = replay(cluster_spec(cfg), rec, request_overhead_s=0.003)
    cold = replay(cluster_spec(cfg), rec, request_overhead_s=0.003, first_request_extra_s=0.02)
    first, *rest = zip(base.pairs, cold.pairs, strict=True)
    assert first[1].ttft_s == pytest.approx(first[0].ttft_s + 0.02)
    assert first[1].latency_s == pytest.approx(first[0].latency_s + 0.02)
    assert first[1].recorded is rec.requests[0]
    assert all(b.ttft_s == c.ttft_s and b.latency_s == c.latency_s for b, c in rest)


def test_a_slower_model_shows_up_as_positive_error() -> None:
    cfg = ClusterConfig.model_validate(CLUSTER)
    slow = ClusterConfig.model_validate({**CLUSTER, "time_scale": 2.0})
    v = replay(cluster_spec(slow), parse_recording(_recording_of(cfg)))
    ttft_p50 = next(r for r in v.rows() if r.metric == "ttft_s" and r.quantile == 50)
    assert ttft_p50.rel_error > 0.5
    assert "| no |" in v.markdown()


@pytest.mark.parametrize(("target", "says"), [(0.05, "5"), (0.001, "0.1"), (0.125, "12.5")])
def test_the_report_names_the_target_it_scored(target: float, says: str) -> None:
    # `--target 0.001` was headed "within 0 %"
    cfg = ClusterConfig.model_validate(CLUSTER)
    v = replay(cluster_spec(cfg), parse_recording(_recording_of(cfg)))
    assert f"| within {says} % |" in v.markdown(target)


def test_router_request_log_is_a_recording(tmp_path: Path) -> None:
    log = RequestLog(tmp_path / "r.jsonl")
    log.record("a", 10.0, 12, 5, 10.2, 11.0, "pd", "ok")
    log.record("b", 10.5, 8, 1, 10.6, 10.6, "mixed", "ok")
    log.close()
    log.record("c", 11.0, 8, 1, 11.1, 11.1, "mixed", "ok")  # after close: ignored
    rec = parse_recording((tmp_path / "r.jsonl").read_text().splitlines())
    assert [r.id for r in rec.requests] == ["a", "b"]
    a = rec.requests[0]
    assert a.ttft_s == pytest.approx(0.2)
    assert a.tpot_s == pytest.approx(0.2)  # (1.0 - 0.2) / 4
    assert rec.requests[1].tpot_s is None


def test_the_router_s_rounded_times_pass_the_tpot_check(tmp_path: Path) -> None:
    """The request log rounds ttft_s, tpot_s and latency_s to 6 decimals each: whatever the
    clock's readings and the output length, `tpot_tolerance_s` covers what that rounding does to
    ttft_s + tpot_s * (output_tokens - 1), so splitserve's own recordings are never refused."""
    rng = random.Random(7)
    log = RequestLog(tmp_path / "r.jsonl")
    for i in range(2000):
        arrival = rng.uniform(0, 1e5)
        first = arrival + rng.uniform(0, 5)
        n = rng.choice((2, 3, rng.randrange(2, 100), rng.randrange(2, 40000)))
        log.record(str(i), arrival, 8, n, first, first + rng.uniform(0, 60), "pd", "ok")
    log.close()
    rec = parse_recording((tmp_path / "r.jsonl").read_text().splitlines())
    assert len(rec.requests) == 2000


def test_csv_and_json_lines_read_the_same() -> None:
    csv_lines = [
        "id,arrival_s,prompt_tokens,output_tokens,ttft_s,tpot_s,latency_s,outcome",
        "x,1.0,10,3,0.1,,0.5,ok",
        "y,0.5,10,3,0.1,0.2,0.5,error",
    ]
    rec = parse_recording(csv_lines)
    assert rec.skipped == 0
    assert [(r.id, r.output_tokens) for r in rec.load_only] == [("y", 3)]
    assert rec.requests[0].tpot_s == pytest.approx(0.2)  # derived: (0.5 - 0.1) / 2
    js = parse_recording(
        [
            '{"id": "x", "arrival_s": 1.0, "prompt_tokens": 10, "output_tokens": 3,'
            ' "ttft_s": 0.1, "latency_s": 0.5}'
        ]
    )
    assert js.requests == rec.requests


@pytest.mark.parametrize(
    ("lines", "match"),
    [
        ([], "empty"),
        (["hello world"], "neither JSON lines .* lacks arrival_s"),
        (["arrival_s,prompt_tokens,ttft_s", "1,2,3"], "lacks output_tokens, latency_s"),
        (['{"a": 1}', "[1]"], "line 2: not a JSON object"),
        (["{not json"], "line 1: not JSON"),
        (['{"arrival_s": 0, "prompt_tokens": 1, "output_tokens": 1, "ttft_s": 0}'], "latency_s"),
        (
            [
                '{"arrival_s": 0, "prompt_tokens": 0, "output_tokens": 1, "ttft_s": 0, '
                '"latency_s": 1}'
            ],
            "must be >= 1",
        ),
        (
            [
                '{"arrival_s": -1, "prompt_tokens": 1, "output_tokens": 1, "ttft_s": 0, '
                '"latency_s": 1}'
            ],
            ">= 0",
        ),
        (
            [
                '{"arrival_s": 0, "prompt_tokens": 1, "output_tokens": 1, "ttft_s": 0, '
                '"latency_s": 1, "outcome": "timeout"}'
            ],
            "no completed",
        ),
    ],
)
def test_bad_recordings_are_refused(lines: list[str], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        parse_recording(lines)


def test_validate_command(tmp_path: Path) -> None:
    cfg = ClusterConfig.model_validate(CLUSTER)
    (tmp_path / "rec.jsonl").write_text("\n".join(_recording_of(cfg)) + "\n")
    (tmp_path / "cluster.yaml").write_text(yaml.safe_dump(CLUSTER))
    out = tmp_path / "out"
    res = CliRunner().invoke(
        sim,
        [
            "validate",
            str(tmp_path / "rec.jsonl"),
            "--cluster",
            str(tmp_path / "cluster.yaml"),
            "--out",
            str(out),
        ],
    )
    assert res.exit_code == 0, res.output
    assert "| ttft | p50 |" in res.output
    assert len((out / "requests.csv").read_text().splitlines()) == 31
    bad = {**CLUSTER, "workload": {"arrival": "poisson"}}
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(bad))
    res = CliRunner().invoke(
        sim, ["validate", str(tmp_path / "rec.jsonl"), "--cluster", str(tmp_path / "bad.yaml")]
    )
    assert res.exit_code != 0
    assert "workload" in res.output


def test_a_request_that_was_not_ok_is_replayed_as_load_not_scored() -> None:
    """A client that left after 40 tokens kept the decode worker busy until then: the replay
    runs it (the request behind it is slower than without it) but scores only `ok` rows; one
    that failed before its first token is skipped and counted."""
    cfg = ClusterConfig.model_validate(CLUSTER)
    ok = _recording_of(cfg, n=6)
    left = {"id": "left", "arrival_s": 99.99, "prompt_tokens": 3000, "output_tokens": 40,
            "ttft_s": None, "latency_s": 2.0, "outcome": "cancelled"}  # fmt: skip
    never = {"id": "never", "arrival_s": 100.0, "prompt_tokens": 3000, "output_tokens": 0,
             "ttft_s": None, "latency_s": 0.1, "outcome": "unavailable"}  # fmt: skip
    alone = replay(cluster_spec(cfg), parse_recording([*ok, json.dumps(never)]))
    loaded = replay(cluster_spec(cfg), parse_recording([*ok, json.dumps(left), json.dumps(never)]))
    assert [p.recorded.id for p in loaded.pairs] == [p.recorded.id for p in alone.pairs]
    assert (alone.skipped, alone.load_only, loaded.skipped, loaded.load_only) == (1, 0, 1, 1)
    assert loaded.pairs[0].ttft_s > alone.pairs[0].ttft_s
    assert "1 more replayed as load only" in loaded.markdown()
