"""A reproduction's table prints the paper's number and ours in one unit.

Before: `sim reproduce bros` printed the paper's "65.49%" beside our "0.969" in one row (a
fraction against a percentage); other papers' rows mixed "2.1×" with "1.25", "−40%" with
"0.38" the same way."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from splitserve.sim import reproductions
from splitserve.sim.reproductions.common import Comparison, Reproduction


def _cmp(text: str, ours: float, unit: str) -> Comparison:
    return Comparison("x", 0.5, ours, text, 0.5, 0.5, unit)


@pytest.mark.parametrize(
    ("text", "ours", "unit", "shown"),
    [
        ("65.49%", 0.969, "%", "96.9 %"),
        ("1.28%", 0.0797, "%", "7.97 %"),
        ("0.7420 (−74.20%)", 0.689, "−%", "−68.9 %"),
        ("0.7420 (−74.20%)", -2.31, "−%", "+231 %"),
        ("0.7420 (−74.20%)", 0.0, "−%", "0 %"),
        ("16–34 (%)", 25.3, "pct", "25.3 %"),
        ("1.73×", 0.467, "×", "0.467×"),
        ("0.75 (−25 % power)", 0.8, "num", "0.8"),
        ("1.6 req/s", 1.44, "", "1.44"),
        ("65.49%", float("nan"), "%", "-"),
    ],
)
def test_ours_is_printed_in_the_papers_unit(text: str, ours: float, unit: str, shown: str) -> None:
    assert _cmp(text, ours, unit).ours_text == shown


def test_the_bros_row_reads_in_percent() -> None:
    row = Comparison("ShareGPT: BROS TPOT attainment", 0.6549, 0.969, "65.49%", 0.6549, 0.6549, "%")
    table = Reproduction("BROS", (row,), {}).markdown()
    assert "| ShareGPT: BROS TPOT attainment | 65.49% | 96.9 % | no |" in table
    assert "0.969" not in table


@pytest.mark.parametrize("text", ["65.49%", "2.1× (3.3 vs 1.6)", "< 4 %"])
def test_a_paper_text_with_a_unit_needs_one_for_ours(text: str) -> None:
    with pytest.raises(ValueError, match="unit"):
        Comparison("x", 1.0, 1.0, text, 1.0, 1.0)


def test_an_unknown_unit_is_refused() -> None:
    with pytest.raises(ValueError, match="unit"):
        Comparison("x", 1.0, 1.0, "1.0", 1.0, 1.0, "percent")


def _text_has_unit(node: ast.expr) -> bool:
    parts = node.values if isinstance(node, ast.JoinedStr) else [node]
    return any(
        isinstance(p, ast.Constant)
        and isinstance(p.value, str)
        and ("%" in p.value or "×" in p.value)
        for p in parts
    )


def test_every_comparison_in_the_papers_with_a_unit_in_its_text_says_ours_unit() -> None:
    """Rows only the full runs build (not the quick tests) are checked too: a literal paper text
    with % or × in a direct `Comparison(...)` call comes with the unit argument."""
    missing = []
    for path in sorted(Path(reproductions.__file__).parent.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "Comparison"
            ):
                continue
            if len(node.args) >= 4 and _text_has_unit(node.args[3]):
                has_unit = len(node.args) >= 7 or any(k.arg == "unit" for k in node.keywords)
                if not has_unit:
                    missing.append(f"{path.name}:{node.lineno}")
    assert not missing, missing
