"""`splitserve plan` searches only TP degrees vLLM would start: an explicit `--tp` the model's
heads refuse is refused naming the flag; an impossible default degree is skipped and said.

Before: `--tp 3` on llama-2-13b (40 heads) printed a TP-3 service, and the `tiny` preset (4
heads) was planned at the default list's TP 8 (the fit check was memory only)."""

from __future__ import annotations

from click.testing import CliRunner

from splitserve.cli.plan import plan
from splitserve.sim.plan import fits


def test_explicit_tp_the_heads_refuse_is_refused() -> None:
    r = CliRunner().invoke(plan, ["--rate", "2", "--requests", "20", "--tp", "3"])
    assert r.exit_code == 2, r.output
    assert "--tp" in r.output
    assert "40 attention heads" in r.output
    assert "tensorParallel" not in r.output


def test_explicit_list_with_one_impossible_degree_is_refused() -> None:
    r = CliRunner().invoke(
        plan, ["--model", "tiny", "--rate", "2", "--requests", "20", "--tp", "1,8"]
    )
    assert r.exit_code == 2, r.output
    assert "--tp" in r.output
    assert "TP 8" in r.output


def test_default_list_skips_the_impossible_degree_and_says_so() -> None:
    r = CliRunner().invoke(plan, ["--model", "tiny", "--rate", "2", "--requests", "20"])
    assert r.exit_code == 0, r.output
    assert "skipped default TP 8" in r.output
    rows = [line for line in r.output.splitlines() if line.startswith("| ") and "/" in line]
    assert rows
    assert not any(line.startswith("| 8 /") for line in rows)
    assert "tensorParallel: 8" not in r.output


def test_fits_is_false_for_a_degree_the_heads_refuse() -> None:
    assert fits("llama-2-13b", "a100-80g", 2)
    assert not fits("llama-2-13b", "a100-80g", 3)
    assert not fits("tiny", "a100-80g", 8)


def test_a_degree_that_does_not_fit_in_memory_is_said_not_dropped() -> None:
    # --tp 1,4 on llama-2-70b printed only the 4 / 4 row: TP 1 vanished without a word
    r = CliRunner().invoke(
        plan, ["--model", "llama-2-70b", "--tp", "1,4", "--rate", "1", "--requests", "20"]
    )
    assert r.exit_code == 0, r.output
    assert "# skipped TP 1: llama-2-70b's weights (138 GB) leave no KV room in 90 % of " in r.output
    assert "| 4 / 4 |" in r.output


def test_an_empty_degree_in_the_list_is_refused() -> None:
    """`--tp 1,,4` (a degree lost in a script) was planned as 1,4."""
    r = CliRunner().invoke(
        plan, ["--model", "tiny", "--rate", "2", "--requests", "20", "--tp", "1,,4"]
    )
    assert r.exit_code == 2, r.output
    assert "--tp" in r.output
    assert "empty" in r.output
