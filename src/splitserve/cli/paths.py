"""`--out DIR` options: a directory that is made when the command writes, checked at parse.

`click.Path(file_okay=False)` refuses an existing file only; a path under a file (`FILE/sub`)
passed, the command did its work (a whole simulation, a profile of a live worker) and then died
at `mkdir` in a NotADirectoryError traceback. `OutDir` walks up to the nearest part that exists
and refuses the value naming the flag unless that is a directory this process may write in.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import click


class OutDir(click.Path):
    """A directory to write into (made with its parents when missing)."""

    def __init__(self) -> None:
        super().__init__(file_okay=False, path_type=Path)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        path = super().convert(value, param, ctx)
        existing = Path(os.fsdecode(path)).absolute()
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        if not existing.is_dir():
            self.fail(f"{str(value)!r}: {str(existing)!r} is not a directory.", param, ctx)
        if not os.access(existing, os.W_OK | os.X_OK):
            self.fail(f"{str(value)!r}: {str(existing)!r} is not writable.", param, ctx)
        return path
