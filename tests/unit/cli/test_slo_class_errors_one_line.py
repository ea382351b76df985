"""A bad `--slo-class` value is one line naming the key and the value, not pydantic's block.

Before: `--slo-class x:ttftMs=abc` printed "1 validation error for SloClassSpec", the key on a
line of its own, "[type=float_parsing, input_value='abc', input_type=str]" and "For further
information visit https://errors.pydantic.dev/...".
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from splitserve.cli import router as cli_router


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("x:ttftMs=abc,tpotMs=50", "ttftMs='abc': Input should be a valid number"),
        ("x:ttftMs=500,tpotMs=50,bogus=1", "bogus: Extra inputs are not permitted"),
        ("x:ttftMs=500,tpotMs=50,percentile=2", "percentile='2': Input should be less than"),
    ],
)
def test_a_bad_slo_class_is_one_line(
    value: str, says: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    served: list[object] = []
    monkeypatch.setattr(cli_router, "_serve", lambda config, *_: served.append(config))
    args = ["serve", "--tokenizer", str(tmp_path), "--slo-class", value]
    r = CliRunner().invoke(cli_router.router, args)
    assert r.exit_code == 2, r.output
    assert "--slo-class" in r.output
    assert says in r.output, r.output
    assert "errors.pydantic.dev" not in r.output
    assert len([ln for ln in r.output.splitlines() if ln]) == 3, r.output  # Usage, Try, Error
    assert served == []
