"""The `splitserve` console script's entry point.

It imports nothing heavy itself: the command group (`cli.commands`) pulls in transformers, grpc,
kopf and the rest, seconds on a cold start, and a Ctrl-C meanwhile exits 130 quietly (the shell's
code for SIGINT) instead of printing the import's traceback.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from splitserve.cli.commands import cli as cli


def main() -> None:
    try:
        commands = import_module("splitserve.cli.commands")
    except KeyboardInterrupt:
        raise SystemExit(130) from None
    commands.cli(prog_name="splitserve")


def __getattr__(name: str) -> Any:
    """`splitserve.cli.main.cli`, imported when asked for (tests)."""
    if name == "cli":
        return import_module("splitserve.cli.commands").cli
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
