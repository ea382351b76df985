"""`--out DIR` of sim run / reproduce / validate / autoscale, profile and dashboard render: a
path that can never be a directory (under a file) is refused naming the flag before any work.

Before: `sim run s.yaml --out FILE/sub` ran the whole scenario, then died in a
NotADirectoryError traceback at `mkdir`; `profile` did the same after measuring.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from splitserve.cli.main import cli


@pytest.mark.parametrize(
    "argv",
    [
        ["sim", "run", "{cfg}"],
        ["sim", "reproduce", "distserve", "--quick"],
        ["sim", "validate", "{cfg}", "--cluster", "{cfg}"],
        ["sim", "autoscale", "--quick", "--scenario", "step-5x", "--no-search"],
        ["profile", "--from-samples", "{cfg}"],
        ["dashboard", "render", "--prometheus", "http://127.0.0.1:1"],
    ],
)
def test_an_out_dir_under_a_file_is_refused(tmp_path: Path, argv: list[str]) -> None:
    cfg = tmp_path / "file.yaml"
    cfg.write_text("name: x\n")
    args = [a.format(cfg=cfg) for a in argv] + ["--out", str(cfg / "sub")]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 2, res.output
    assert "--out" in res.output
    assert "not a directory" in res.output
