"""`splitserve router serve`: `--api-key` / `SPLITSERVE_API_KEY` / `--api-key-file`, and the
interface a `--config` router binds (issue 19 items 1 and 5)."""

from __future__ import annotations

import logging
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from splitserve.api.auth import AuthSettings
from splitserve.api.router import RouterConfig
from splitserve.cli import router as cli_router
from splitserve.core.clock import ManualClock
from splitserve.router.auth import KeyStore, key_sha256_hex

KEY = "sk-cli-0123456789"


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> list[RouterConfig]:
    got: list[RouterConfig] = []

    def fake_serve(config: RouterConfig, *_: Any) -> None:
        got.append(config)

    monkeypatch.setattr(cli_router, "_serve", fake_serve)
    return got


def _router_yaml(tmp_path: Path, **extra: Any) -> Path:
    data = {"model": {"name": "m", "source": "file:///m"}, "engine": {"kind": "sim"}, **extra}
    path = tmp_path / "router.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _run(args: list[str], env: dict[str, str] | None = None) -> Any:
    return CliRunner().invoke(cli_router.router, ["serve", *args], env=env)


def test_config_file_binds_loopback_unless_told(
    tmp_path: Path, captured: list[RouterConfig]
) -> None:
    path = _router_yaml(tmp_path)
    assert _run([f"--config={path}"]).exit_code == 0
    assert (captured[-1].http_host, captured[-1].grpc_host) == ("127.0.0.1", "127.0.0.1")
    assert _run([f"--config={path}", "--host=0.0.0.0"]).exit_code == 0
    assert (captured[-1].http_host, captured[-1].grpc_host) == ("0.0.0.0", "0.0.0.0")
    path = _router_yaml(tmp_path, listen={"host": "0.0.0.0"})
    assert _run([f"--config={path}"]).exit_code == 0
    assert captured[-1].http_host == "0.0.0.0"


def test_api_key_is_kept_only_as_its_digest(tmp_path: Path, captured: list[RouterConfig]) -> None:
    result = _run([f"--config={_router_yaml(tmp_path)}", f"--api-key={KEY}"])
    assert result.exit_code == 0, result.output
    config = captured[-1]
    assert config.auth.key_sha256 == (key_sha256_hex(KEY),)
    assert KEY not in config.model_dump_json()
    result = _run([f"--config={_router_yaml(tmp_path)}"], env={"SPLITSERVE_API_KEY": KEY})
    assert captured[-1].auth.key_sha256 == (key_sha256_hex(KEY),)
    result = _run([f"--config={_router_yaml(tmp_path)}", "--api-key=short"])
    assert result.exit_code != 0
    assert "--api-key" in result.output


def test_key_file_from_flag_and_from_router_yaml(
    tmp_path: Path, captured: list[RouterConfig]
) -> None:
    keys = tmp_path / "keys.yaml"
    keys.write_text(f"tenants: [{{name: a, keys: [{KEY}]}}]\n")
    assert _run([f"--config={_router_yaml(tmp_path)}", f"--api-key-file={keys}"]).exit_code == 0
    assert captured[-1].auth.key_file == str(keys)
    path = _router_yaml(tmp_path, auth={"keyFile": str(keys)})
    assert _run([f"--config={path}"]).exit_code == 0
    assert captured[-1].auth.key_file == str(keys)
    keys.write_text("tenants: [{name: a}]\n")
    result = _run([f"--config={path}"])
    assert result.exit_code != 0
    assert "keys or keySha256" in result.output


def test_key_conflicts_are_usage_errors_not_tracebacks(
    tmp_path: Path, captured: list[RouterConfig]
) -> None:
    """Two tenants sharing a key, or a tenant named `default` next to `--api-key`, stopped the
    router's start with a traceback (`KeyStore`); the CLI refuses them, naming the flag."""
    keys = tmp_path / "keys.yaml"
    keys.write_text(f"tenants: [{{name: x, keys: [{KEY}]}}, {{name: y, keys: [{KEY}]}}]\n")
    result = _run([f"--config={_router_yaml(tmp_path)}", f"--api-key-file={keys}"])
    assert result.exit_code == 2, result.output
    assert "--api-key-file" in result.output
    assert "'x' and 'y' share a key" in result.output
    assert KEY not in result.output
    keys.write_text(f"tenants: [{{name: default, keys: [{KEY}]}}]\n")
    result = _run(
        [f"--config={_router_yaml(tmp_path)}", f"--api-key-file={keys}", "--api-key=sk-other-key1"]
    )
    assert result.exit_code == 2, result.output
    assert "--api-key" in result.output
    assert "'default'" in result.output
    keys.write_text(f"tenants: [{{name: a, keys: [{KEY}]}}]\n")
    config = f"--config={_router_yaml(tmp_path)}"
    result = _run([config, f"--api-key-file={keys}", f"--api-key={KEY}"])
    assert result.exit_code == 2, result.output
    assert "'a'" in result.output
    assert KEY not in result.output
    assert not captured


def test_a_tenants_slo_classes_must_be_the_services(
    tmp_path: Path, captured: list[RouterConfig]
) -> None:
    """docs/security.md's own tenant (`sloClasses: [interactive, batch]`) on a service with only
    the class `default`: every request was a 400 for a class the client never asked for."""
    keys = tmp_path / "keys.yaml"
    keys.write_text(f"tenants: [{{name: t, keys: [{KEY}], sloClasses: [interactive, batch]}}]\n")
    config = f"--config={_router_yaml(tmp_path)}"
    result = _run([config, f"--api-key-file={keys}"])
    assert result.exit_code == 2, result.output
    assert "tenant 't'" in result.output
    assert "sloClasses" in result.output
    assert "'interactive'" in result.output
    assert "default" in result.output
    classes = [
        "--slo-class=interactive:ttftMs=300,tpotMs=40",
        "--slo-class=batch:ttftMs=9000,tpotMs=900",
    ]
    result = _run([config, f"--api-key-file={keys}", *classes])
    assert result.exit_code == 0, result.output
    assert captured[-1].auth.key_file == str(keys)


