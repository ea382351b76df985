"""`router serve --config FILE` with a file that is not YAML, or not UTF-8 text, is a usage
error naming the flag and the file (before: yaml's ParserError or a UnicodeDecodeError
traceback)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from splitserve.cli import router as cli_router


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b"model: [\n", "not YAML (line 2)"),
        (b"\xff\xfe\x00", "not UTF-8"),
    ],
)
def test_an_unreadable_router_config_is_a_usage_error_naming_the_flag(
    content: bytes, says: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    served: list[object] = []
    monkeypatch.setattr(cli_router, "_serve", lambda config, *_: served.append(config))
    cfg = tmp_path / "router.yaml"
    cfg.write_bytes(content)
    args = ["serve", "--tokenizer", str(tmp_path), "--config", str(cfg)]
    r = CliRunner().invoke(cli_router.router, args)
    assert r.exit_code == 2, r.output
    assert "--config" in r.output
    assert f"{cfg}: {says}" in r.output, r.output
    assert served == []
