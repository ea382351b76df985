"""`splitserve profile` whose probes cannot fit the limits is a usage error naming the flags
that shaped them, before any connection to the worker.

Before: it connected, printed 'profiling sim worker ...', then exit 1 'nothing to measure
within the limits: 1 prefill and 0 decode cells (check --max-batch-tokens / --max-model-len)',
also when the flag at fault was --prefill-tokens, --prefill-batch or --decode-tokens.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from splitserve.cli import profile as cli_profile

SMALL = ["--prefill-tokens", "64", "--prefill-batch", "1", "--decode-batch", "1"]


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["--prefill-tokens", "99999999"], ["prefill", "--prefill-tokens", "--max-batch-tokens"]),
        (["--prefill-batch", "100"], ["prefill", "--prefill-batch", "--max-num-seqs"]),
        (["--decode-tokens", "99999999"], ["decode", "--decode-tokens", "--max-model-len"]),
        (["--decode-batch", "100"], ["decode", "--decode-batch", "--max-num-seqs"]),
        (["--max-model-len", "10"], ["prefill", "decode", "--max-model-len"]),
    ],
)
def test_a_grid_with_no_probe_that_fits_is_refused_naming_the_flags(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], names: list[str]
) -> None:
    async def connected(*_: object, **__: object) -> None:
        raise AssertionError("the worker was contacted")

    monkeypatch.setattr(cli_profile, "profile_worker", connected)
    argv = ["--worker", "127.0.0.1:1", "--out", str(tmp_path / "p"), "--decode-context", "64"]
    r = CliRunner().invoke(cli_profile.profile, [*argv, *SMALL, *args])
    assert r.exit_code == 2, r.output
    for name in names:
        assert name in r.output, r.output


@pytest.mark.parametrize("value", ["128,,512", "128,", ",128", "128, ,512"])
def test_an_empty_item_in_a_size_list_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    """`--prefill-tokens 128,,512` (a value lost in a script) was profiled as 128,512."""

    async def connected(*_: object, **__: object) -> None:
        raise AssertionError("the worker was contacted")

    monkeypatch.setattr(cli_profile, "profile_worker", connected)
    argv = ["--worker", "127.0.0.1:1", "--out", str(tmp_path / "p"), "--prefill-tokens", value]
    r = CliRunner().invoke(cli_profile.profile, argv)
    assert r.exit_code == 2, r.output
    assert "--prefill-tokens" in r.output
    assert "empty" in r.output
