"""docs/reproductions/latency-models.md prints ours in the paper's unit, as `sim reproduce` does
(`Comparison.ours_text`): in a row whose paper figure carries a % or ×, every number in our
columns carries one too (before: 0.994 beside the paper's "0.97 (−97%)", 1.84 beside "2.1×")."""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).parents[3] / "docs" / "reproductions" / "latency-models.md"
NUMBER = re.compile(r"[−+-]?\d+(?:\.\d+)?(?!\d)(?!\.\d)(?! ?[%×])")


def tables(text: str) -> list[tuple[list[str], list[list[str]]]]:
    """Each `| comparison | paper | ...` table: its header and rows, as cells."""
    out: list[tuple[list[str], list[list[str]]]] = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if not line.startswith("| comparison | paper |"):
            continue
        header = [c.strip() for c in line.strip("|").split("|")]
        rows = []
        for row in lines[i + 2 :]:
            if not row.startswith("|"):
                break
            rows.append([c.strip() for c in row.strip("|").split("|")])
        out.append((header, rows))
    return out


def test_ours_carries_the_papers_unit() -> None:
    found = tables(DOC.read_text())
    assert len(found) >= 7  # full-run TetriInfer, DistServe, TetriInfer, AccelGen, 2 BROS, ALISE
    bare = []
    checked = 0
    for header, rows in found:
        ours = [j for j, h in enumerate(header) if j > 1 and "within" not in h]
        for row in rows:
            if not re.search(r"[%×]", row[1]):
                continue  # the paper's figure is a plain number (req/s)
            for j in ours:
                checked += 1
                if NUMBER.search(row[j]):
                    bare.append(f"{row[0]} | {header[j]}: {row[j]}")
    assert checked > 100
    assert bare == []
