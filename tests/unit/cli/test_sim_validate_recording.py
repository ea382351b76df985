"""`splitserve sim validate` with a malformed recording: exit 2 and one error line naming the
file, its line and the field, never a traceback.

Before the fix such recordings exited 1 with text naming neither the file nor (for CSV and
recordings with blank lines) the right line; a file that is not UTF-8 named no line; a token count
of 1e300 ended in an OverflowError traceback; `1.5` or `true` tokens were taken silently.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from splitserve.cli.sim import sim
from tests.unit.sim.test_validate import CLUSTER

OK = '{"arrival_s": 0, "prompt_tokens": 4, "output_tokens": 2, "ttft_s": 0.1, "latency_s": 0.2}'
HEADER = "arrival_s,prompt_tokens,output_tokens,ttft_s,latency_s"


def _line(**fields: object) -> str:
    row: dict[str, object] = {"arrival_s": 0, "prompt_tokens": 4, "output_tokens": 2}
    row.update({"ttft_s": 0.1, "latency_s": 1})
    row.update(fields)
    return "{" + ", ".join(f'"{k}": {v}' for k, v in row.items()) + "}"


@pytest.mark.parametrize(
    ("name", "content", "words"),
    [
        ("a.jsonl", f'{OK}\n\n{{"arrival_s": 0,\n', "line 3: not JSON"),
        ("b.jsonl", f"{OK}\n{_line(arrival_s=chr(34) + 'x' + chr(34))}\n", "line 2: 'arrival_s'"),
        ("c.csv", f"{HEADER}\n0,4,2,0.1,0.2\n0,1\n", "line 3: missing 'output_tokens'"),
        ("d.jsonl", b"\xff\xfe garbage\n", "line 1: not UTF-8 text"),
        ("e.jsonl", "", "empty"),
        ("f.jsonl", f"{_line(prompt_tokens=1e300)}\n", "line 1: 'prompt_tokens'"),
        ("g.jsonl", f"{_line(prompt_tokens=1.5)}\n", "'prompt_tokens' must be >= 1, a whole"),
        ("h.jsonl", f"{_line(output_tokens='true')}\n", "line 1: 'output_tokens' is not a number"),
    ],
)
def test_a_malformed_recording_is_one_line_naming_file_and_line(
    tmp_path: Path, name: str, content: str | bytes, words: str
) -> None:
    (tmp_path / "cluster.yaml").write_text(yaml.safe_dump(CLUSTER))
    rec = tmp_path / name
    if isinstance(content, bytes):
        rec.write_bytes(content)
    else:
        rec.write_text(content)
    res = CliRunner().invoke(
        sim, ["validate", str(rec), "--cluster", str(tmp_path / "cluster.yaml")]
    )
    assert res.exit_code == 2, res.output
    assert isinstance(res.exception, SystemExit)  # not a traceback
    last = res.output.strip().splitlines()[-1]
    assert last.startswith(f"Error: Invalid value for 'RECORDING': {rec}: "), res.output
    assert words in last


@pytest.mark.parametrize(
    ("content", "words"),
    [
        # a first token after the last one: replayed as measured (ttft error 99.6 %, exit 0)
        (f"{OK}\n{_line(ttft_s=0.5, latency_s=0.1)}\n", "line 2: 'ttft_s' (0.5) is after"),
        (f"{HEADER}\n0,4,2,0.1,0.2\n1,4,2,3,2\n", "line 3: 'ttft_s' (3) is after"),
        # a field the format does not have was ignored without a word (a typo: tpot_ms)
        (f"{OK}\n{_line(tpot_ms=20)}\n", "line 2: unknown field 'tpot_ms'"),
        (f"{HEADER},bogus\n0,4,2,0.1,0.2,1\n", "line 2: unknown field 'bogus'"),
        (f"{HEADER}\n0,4,2,0.1,0.2\n0,4,2,0.1,0.2,9\n", "line 3: more values than the header"),
        # tpot_s was not cross-checked: replayed as measured (its error against a TPOT the run
        # cannot have had)
        (
            f"{OK}\n{_line(output_tokens=1, latency_s=0.1, tpot_s=0.05)}\n",
            "line 2: 'tpot_s' (0.05)",
        ),
        (f"{OK}\n{_line(output_tokens=11, tpot_s=0.2)}\n", "line 2: 'tpot_s' (0.2) * 10"),
        (f"{HEADER},tpot_s\n0,4,2,0.1,0.2,\n0,4,3,0.1,0.2,0.06\n", "line 3: 'tpot_s' (0.06)"),
        # already refused: a negative or nan tpot_s
        (f"{OK}\n{_line(tpot_s=-0.1)}\n", "line 2: 'tpot_s' must be finite and >= 0"),
        (f"{OK}\n{_line(tpot_s='NaN')}\n", "line 2: 'tpot_s' must be finite and >= 0"),
        (f"{HEADER},tpot_s\n0,4,2,0.1,0.2,nan\n", "line 2: 'tpot_s' must be finite and >= 0"),
    ],
)
def test_an_inconsistent_or_unknown_field_is_refused_naming_the_line(
    tmp_path: Path, content: str, words: str
) -> None:
    (tmp_path / "cluster.yaml").write_text(yaml.safe_dump(CLUSTER))
    rec = tmp_path / ("r.csv" if content.startswith(HEADER) else "r.jsonl")
    rec.write_text(content)
    res = CliRunner().invoke(
        sim, ["validate", str(rec), "--cluster", str(tmp_path / "cluster.yaml")]
    )
    assert res.exit_code == 2, res.output
    last = res.output.strip().splitlines()[-1]
    assert last.startswith(f"Error: Invalid value for 'RECORDING': {rec}: "), res.output
    assert words in last


def test_a_recording_of_one_token_outputs_says_tpot_is_not_measured(tmp_path: Path) -> None:
    # printed 'tpot nan %' (no request has a TPOT when every output is one token)
    (tmp_path / "cluster.yaml").write_text(yaml.safe_dump(CLUSTER))
    rec = tmp_path / "r.jsonl"
    rec.write_text(f"{_line(output_tokens=1, ttft_s=0.1, latency_s=0.1)}\n")
    res = CliRunner().invoke(
        sim, ["validate", str(rec), "--cluster", str(tmp_path / "cluster.yaml")]
    )
    assert res.exit_code == 0, res.output
    assert "nan" not in res.output
    assert "tpot n/a (no request has a measured tpot above 0 and a simulated one)" in res.output
