"""`--slo-config` with a file that is not YAML, or not UTF-8 text, is a usage error naming the
flag (before: yaml's ScannerError / ParserError or a UnicodeDecodeError traceback, from
`splitserve up` and `splitserve router serve` alike)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from splitserve.cli import router as cli_router


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b"sloClasses: [\n", "not YAML (line 2)"),
        (b"a: b: c\n", "not YAML (line 1)"),
        (b"\xff\xfe\x00", "not UTF-8"),
    ],
)
def test_an_unreadable_slo_config_is_a_usage_error_naming_the_flag(
    content: bytes, says: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    served: list[object] = []
    monkeypatch.setattr(cli_router, "_serve", lambda config, *_: served.append(config))
    cfg = tmp_path / "slo.yaml"
    cfg.write_bytes(content)
    args = ["serve", "--tokenizer", str(tmp_path), "--slo-config", str(cfg)]
    r = CliRunner().invoke(cli_router.router, args)
    assert r.exit_code == 2, r.output
    assert "--slo-config" in r.output
    assert says in r.output, r.output
    assert served == []
