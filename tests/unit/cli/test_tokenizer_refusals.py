"""A tokenizer no loader can load is refused in one line naming the flag and what was tried, by
every command that takes one: `router serve` (its `--tokenizer`, a router.yaml's model, the
`--processes` parent), `up` (sim: `--tokenizer`; vLLM: `--tokenizer` or `--model`) and
`worker serve --engine vllm --tokenizer`.

Before: a hub id that cannot be loaded (offline) or a directory without tokenizer files gave
transformers' traceback from inside the command's start-up (the router's, up's vocabulary
scan, vLLM's engine). Offline throughout: the hub client is set offline as `HF_HUB_OFFLINE=1`
sets it, so nothing here reaches the network.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NoReturn

import click
import pytest
import yaml
from click.testing import CliRunner, Result
from huggingface_hub import constants

from splitserve.cli import router as cli_router
from splitserve.cli import up as up_module
from splitserve.cli import worker as worker_cli
from splitserve.cli.main import cli
from splitserve.cli.tokenizer_check import load_tokenizer
from splitserve.cli.up import default_tokenizer_path

HUB_ID = "no-such-org/none"


class StartedError(Exception):
    """A command got past its checks and would have started something."""


def _start(*_args: Any, **_kwargs: Any) -> NoReturn:
    raise StartedError


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # what HF_HUB_OFFLINE=1 sets
    monkeypatch.setattr(cli_router, "run_until_signalled", _start)
    monkeypatch.setattr(up_module, "start_stack", _start)
    monkeypatch.setattr(worker_cli, "run_until_signalled", _start)


@pytest.fixture
def empty(tmp_path: Path) -> Path:
    path = tmp_path / "tok"
    path.mkdir()
    return path


@pytest.fixture
def broken(tmp_path: Path) -> Path:
    path = tmp_path / "broken"
    path.mkdir()
    (path / "tokenizer.json").write_text("{not json")
    return path


def refused(result: Result, flag: str, value: str) -> str:
    """The refusal: a usage error (exit 2) with one `Error:` line naming `flag` and `value`;
    nothing started, no traceback."""
    assert not isinstance(result.exception, StartedError), result.output
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, result.output
    assert flag in errors[0]
    assert repr(value) in errors[0]
    return errors[0]


def invoke(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


# --- the check itself ------------------------------------------------------------------------


def test_what_was_tried_is_said(empty: Path, broken: Path) -> None:
    with pytest.raises(click.BadParameter) as err:
        load_tokenizer(HUB_ID, "--tokenizer")
    msg = err.value.format_message()
    assert "no such directory" in msg
    assert "hub id" in msg
    assert "HF_HUB_OFFLINE is set" in msg
    assert "\n" not in msg
    with pytest.raises(click.BadParameter, match="a directory without tokenizer files"):
        load_tokenizer(empty, "--tokenizer")
    with pytest.raises(click.BadParameter, match=r"a directory with tokenizer\.json;"):
        load_tokenizer(broken, "--tokenizer")


def test_a_good_tokenizer_loads() -> None:
    tok = load_tokenizer(default_tokenizer_path(), "--tokenizer")
    assert tok.encode("hello")


# --- router serve ----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["hub", "empty", "broken"])
def test_router_serve_refuses_the_tokenizer(kind: str, empty: Path, broken: Path) -> None:
    value = {"hub": HUB_ID, "empty": str(empty), "broken": str(broken)}[kind]
    refused(
        invoke("router", "serve", "--worker", "127.0.0.1:1", "--tokenizer", value),
        "--tokenizer",
        value,
    )


def test_router_serve_with_processes_refuses_before_the_children(
    empty: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from splitserve.cli import router_processes

    monkeypatch.setattr(router_processes, "supervise", _start)
    result = invoke(
        "router", "serve", "--worker", "127.0.0.1:1", "--tokenizer", str(empty), "--processes", "2"
    )
    refused(result, "--tokenizer", str(empty))


def test_router_serve_names_the_config_file(tmp_path: Path, empty: Path) -> None:
    path = tmp_path / "router.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "model": {"name": "m", "source": "file:///m", "tokenizer": str(empty)},
                "engine": {"kind": "vllm"},
            }
        )
    )
    line = refused(invoke("router", "serve", f"--config={path}"), "--config", str(empty))
    assert "model.tokenizer" in line


def test_router_serve_hands_the_loaded_tokenizer_to_the_server(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A good one is loaded once, before the server starts, and given to it."""
    seen: list[Any] = []

    class Server:
        settle_gc = False
        http_port, grpc_port = 1, 2

        def __init__(self, config: Any, *, reuse_port: bool = False, tokenizer: Any = None):
            seen.append(tokenizer)

        async def start(self) -> None:
            pass

        async def wait(self) -> None:
            pass

        async def stop(self) -> None:
            pass

    def run(main: Any) -> None:
        import asyncio

        asyncio.run(main(asyncio.Event()))

    monkeypatch.setattr(cli_router, "RouterServer", Server)
    monkeypatch.setattr(cli_router, "run_until_signalled", run)
    tok = str(default_tokenizer_path())
    result = invoke("router", "serve", "--worker", "127.0.0.1:1", "--tokenizer", tok, "--port", "0")
    assert result.exit_code == 0, result.output
    assert len(seen) == 1
    assert seen[0].encode("hello")


# --- up --------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["empty", "broken"])
def test_up_sim_refuses_the_tokenizer(kind: str, empty: Path, broken: Path, tmp_path: Path) -> None:
    value = str(empty if kind == "empty" else broken)
    result = invoke("up", "--run-dir", str(tmp_path / "run"), "--tokenizer", value)
    refused(result, "--tokenizer", value)


def test_up_vllm_refuses_a_model_without_a_tokenizer(tmp_path: Path, empty: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    args = ["up", "--engine", "vllm", "--run-dir", str(tmp_path / "run"), "--model", str(model)]
    refused(invoke(*args), "--model", str(model))
    refused(invoke(*args, "--tokenizer", str(empty)), "--tokenizer", str(empty))


# --- worker serve ----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["hub", "empty"])
def test_worker_serve_vllm_refuses_the_tokenizer(kind: str, empty: Path) -> None:
    value = HUB_ID if kind == "hub" else str(empty)
    result = invoke("worker", "serve", "--engine", "vllm", "--model", "/m", "--tokenizer", value)
    refused(result, "--tokenizer", value)


def test_worker_serve_vllm_takes_a_good_tokenizer() -> None:
    tok = str(default_tokenizer_path())
    result = invoke("worker", "serve", "--engine", "vllm", "--model", "/m", "--tokenizer", tok)
    assert isinstance(result.exception, StartedError), result.output
