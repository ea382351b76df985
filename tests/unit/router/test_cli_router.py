"""`splitserve router serve` process set-up: the open-files limit and `--processes`."""

from __future__ import annotations

import resource

import click
import pytest
from click.testing import CliRunner

from splitserve.api.router_edge import EdgeSettings
from splitserve.cli import router as cli_router


def test_open_files_limit_is_raised_to_fit_the_connection_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[tuple[int, int]] = []
    monkeypatch.setattr(resource, "getrlimit", lambda _: (1024, 1 << 20))
    monkeypatch.setattr(resource, "setrlimit", lambda _, limits: calls.append(limits))
    cli_router._raise_fd_limit(4096)
    assert calls == [(4096 + cli_router._FD_HEADROOM, 1 << 20)]

    calls.clear()
    monkeypatch.setattr(resource, "getrlimit", lambda _: (100_000, 100_000))
    cli_router._raise_fd_limit(4096)
    assert calls == []


def test_open_files_limit_capped_by_the_hard_limit_warns(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[tuple[int, int]] = []
    monkeypatch.setattr(resource, "getrlimit", lambda _: (1024, 2048))
    monkeypatch.setattr(resource, "setrlimit", lambda _, limits: calls.append(limits))
    cli_router._raise_fd_limit(4096)
    assert calls == [(2048, 2048)]
    assert "max_connections" in caplog.text


def test_processes_must_be_positive() -> None:
    result = CliRunner().invoke(cli_router.router, ["serve", "--processes", "0"])
    assert result.exit_code == 2
    assert "--processes" in result.output


def test_edge_flags_set_the_limits_and_refuse_bad_ones() -> None:
    edge = cli_router.edge_settings(("max_body_bytes=2048", "header_timeout_s=2.5"))
    assert edge.max_body_bytes == 2048
    assert edge.header_timeout_s == 2.5
    assert cli_router.edge_settings(()) == EdgeSettings()
    for bad, why in (
        ("nokey", "KEY=VALUE"),
        ("max_bodies=1", "unknown key"),
        ("max_body_bytes=1", "1024"),
    ):
        with pytest.raises(click.BadParameter, match=why):
            cli_router.edge_settings((bad,))
    result = CliRunner().invoke(cli_router.router, ["serve", "--edge", "bogus=1"])
    assert result.exit_code == 2
    assert "--edge" in result.output


def test_a_bad_edge_value_is_one_line_naming_the_key() -> None:
    """Before: pydantic's multi-line block with its documentation URL."""
    with pytest.raises(click.BadParameter) as info:
        cli_router.edge_settings(("max_body_bytes=-5", "drain_grace_s=-1"))
    message = info.value.message
    assert "\n" not in message
    assert "errors.pydantic.dev" not in message
    assert "max_body_bytes=-5: Input should be greater than or equal to 1024" in message
    assert "drain_grace_s=-1: Input should be greater than or equal to 0" in message


def test_early_decode_flag_reaches_the_dispatch_settings(
    monkeypatch: pytest.MonkeyPatch, tmp_path: object
) -> None:
    seen: list[object] = []
    monkeypatch.setattr(cli_router, "_serve", lambda config, *_: seen.append(config))
    args = ["serve", "--worker", "127.0.0.1:1", "--tokenizer", str(tmp_path)]
    for extra, want in (([], False), (["--early-decode"], True)):
        result = CliRunner().invoke(cli_router.router, [*args, *extra])
        assert result.exit_code == 0, result.output
        assert seen.pop().dispatch.early_decode is want  # type: ignore[attr-defined]


def test_a_bad_backend_url_is_one_line() -> None:
    """Was pydantic's multi-line block with its documentation URL."""
    from click.testing import CliRunner

    from splitserve.cli.main import cli

    result = CliRunner().invoke(cli, ["router", "serve", "--backend", "ftp://x"])
    assert result.exit_code == 2
    assert "--backend: 'ftp://x': url='ftp://x': backend url 'ftp://x': expected" in result.output
    assert "errors.pydantic.dev" not in result.output
    assert "validation error" not in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--disaggregation", "Never", "--min-prompt-tokens-for-pd", "64"],
         "--min-prompt-tokens-for-pd has no effect with disaggregation Never"),
        (["--cold-start-max-held", "5"], "--cold-start-max-held has no effect without"),
        (["--backend", "http://127.0.0.1:9", "--early-decode"],
         "--early-decode acts on Multiplex links"),
    ],
)  # fmt: skip
def test_flags_that_cannot_act_are_refused(
    args: list[str], message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each was accepted and did nothing (a new-user probe)."""
    from splitserve.cli.main import cli

    monkeypatch.setattr(cli_router, "_serve", lambda *a, **k: None)  # never serve
    result = CliRunner().invoke(cli, ["router", "serve", "--port", "0", *args])
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_the_same_flags_where_they_act_are_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    from splitserve.cli.main import cli

    served: list[object] = []
    monkeypatch.setattr(cli_router, "_serve", lambda config, *a, **k: served.append(config))
    for args in (
        ["--disaggregation", "Always", "--min-prompt-tokens-for-pd", "64"],
        ["--cold-start-wait-s", "5", "--cold-start-max-held", "5"],
        ["--worker", "127.0.0.1:9", "--backend", "http://127.0.0.1:9", "--early-decode"],
    ):
        result = CliRunner().invoke(cli, ["router", "serve", "--port", "0", *args])
        assert result.exit_code == 0, result.output
    assert len(served) == 3
