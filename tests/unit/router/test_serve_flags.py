"""`splitserve router serve` refuses a bad `--tokenizer` with a usage error naming the flag (it
was a transformers traceback from deep inside the router's start-up)."""

from __future__ import annotations

from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from splitserve.cli.main import cli
from splitserve.cli.router import _check_tokenizer_dir


def _serve(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["router", "serve", "--worker", "127.0.0.1:1", *args])
    return result.exit_code, result.output


def test_a_missing_tokenizer_directory_is_a_usage_error(tmp_path: Path) -> None:
    code, out = _serve("--tokenizer", str(tmp_path / "nonexistent"))
    assert code == 2
    assert "--tokenizer" in out
    assert "does not exist" in out
    assert "Traceback" not in out


def test_a_file_is_no_tokenizer_directory(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    code, out = _serve("--tokenizer", str(tmp_path / "f"))
    assert (code, "is not a directory" in out, "--tokenizer" in out) == (2, True, True)


def test_a_hub_id_is_left_to_the_loader(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for value in ("gpt2", "org/name"):
        _check_tokenizer_dir(Path(value))  # not refused here
    for value in ("../tok", "a/b/c", "/abs/tok"):
        with pytest.raises(click.BadParameter, match="does not exist"):
            _check_tokenizer_dir(Path(value))


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--edge", "idle_timeout_s=inf"),  # was an OverflowError at start (uvicorn rounds it)
        ("--edge", "body_timeout_s=nan"),
    ],
)
def test_non_finite_settings_are_refused_by_name(flag: str, value: str) -> None:
    code, output = _serve(flag, value)
    assert code == 2, output
    assert f"Invalid value for {flag}" in output
    assert value.split("=")[0] in output
    assert "finite" in output


@pytest.mark.parametrize(
    "args",
    [
        ("--port", "19900", "--grpc-port", "19900"),
        ("--port", "19900", "--metrics-port", "19900"),
        ("--port", "19901", "--grpc-port", "19902", "--metrics-port", "19902"),
    ],
)
def test_one_port_for_two_listeners_is_refused(args: tuple[str, ...]) -> None:
    """It started, then failed with "address already in use" on the second listener."""
    code, output = _serve(*args)
    assert code == 2, output
    assert "one port each" in output


def test_slo_problems_in_router_yaml_name_the_file(tmp_path: Path) -> None:
    """They were pydantic's block ("1 validation error for SloSettings ... For further
    information visit ..."), naming neither the file nor --config."""
    path = tmp_path / "router.yaml"
    path.write_text(
        'model: {name: m, source: "hf://x/y"}\nengine: {kind: sim}\n'
        "sloClasses: [{name: a, ttftMs: 100, tpotMs: 10}]\ndefaultSloClass: b\n"
    )
    code, output = _serve("--config", str(path))
    assert code == 2, output
    assert f"Invalid value for --config: {path}" in output
    assert "default SLO class 'b' is not one of ['a']" in output
    assert "errors.pydantic.dev" not in output
