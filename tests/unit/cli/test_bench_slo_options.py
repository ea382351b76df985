"""`make bench-slo`'s options (`BENCH_SLO_ARGS`): a bad value is a one-line usage error before
any stack starts, `--help` leaves nothing behind, and a run in which no interactive request
arrived is not taken for the knee. No stack is started here (`run` is replaced)."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

import httpx
import pytest

from splitserve.cli import bench_slo


def _no_run(slo: bool, rate: float, args: argparse.Namespace, tag: str) -> dict[str, Any]:
    raise AssertionError(f"a stack was started ({tag})")


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--rates", "abc"], "--rates"),  # a traceback (ValueError)
        (["--rates", "1,,2"], "--rates"),
        (["--rates", "0"], "--rates"),  # a ZeroDivisionError
        (["--rates", "-1"], "--rates"),  # drew arrivals forever (time ran backwards)
        (["--rates", "nan"], "--rates"),
        (["--duration", "0"], "--duration"),  # ran every stack with no arrival
        (["--duration", "-1"], "--duration"),
        (["--time-scale", "0"], "--time-scale"),
        (["--time-scale", "inf"], "--time-scale"),
    ],
)
def test_bad_values_are_usage_errors_naming_the_flag(
    argv: list[str],
    flag: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    monkeypatch.setattr(bench_slo, "run", _no_run)
    with pytest.raises(SystemExit) as exit_:
        bench_slo.main([*argv, "--work", str(tmp_path), "--out", str(tmp_path / "o.json")])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert f"error: argument {flag}" in err[-1]  # the usage, then one line naming the flag
    assert not any("Traceback" in line for line in err)


def test_help_leaves_no_temporary_directory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # --work's default was made while the parser was built: every run, --help included, left
    # an empty bench-slo-* directory in /tmp, and a run given --work left one too
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with pytest.raises(SystemExit):
        bench_slo.main(["--help"])
    assert list(tmp_path.iterdir()) == []


def test_a_run_without_interactive_arrivals_is_not_the_knee(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # it read 0 % attainment: "drops below 90 % at 1 req/s" with nothing measured
    def empty(slo: bool, rate: float, args: argparse.Namespace, tag: str) -> dict[str, Any]:
        return {"router": "wave-1", "rate_rps": rate, "classes": bench_slo.summarize([], 1.0)}

    monkeypatch.setattr(bench_slo, "run", empty)
    out = tmp_path / "o.json"
    with pytest.raises(SystemExit, match="no interactive request arrived at 1 req/s"):
        bench_slo.main(
            ["--rates", "1", "--duration", "1", "--work", str(tmp_path), "--out", str(out)]
        )
    assert not out.exists()
    assert "drops below" not in capsys.readouterr().out


def test_summarize_leaves_attainment_open_when_nothing_arrived() -> None:
    outs = [bench_slo.Outcome("batch", 429)]
    table = bench_slo.summarize(outs, 10.0)
    assert table["interactive"]["arrived"] == 0
    assert table["interactive"]["attainment"] is None
    assert table["batch"]["attainment"] == 0.0
    assert table["batch"]["shed_fraction"] == 1.0


def test_the_report_says_where_the_outcomes_are(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # docs/benchmarks.md: "each request's outcome in the run directory", a temporary directory
    # by default that the run printed nowhere
    def knee_at_once(slo: bool, rate: float, args: argparse.Namespace, tag: str) -> dict[str, Any]:
        outs = [bench_slo.Outcome("interactive", 200, ttft_s=9.0)]
        return {"router": "slo" if slo else "wave-1", "rate_rps": rate,
                "classes": bench_slo.summarize(outs, 1.0)}  # fmt: skip

    monkeypatch.setattr(bench_slo, "run", knee_at_once)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    bench_slo.main(["--rates", "1", "--out", str(tmp_path / "o.json")])
    (work,) = tmp_path.glob("bench-slo-*")
    out = capsys.readouterr().out
    assert f"{work}/*/outcomes.json" in out


async def test_a_stream_that_ends_in_an_error_event_is_a_failure() -> None:
    # the router answers a failure after the first token with an error event (the status line
    # is sent): the bench skipped it (no "choices"), so the request met its SLO on its TTFT
    body = (
        b'data: {"choices": [{"index": 0, "text": "a"}]}\n\n'
        b'data: {"error": {"message": "no decode worker could finish", "type": "x"}}\n\n'
        b"data: [DONE]\n\n"
    )

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})

    arrival = bench_slo.Arrival(0.0, "interactive", 4, 8)
    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
        outcome = await bench_slo.one(client, "http://router/v1", arrival, slo=True)
    assert outcome.status == bench_slo.FAILED
    assert not outcome.met()
    assert bench_slo.summarize([outcome], 1.0)["interactive"]["errors"] == 1


async def test_a_request_still_running_after_the_grace_is_cut_and_counted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A run is bounded: a stream that stalls is cut `grace_s` after the last arrival and
    counted as unfinished (an error), not waited for up to httpx's 300 s read timeout."""
    import asyncio
    import time

    async def fake_one(
        client: httpx.AsyncClient, base: str, a: bench_slo.Arrival, slo: bool
    ) -> bench_slo.Outcome:
        if a.slo_class == "interactive":
            await asyncio.sleep(3600)  # a stalled stream
        return bench_slo.Outcome(a.slo_class, 200, 0.01, 0.01, a.max_tokens)

    monkeypatch.setattr(bench_slo, "one", fake_one)
    seq = [
        bench_slo.Arrival(0.0, "interactive", 16, 4),
        bench_slo.Arrival(0.01, "batch", 16, 4),
    ]
    t0 = time.monotonic()
    outs = await bench_slo.drive("http://127.0.0.1:1", seq, True, grace_s=0.2)
    assert time.monotonic() - t0 < 30
    assert [(o.slo_class, o.status) for o in outs] == [
        ("interactive", bench_slo.UNFINISHED),
        ("batch", 200),
    ]
    table = bench_slo.summarize(outs, 1.0)
    assert table["interactive"]["errors"] == 1
    assert table["interactive"]["attainment"] == 0.0


@pytest.mark.parametrize("value", ["0", "-1", "nan"])
def test_a_bad_grace_is_refused(
    value: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(bench_slo, "run", _no_run)
    with pytest.raises(SystemExit) as err:
        bench_slo.main(["--grace", value, "--work", tempfile.mkdtemp()])
    assert err.value.code == 2
    assert "--grace" in capsys.readouterr().err