def test_a_reload_with_unknown_slo_classes_keeps_the_old_keys(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    keys = tmp_path / "keys.yaml"
    keys.write_text(f"tenants: [{{name: t, keys: [{KEY}], sloClasses: [default]}}]\n")
    clock = ManualClock()
    store = KeyStore(AuthSettings(key_file=str(keys)), clock, slo_classes=("default",))
    keys.write_text(f"tenants: [{{name: t, keys: [{KEY}], sloClasses: [gold]}}]\n")
    st = keys.stat()
    os.utime(keys, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    clock.advance(10)
    with caplog.at_level(logging.ERROR, logger="splitserve.router.auth"):
        tenant = store.authenticate(f"Bearer {KEY}")
    assert tenant is not None
    assert tenant.spec.slo_classes == ("default",)
    assert store.reloads == 0
    assert any("'gold'" in r.getMessage() for r in caplog.records), caplog.text


def test_an_api_key_that_is_not_visible_ascii_is_a_usage_error(
    tmp_path: Path, captured: list[RouterConfig]
) -> None:
    result = _run([f"--config={_router_yaml(tmp_path)}", "--api-key=sk-ключ-12345"])
    assert result.exit_code == 2, result.output
    assert "--api-key" in result.output
    assert "visible ASCII" in result.output
    assert not captured


class _Popen:
    """Records the environment a child would get (inherited when `env` is not given)."""

    envs: list[dict[str, str]]

    def __init__(self, *_: Any, env: dict[str, str] | None = None, **__: Any) -> None:
        _Popen.envs.append(dict(os.environ if env is None else env))


def test_children_that_do_not_read_the_key_do_not_get_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--processes N` children (their configuration holds the digest) and `up`'s workers
    inherited SPLITSERVE_API_KEY in clear; `up`'s router still gets it (it hashes it)."""
    from splitserve.cli import router_processes, up

    monkeypatch.setenv("SPLITSERVE_API_KEY", KEY)
    _Popen.envs = []
    monkeypatch.setattr(subprocess, "Popen", _Popen)  # what both modules call
    router_processes._Child(0, tmp_path / "config-0.json", tmp_path).start()
    stack = up.Stack(tmp_path)
    stack.spawn("decode-0", ["worker", "serve"])
    stack.spawn("router", ["router", "serve"])
    child, worker, up_router = _Popen.envs
    assert "SPLITSERVE_API_KEY" not in child
    assert "SPLITSERVE_API_KEY" not in worker
    assert up_router["SPLITSERVE_API_KEY"] == KEY


def test_api_key_flag_and_env_with_other_keys_is_a_usage_error(
    tmp_path: Path, captured: list[RouterConfig]
) -> None:
    """The environment's keys were silently ignored when --api-key was given."""
    config = f"--config={_router_yaml(tmp_path)}"
    result = _run([config, f"--api-key={KEY}"], env={"SPLITSERVE_API_KEY": "sk-other-key-1"})
    assert result.exit_code == 2, result.output
    assert "--api-key" in result.output
    assert "SPLITSERVE_API_KEY" in result.output
    assert not captured
    result = _run([config, f"--api-key={KEY}"], env={"SPLITSERVE_API_KEY": KEY})
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("where", ["missing.yaml", "."])
def test_a_bad_key_file_from_router_yaml_names_auth_key_file(
    tmp_path: Path, captured: list[RouterConfig], where: str
) -> None:
    # it said `Invalid value for --api-key-file`, a flag nobody gave
    path = _router_yaml(tmp_path, auth={"keyFile": str(tmp_path / where)})
    result = _run([f"--config={path}"])
    assert result.exit_code == 2, result.output
    assert "auth.keyFile" in result.output
    assert str(path) in result.output
    assert "--api-key-file" not in result.output


def test_router_yaml_sets_the_key_files_reload_interval(
    tmp_path: Path, captured: list[RouterConfig]
) -> None:
    """docs/security.md named a setting (`auth.reload_interval_s`) nothing accepted."""
    keys = tmp_path / "keys.yaml"
    keys.write_text(f"tenants: [{{name: a, keys: [{KEY}]}}]\n")
    path = _router_yaml(tmp_path, auth={"keyFile": str(keys), "reloadIntervalSeconds": 30})
    result = _run([f"--config={path}"])
    assert result.exit_code == 0, result.output
    auth = captured[-1].auth
    assert auth.reload_interval_s == 30
    clock = ManualClock()
    store = KeyStore(auth, clock, slo_classes=("default",))
    assert store.authenticate(f"Bearer {KEY}") is not None  # checked at 0 s
    new_key = "sk-rotated-0123456789"
    keys.write_text(f"tenants: [{{name: a, keys: [{new_key}]}}]\n")
    st = keys.stat()
    os.utime(keys, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    clock.advance(10)  # not checked yet: the key loaded before still works
    assert store.authenticate(f"Bearer {KEY}") is not None
    clock.advance(25)
    assert store.authenticate(f"Bearer {KEY}") is None
    assert store.authenticate(f"Bearer {new_key}") is not None
