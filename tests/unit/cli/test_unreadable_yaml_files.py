"""`router serve`'s YAML files (`--config`, `--api-key-file`, `--slo-config`, the last shared with
`splitserve up`): one that is not YAML, or not UTF-8 text, is a usage error naming the flag and
the file (before: yaml's ScannerError / ParserError or a UnicodeDecodeError traceback; a
non-UTF-8 file was the codec's message without the file's name)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from splitserve.cli import router as cli_router


@pytest.mark.parametrize(
    ("flag", "content", "says", "names_the_file"),
    [
        ("--config", b"model: [\n", "not YAML (line 2)", True),
        ("--config", b"\xff\xfe\x00", "not UTF-8", True),
        ("--api-key-file", b"tenants: [\n", "not YAML (line 2)", True),
        ("--api-key-file", b"\xff\xfe\x00", "not UTF-8", True),
        ("--slo-config", b"sloClasses: [\n", "not YAML (line 2)", False),
        ("--slo-config", b"a: b: c\n", "not YAML (line 1)", False),
        ("--slo-config", b"\xff\xfe\x00", "not UTF-8", False),
    ],
)
def test_an_unreadable_yaml_file_is_a_usage_error_naming_the_flag(
    flag: str,
    content: bytes,
    says: str,
    names_the_file: bool,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    served: list[object] = []
    monkeypatch.setattr(cli_router, "_serve", lambda config, *_: served.append(config))
    path = tmp_path / "file.yaml"
    path.write_bytes(content)
    args = ["serve", "--tokenizer", str(tmp_path), flag, str(path)]
    r = CliRunner().invoke(cli_router.router, args)
    assert r.exit_code == 2, r.output
    assert flag in r.output
    assert (f"{path}: {says}" if names_the_file else says) in r.output, r.output
    assert served == []
