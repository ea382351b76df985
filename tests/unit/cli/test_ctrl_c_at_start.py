"""Ctrl-C while the `splitserve` command imports its modules (seconds on a cold start) exits
130 quietly, as a shell does for SIGINT, instead of printing the import's traceback.

Before the fix the console script imported every command's module at the top of
`splitserve.cli.main`, outside anything that could catch the interrupt.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from splitserve.cli import main as entry


def test_an_interrupt_during_the_imports_exits_130_quietly(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def interrupted(name: str) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(entry, "import_module", interrupted)
    with pytest.raises(SystemExit) as caught:
        entry.main()
    assert caught.value.code == 130
    out, err = capsys.readouterr()
    assert out == ""
    assert "Traceback" not in err
    assert "KeyboardInterrupt" not in err


def test_the_entry_point_imports_no_command_before_main_runs() -> None:
    # The interrupt can only be caught inside `main()`: the module the console script imports
    # first must not import the commands (and with them transformers, grpc, kopf, ...).
    probe = (
        "import sys, splitserve.cli.main; "
        "print(sorted(m for m in sys.modules if m.startswith('splitserve.')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], check=True, capture_output=True, text=True
    ).stdout
    assert out.strip() == "['splitserve.cli', 'splitserve.cli.main']"


def test_cli_is_still_importable_from_main() -> None:
    from splitserve.cli.main import cli

    assert cli.name == "cli"
