"""`splitserve gen tiny-model`: a bad size is refused naming its flag, before anything is written.

Before: `--hidden-size -8` wrote config.json and the tokenizer, then died in numpy's
'negative dimensions' traceback; the other refusals said 'Invalid value: num_layers, ...' naming
no flag.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from splitserve.cli.main import cli


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--hidden-size", "-8"], "--hidden-size"),
        (["--hidden-size", "0"], "--hidden-size"),
        (["--num-layers", "0"], "--num-layers"),
        (["--num-heads", "0"], "--num-heads"),
        (["--num-heads", "3"], "--num-heads"),
        (["--num-kv-heads", "3"], "--num-kv-heads"),
        (["--num-kv-heads", "-4"], "--num-kv-heads"),
        (["--intermediate-size", "0"], "--intermediate-size"),
        (["--max-position-embeddings", "0"], "--max-position-embeddings"),
        (["--vocab-size", "10"], "--vocab-size"),
    ],
)
def test_a_bad_size_is_refused_naming_its_flag(tmp_path: Path, args: list[str], flag: str) -> None:
    dest = tmp_path / "m"
    res = CliRunner().invoke(cli, ["gen", "tiny-model", str(dest), *args])
    assert res.exit_code == 2, res.output
    assert flag in res.output
    assert not dest.exists() or not any(dest.iterdir())
