"""Option types: floats that refuse nan and inf (`FiniteFloat`), names that refuse blank
values (`NonBlank`).

click's `FloatRange` lets nan and inf through its bounds (nan compares false with every bound,
inf is above every lower one), and `float` takes them as it takes any number; no flag of
`splitserve` means anything by them, so every float option uses `FiniteFloat` and a bad value is
a usage error naming the flag (exit 2) instead of a traceback or a table of nan deep inside a
run.
"""

from __future__ import annotations

import math
from typing import Any

import click


class FiniteFloat(click.FloatRange):
    """`click.FloatRange` (bounds optional) that also refuses nan, inf and -inf."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = click.FLOAT.convert(value, param, ctx)
        if not math.isfinite(number):  # before the range: "inf is not finite", not "above max"
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return super().convert(number, param, ctx)


class NonBlank(click.types.StringParamType):
    """A string option that must hold more than white space (a model name: an empty one made
    `up` start its workers and then fail in the router's child, naming no flag)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        text = super().convert(value, param, ctx)
        if not text.strip():
            self.fail(f"{text!r} is empty.", param, ctx)
        return text
