"""`splitserve router serve --config`: a bad value is one line per problem (file, key, why)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from splitserve.cli.router import serve_cmd


def test_a_bad_value_in_the_config_file_is_one_line_per_problem(tmp_path: Path) -> None:
    # was pydantic's block: "2 validation errors for RouterFile", indented lines, an URL
    path = tmp_path / "router.yaml"
    path.write_text("model:\n  name: m\n  source: x\nlisten:\n  http_port: abc\n  grpc_port: -1\n")
    r = CliRunner().invoke(serve_cmd, ["--config", str(path), "--worker", "127.0.0.1:1"])
    assert r.exit_code == 2, r.output
    assert "validation error" not in r.output
    assert "errors.pydantic.dev" not in r.output
    lines = [line for line in r.output.splitlines() if str(path) in line]
    assert any("listen.http_port" in line and "'abc'" in line for line in lines), r.output
    assert any("listen.grpc_port" in line and "-1" in line for line in lines), r.output
    assert "--config" in r.output


def test_a_bad_config_json_is_a_usage_error_not_a_traceback(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    path.write_text('{"model_name": 5}')
    r = CliRunner().invoke(serve_cmd, ["--config-json", str(path)])
    assert r.exit_code == 2, r.output
    assert "model_name" in r.output
    assert "validation error" not in r.output


def test_an_unknown_engine_kind_is_refused(tmp_path: Path) -> None:
    # Before: any string was taken (`kind: simm` ran as vllm: the tokenizer of model.source).
    path = tmp_path / "router.yaml"
    path.write_text("model: {name: m, source: x}\nengine: {kind: simm}\n")
    r = CliRunner().invoke(serve_cmd, ["--config", str(path), "--worker", "127.0.0.1:1"])
    assert r.exit_code == 2, r.output
    lines = [line for line in r.output.splitlines() if str(path) in line]
    assert any("engine.kind" in line and "'simm'" in line for line in lines), r.output
    assert "'vllm' or 'sim'" in r.output


def test_a_boolean_admission_number_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`admission: {queueCapacity: true}` was a queue of one request (pydantic reads true as 1)."""
    from splitserve.cli import router as cli_router

    monkeypatch.setattr(cli_router, "_serve", lambda *_: None)  # were it accepted: no serving
    path = tmp_path / "router.yaml"
    for key in ("queueCapacity", "unfittedPrefillsPerWorker", "coldStartMaxHeld"):
        path.write_text(f"model: {{name: m, source: x}}\nadmission: {{{key}: true}}\n")
        args = ["--config", str(path), "--worker", "127.0.0.1:1", "--tokenizer", str(tmp_path)]
        r = CliRunner().invoke(serve_cmd, args)
        assert r.exit_code == 2, r.output
        assert f"admission.{key}" in r.output
        assert "not a boolean" in r.output
