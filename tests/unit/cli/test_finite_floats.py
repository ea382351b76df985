"""Every float option of every `splitserve` command refuses nan and inf naming itself.

Before: click's FloatRange lets both through its bounds (nan compares false with any bound, inf is
above every lower one): `sim autoscale --cold-start inf` printed 'nan (nan cold starts)',
`--burst-weight nan` died in a ValueError traceback, `plan --rate inf` in another.
"""

from __future__ import annotations

from collections.abc import Iterator

import click
import pytest
from click.testing import CliRunner

from splitserve.cli.main import cli


def _float_options(group: click.Group, ctx: click.Context) -> Iterator[tuple[str, click.Option]]:
    for name, command in sorted(group.commands.items()):
        sub = click.Context(command, parent=ctx, info_name=name)
        if isinstance(command, click.Group):
            yield from _float_options(command, sub)
            continue
        for param in command.params:
            if isinstance(param, click.Option) and isinstance(
                param.type, click.types.FloatParamType
            ):
                yield f"{sub.command_path} {param.opts[0]}", param


OPTIONS = list(_float_options(cli, click.Context(cli, info_name="splitserve")))


def test_there_are_float_options_to_check() -> None:
    assert len(OPTIONS) > 15


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "NaN"])
@pytest.mark.parametrize(("where", "option"), OPTIONS, ids=[w for w, _ in OPTIONS])
def test_a_non_finite_value_is_refused(where: str, option: click.Option, value: str) -> None:
    with pytest.raises(click.BadParameter, match=r"finite|range"):  # -inf: below the bound
        option.type.convert(value, option, None)


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (
            ["sim", "autoscale", "--quick", "--scenario", "step-5x", "--cold-start", "inf"],
            "--cold-start",
        ),
        (
            ["sim", "autoscale", "--quick", "--scenario", "step-5x", "--burst-weight", "nan"],
            "--burst-weight",
        ),
        (["plan", "--rate", "inf", "--requests", "20", "--tp", "1"], "--rate"),
    ],
)
def test_the_command_says_which_flag(argv: list[str], flag: str) -> None:
    res = CliRunner().invoke(cli, argv)
    assert res.exit_code == 2, res.output
    assert flag in res.output
    assert "finite" in res.output
