"""How a bench worker process tells its parent it is serving: a JSON ready file, written whole."""

from __future__ import annotations

import json
import os
from pathlib import Path


def announce(ready_file: Path, address: str) -> None:
    """Write {"address", "pid"} to `ready_file` atomically (a temporary file, then a rename), so
    the parent never reads a half-written file."""
    tmp = ready_file.with_suffix(".tmp")
    tmp.write_text(json.dumps({"address": address, "pid": os.getpid()}))
    tmp.replace(ready_file)
