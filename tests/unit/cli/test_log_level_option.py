"""`--log-level` is checked before anything starts, on every command that has it.

Before: `router serve`, `worker serve`, `up` and `profile` took any string and died in a
traceback from `logging.basicConfig` (`ValueError: Unknown level: 'BOGUS'`).
"""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from splitserve.cli import logs
from splitserve.cli.main import cli


@pytest.mark.parametrize("command", [["router", "serve"], ["worker", "serve"], ["up"], ["profile"]])
def test_an_unknown_level_is_refused_naming_the_flag(command: list[str]) -> None:
    r = CliRunner().invoke(cli, [*command, "--log-level", "bogus"])
    assert r.exit_code == 2, r.output
    assert "--log-level" in r.output
    assert "WARNING" in r.output


def test_a_level_in_any_case_is_taken_upper_case() -> None:
    seen: list[str] = []

    @click.command()
    @logs.log_level_option()
    def cmd(log_level: str) -> None:
        seen.append(log_level)

    assert CliRunner().invoke(cmd, ["--log-level", "debug"]).exit_code == 0
    assert CliRunner().invoke(cmd, [], env={"SPLITSERVE_LOG_LEVEL": "warning"}).exit_code == 0
    assert seen == ["DEBUG", "WARNING"]
