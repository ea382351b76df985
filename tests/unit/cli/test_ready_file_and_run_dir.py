"""`--ready-file` in a directory that does not exist (worker serve, router serve) and an `up
--run-dir` that cannot be made are refused naming the flag before anything starts.

Before: the ready file was written once the ports were bound, and a missing directory died in a
`FileNotFoundError` traceback; `up --run-dir /proc/nope` likewise at `mkdir`.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from splitserve.cli.main import cli


@pytest.mark.parametrize("command", [["worker", "serve"], ["router", "serve", "--port", "0"]])
def test_a_ready_file_in_a_missing_directory_is_refused(command: list[str], tmp_path: Path) -> None:
    r = CliRunner().invoke(cli, [*command, "--ready-file", str(tmp_path / "no" / "r.json")])
    assert r.exit_code == 2, r.output
    assert "--ready-file" in r.output


def test_a_run_dir_that_cannot_be_made_is_refused(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    r = CliRunner().invoke(cli, ["up", "--run-dir", str(blocker / "sub")])
    assert r.exit_code == 2, r.output
    assert "--run-dir" in r.output
