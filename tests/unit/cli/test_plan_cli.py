"""`splitserve plan` refuses a --name Kubernetes would refuse and a --trace it cannot read,
naming the flag.

Before: `--name Bad_Name!` printed an LLMService that `kubectl apply` refuses, and a CSV without
the Azure header died in a traceback (`ValueError: not an Azure LLM trace header`).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from splitserve.cli.plan import plan


@pytest.mark.parametrize("name", ["Bad_Name!", "", "9lives", "a" * 64, "x-"])
def test_a_name_kubernetes_refuses_is_refused(name: str) -> None:
    r = CliRunner().invoke(plan, ["--rate", "2", "--requests", "20", "--tp", "1", "--name", name])
    assert r.exit_code == 2, r.output
    assert "--name" in r.output


def test_a_trace_without_the_azure_header_is_refused(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("x,y\n1,2\n")
    r = CliRunner().invoke(plan, ["--trace", str(trace), "--requests", "20", "--tp", "1"])
    assert r.exit_code == 2, r.output
    assert "--trace" in r.output
    assert "Azure" in r.output


def test_a_trace_of_zero_length_rows_is_refused(tmp_path: Path) -> None:
    # was a ValueError traceback ('the workload has no requests') from the search
    trace = tmp_path / "t.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,0,5\n")
    r = CliRunner().invoke(plan, ["--trace", str(trace), "--tp", "1"])
    assert r.exit_code == 2, r.output
    assert "--trace" in r.output
    assert "no requests" in r.output


@pytest.mark.parametrize(
    "flag", [["--prompt-median", "50"], ["--output-median", "9"], ["--sigma", "0"], ["--seed", "3"]]
)
def test_synthetic_length_flags_with_a_trace_are_refused(tmp_path: Path, flag: list[str]) -> None:
    # the trace's own lengths were used and the flag ignored without a word
    trace = tmp_path / "t.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,10,5\n")
    r = CliRunner().invoke(plan, ["--trace", str(trace), "--tp", "1", *flag])
    assert r.exit_code == 2, r.output
    assert flag[0] in r.output
    assert "--trace" in r.output


@pytest.mark.parametrize("flag", ["--percentile", "--attainment"])
def test_a_fraction_out_of_range_names_its_own_flag(flag: str) -> None:
    r = CliRunner().invoke(plan, ["--rate", "2", "--tp", "1", flag, "1.5"])
    assert r.exit_code == 2, r.output
    assert f"Invalid value for '{flag}'" in r.output or f"Invalid value for {flag}" in r.output
    other = "--attainment" if flag == "--percentile" else "--percentile"
    assert other not in r.output


@pytest.mark.parametrize("rate", [[], ["--rate", "2"]])
def test_a_trace_whose_requests_all_arrive_at_once_is_refused(
    tmp_path: Path, rate: list[str]
) -> None:
    # one request (or all at one instant) is no arrival rate: the search took the span as 1 ns,
    # sized pools for 10^9 req/s and built them for ever (--rate cannot rescale it either)
    trace = tmp_path / "t.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,10,5\n")
    r = CliRunner().invoke(plan, ["--trace", str(trace), "--tp", "1", *rate])
    assert r.exit_code == 2, r.output
    assert "--trace" in r.output
    assert "at once" in r.output


def test_one_request_is_refused_naming_requests() -> None:
    # one arrival has no rate: a ValueError traceback from the search (before that, a hang)
    r = CliRunner().invoke(plan, ["--rate", "2", "--requests", "1", "--tp", "1"])
    assert r.exit_code == 2, r.output
    assert "--requests" in r.output


@pytest.mark.parametrize(
    ("tps", "bad"),
    [("1,0", "'0'"), ("1,-2", "'-2'"), ("0", "'0'"), ("a,1", "'a'"), ("1,2.5", "'2.5'")],
)
def test_a_bad_tp_degree_is_named(tps: str, bad: str) -> None:
    # "1,0" used to say "at least one degree >= 1" although 1 is there: name the bad entry
    r = CliRunner().invoke(plan, ["--rate", "2", "--requests", "20", "--tp", tps])
    assert r.exit_code == 2, r.output
    assert "--tp" in r.output
    assert bad in r.output
    assert "integer >= 1" in r.output
    assert "Traceback" not in r.output


@pytest.mark.parametrize("tps", ["", ",", " , "])
def test_an_empty_tp_list_is_refused(tps: str) -> None:
    r = CliRunner().invoke(plan, ["--rate", "2", "--requests", "20", "--tp", tps])
    assert r.exit_code == 2, r.output
    assert "--tp" in r.output
    assert "no TP degree" in r.output


@pytest.mark.parametrize("rate", ["1e308", "1.7e308"])
def test_a_rate_whose_work_overflows_is_no_candidate_not_a_traceback(rate: str) -> None:
    # Before: OverflowError 'cannot convert float infinity to integer' from the pool sizing
    # (1e300 already said 'no candidate met the attainment target').
    r = CliRunner().invoke(plan, ["--rate", rate, "--requests", "10", "--tp", "1"])
    assert r.exit_code == 1, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    assert "not met by 64 workers (--max-workers)" in r.output
    assert "no candidate met the attainment target" in r.output
    assert "TP 1: its load is too large to size" in r.output


@pytest.mark.parametrize("n", ["20001", "1000000000"])
def test_a_request_count_over_the_limit_is_refused_naming_the_flag_and_limit(
    n: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # --requests 1000000000 was simulated without a bound (about 5 ms per request per TP
    # degree per search step: years); refused before any workload is built or searched
    def started(*_: object, **__: object) -> None:
        raise AssertionError("the workload was built: no limit on --requests")

    monkeypatch.setattr("splitserve.sim.workload.synthetic", started)
    r = CliRunner().invoke(plan, ["--rate", "2", "--requests", n, "--tp", "1"])
    assert r.exit_code == 2, r.output
    assert "--requests" in r.output
    assert "20000" in r.output


def test_a_negative_seed_is_refused_naming_the_flag() -> None:
    # was numpy's 'ValueError: expected non-negative integer' traceback (exit 1)
    r = CliRunner().invoke(plan, ["--rate", "2", "--requests", "20", "--tp", "1", "--seed", "-1"])
    assert r.exit_code == 2, r.output
    assert "--seed" in r.output
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception


def test_requests_no_worker_can_hold_are_named() -> None:
    # Before: only 'no candidate met the attainment target', as for a load too high
    r = CliRunner().invoke(
        plan, ["--rate", "2", "--requests", "20", "--tp", "1,2", "--prompt-median", "3000000"]
    )
    assert r.exit_code == 1, r.output
    assert "the longest request needs KV for 1,049,224 tokens" in r.output
    assert "largest TP searched (2 on a100-80g) holds 144,000" in r.output


def test_a_plan_cut_by_the_worker_limit_names_the_limit_and_its_flag() -> None:
    # was "target not met up to the limit" and "no candidate met the attainment target", as if
    # the SLO could not be met, when a hidden 64-worker cap was the cause
    r = CliRunner().invoke(
        plan, ["--rate", "300", "--requests", "40", "--tp", "1", "--max-workers", "4"]
    )
    assert r.exit_code == 1, r.output
    assert "not met by 4 workers (--max-workers)" in r.output
    assert "with at most 4 workers (--max-workers): TP 1 missed it at P" in r.output
    assert "raise --max-workers" in r.output


def test_max_workers_is_a_documented_flag() -> None:
    r = CliRunner().invoke(plan, ["--help"])
    assert "--max-workers" in r.output
    assert "default: 64" in r.output
    r = CliRunner().invoke(plan, ["--rate", "2", "--max-workers", "1"])
    assert r.exit_code == 2, r.output
    assert "--max-workers" in r.output


@pytest.mark.parametrize(
    ("source", "says"),
    [
        ("../../etc", "is not hf://"),  # printed; `operator render` refused the service
        ("has space", "is not hf://"),
        ("", "empty"),  # silently became the preset's name, without the usual warning
        ("   ", "empty"),
        ("x" * 1025, "at most 1024"),
    ],
)
def test_a_source_llmservice_refuses_is_refused_naming_the_flag(
    source: str, says: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def searched(*_: object, **__: object) -> None:
        raise AssertionError("the search ran")

    monkeypatch.setattr("splitserve.sim.plan.plan", searched)
    r = CliRunner().invoke(plan, ["--rate", "2", "--requests", "20", "--source", source])
    assert r.exit_code == 2, r.output
    assert "--source" in r.output
    assert says in r.output


@pytest.mark.parametrize("source", ["meta-llama/Llama-2-13b-hf@main", "/models/llama", "pvc://c/d"])
def test_a_source_llmservice_takes_is_printed(source: str) -> None:
    r = CliRunner().invoke(
        plan, ["--rate", "2", "--requests", "20", "--tp", "1", "--source", source]
    )
    assert r.exit_code == 0, r.output
    assert f"source: {source}" in r.output


@pytest.mark.parametrize(
    "text",
    ["TIMESTAMP,ContextTokens,GeneratedTokens\n", "TIMESTAMP,ContextTokens,GeneratedTokens\n\n"],
)
def test_a_trace_with_no_rows_says_so(tmp_path: Path, text: str) -> None:
    # said "every row has a zero length" of a file with no row
    trace = tmp_path / "t.csv"
    trace.write_text(text)
    r = CliRunner().invoke(plan, ["--trace", str(trace)])
    assert r.exit_code == 2, r.output
    assert "--trace" in r.output
    assert "the trace has no rows, only its header" in r.output
    assert "zero length" not in r.output
