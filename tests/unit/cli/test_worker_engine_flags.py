"""`splitserve worker serve` refuses a flag its engine would ignore, naming the flag and the
engine it needs.

Before: `--engine sim --revision X` and `--engine sim --nixl-port N` (vLLM-only) were accepted
and ignored, and so were `--sim-*`, `--vocab-size` and friends with `--engine vllm`; engine
arguments after `--` with `--engine sim` were a warning at start-up, then ignored."""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner

from splitserve.api import v1alpha1 as v1
from splitserve.cli import worker as worker_cli
from splitserve.cli.up import default_tokenizer_path
from splitserve.cli.worker import worker
from splitserve.operator import render


@pytest.fixture(autouse=True)
def started(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Nothing is served: a command line that gets past the checks is recorded instead."""
    calls: list[Any] = []
    monkeypatch.setattr(worker_cli, "run_until_signalled", calls.append)
    return calls


@pytest.mark.parametrize(
    "args",
    [["--revision", "X"], ["--nixl-port", "5600"], ["--nixl-port", "0"]],
)
def test_vllm_only_flags_refused_with_the_sim_engine(args: list[str]) -> None:
    r = CliRunner().invoke(worker, ["serve", "--engine", "sim", *args])
    assert r.exit_code == 2, r.output
    assert args[0] in r.output
    assert "--engine vllm" in r.output


@pytest.mark.parametrize(
    "args",
    [
        ["--sim-shape", "tiny"],
        ["--sim-hardware", "cpu-2core"],
        ["--sim-time-scale", "0"],
        ["--sim-latency-model", "roofline"],
        ["--sim-kv-blocks", "8"],
        ["--sim-max-model-len", "64"],
        ["--vocab-size", "100"],
        ["--first-token-id", "1"],
    ],
)
def test_sim_only_flags_refused_with_the_vllm_engine(args: list[str]) -> None:
    r = CliRunner().invoke(worker, ["serve", "--engine", "vllm", "--model", "/m", *args])
    assert r.exit_code == 2, r.output
    assert args[0] in r.output
    assert "--engine sim" in r.output


def test_engine_args_refused_with_the_sim_engine(started: list[Any]) -> None:
    r = CliRunner().invoke(worker, ["serve", "--engine", "sim", "--", "--max-model-len", "8"])
    assert r.exit_code == 2, r.output
    assert "--max-model-len 8" in r.output  # names the arguments
    assert "--engine vllm" in r.output
    assert started == []


def test_engine_args_still_reach_the_vllm_engine(started: list[Any]) -> None:
    r = CliRunner().invoke(
        worker, ["serve", "--engine", "vllm", "--model", "/m", "--", "--max-model-len", "8"]
    )
    assert r.exit_code == 0, r.output
    assert len(started) == 1


def test_the_sim_engine_still_takes_its_own_flags(started: list[Any]) -> None:
    r = CliRunner().invoke(
        worker, ["serve", "--engine", "sim", "--sim-shape", "tiny", "--vocab-size", "100"]
    )
    assert r.exit_code == 0, r.output
    assert len(started) == 1


def _spec(kind: str, tokenizer: str = "a/b") -> v1.LLMServiceSpec:
    return v1.LLMServiceSpec.model_validate(
        {
            # The sim engine refuses a revision (it loads no weights): vLLM's only.
            "model": {
                "name": "m",
                "source": "hf://a/b@v3" if kind == "vllm" else "hf://a/b",
                "tokenizer": tokenizer,
            },
            "engine": {"kind": kind, "image": "img:1"},
            "workerGroups": [{"name": "g", "roles": ["prefill", "decode"], "gpus": 1}],
            "pools": {"prefill": {"replicas": 1}, "decode": {"replicas": 1}},
        }
    )


def test_the_operators_sim_worker_command_line_is_accepted(started: list[Any]) -> None:
    """A sim LLMService with a tokenizer (the router's) renders no vLLM-only flag for its
    workers, so they start, and gives them the tokenizer (their vocabulary and end of text);
    a vLLM one (with a revision) keeps its flags."""
    tok = str(default_tokenizer_path())  # a directory: nothing is downloaded here
    sim = _spec("sim", tok)
    args = render.worker_args(sim, sim.worker_groups[0])
    assert not [a for a in args if a.startswith(("--revision", "--nixl-port"))]
    assert f"--tokenizer={tok}" in args
    r = CliRunner().invoke(worker, args[1:])
    assert r.exit_code == 0, r.output
    assert len(started) == 1
    vllm = _spec("vllm")
    args = render.worker_args(vllm, vllm.worker_groups[0])
    assert "--revision=v3" in args
    assert "--tokenizer=a/b" in args
