"""On / off switches of the router process read from the environment (`0` or `1`, unset: on)."""

from __future__ import annotations

import os


def env_switch(name: str, environ: dict[str, str] | None = None) -> bool:
    """The switch `name` from `environ` (default: the process environment); unset means on.

    Raises:
        ValueError: a value other than 0 or 1, naming the variable.
    """
    value = (os.environ if environ is None else environ).get(name, "1").strip()
    if value not in ("0", "1"):
        raise ValueError(f"{name} must be 0 or 1, got {value!r}")
    return value == "1"
