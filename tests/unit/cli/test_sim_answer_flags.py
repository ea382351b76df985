"""The simulated engine's answer length: `--sim-answer-tokens` / `--eos-token-id` on `worker
serve`, `--sim-answer-tokens` on `up` (which fills `--eos-token-id` from its tokenizer).

Before: the simulated engine never ended an answer by itself, so `ignore_eos` and `min_tokens`
changed nothing there and a request without `max_tokens` ran to the context limit."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from splitserve.cli import up as up_cli
from splitserve.cli import worker as worker_cli
from splitserve.cli.up import default_tokenizer_path, tokenizer_vocab, up, worker_args
from splitserve.cli.worker import worker
from splitserve.policy.batching.tokens import DEFAULT_ANSWER_TOKENS, DEFAULT_EOS_TOKEN_ID
from splitserve.worker.runtime import WorkerConfig, _ReleaseClient, build_sim_engine


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> list[WorkerConfig]:
    """Nothing is served: the config a command line would serve is recorded instead."""
    configs: list[WorkerConfig] = []
    monkeypatch.setattr(worker_cli, "serve", lambda cfg, _stop: configs.append(cfg))
    monkeypatch.setattr(worker_cli, "run_until_signalled", lambda run: run(None))
    return configs


def test_the_default_tokenizers_end_of_text_is_the_workers_default() -> None:
    *_, eos = tokenizer_vocab(default_tokenizer_path())
    assert eos == DEFAULT_EOS_TOKEN_ID


def test_worker_defaults_end_answers(served: list[WorkerConfig]) -> None:
    r = CliRunner().invoke(worker, ["serve", "--engine", "sim"])
    assert r.exit_code == 0, r.output
    (cfg,) = served
    assert (cfg.eos_token_id, cfg.sim_answer_tokens) == (
        DEFAULT_EOS_TOKEN_ID,
        DEFAULT_ANSWER_TOKENS,
    )
    tokens = build_sim_engine(cfg, "127.0.0.1:1", _ReleaseClient())._core.tokens
    assert tokens is not None
    assert (tokens.eos_id, tokens.answer_median) == (DEFAULT_EOS_TOKEN_ID, DEFAULT_ANSWER_TOKENS)


def test_worker_flags_reach_the_engine(served: list[WorkerConfig]) -> None:
    args = ["--eos-token-id", "7", "--sim-answer-tokens", "40", "--sim-answer-sigma", "0.5"]
    r = CliRunner().invoke(worker, ["serve", "--engine", "sim", *args])
    assert r.exit_code == 0, r.output
    tokens = build_sim_engine(served[0], "127.0.0.1:1", _ReleaseClient())._core.tokens
    assert tokens is not None
    assert (tokens.eos_id, tokens.answer_median, tokens.answer_sigma) == (7, 40, 0.5)


def test_answers_that_never_end(served: list[WorkerConfig]) -> None:
    for args in (
        ["--sim-answer-tokens", "0"],
        ["--eos-token-id", "-1", "--sim-answer-tokens", "0"],
    ):
        r = CliRunner().invoke(worker, ["serve", "--engine", "sim", *args])
        assert r.exit_code == 0, r.output
        tokens = build_sim_engine(served[-1], "127.0.0.1:1", _ReleaseClient())._core.tokens
        assert tokens is not None
        assert tokens.answer_median == 0


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--eos-token-id", "-1"], "--sim-answer-tokens"),  # answers that end need an id
        (["--sim-answer-sigma", "9"], "--sim-answer-sigma"),
    ],
)
def test_bad_worker_flags_are_refused(
    served: list[WorkerConfig], args: list[str], flag: str
) -> None:
    r = CliRunner().invoke(worker, ["serve", "--engine", "sim", *args])
    assert r.exit_code == 2, r.output
    assert flag in r.output
    assert served == []


@pytest.mark.parametrize("flag", ["--sim-answer-tokens", "--eos-token-id", "--sim-answer-sigma"])
def test_worker_refuses_them_with_vllm(flag: str) -> None:
    r = CliRunner().invoke(worker, ["serve", "--engine", "vllm", "--model", "/m", flag, "1"])
    assert r.exit_code == 2, r.output
    assert flag in r.output
    assert "--engine sim" in r.output


def _up_worker_args(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, *args: str) -> Any:
    seen: dict[str, Any] = {}

    def start_stack(opts: dict[str, Any], _run_dir: Path, _tokenizer_dir: Path) -> Any:
        seen["args"] = worker_args("decode", "decode-0", opts)
        raise SystemExit(0)

    monkeypatch.setattr(up_cli, "start_stack", start_stack)
    r = CliRunner().invoke(up, ["--run-dir", str(tmp_path / "run"), *args])
    return r, seen.get("args")


def _value(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def test_up_gives_simulated_workers_the_tokenizers_end_of_text(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    r, args = _up_worker_args(monkeypatch, tmp_path)
    assert r.exit_code == 0, r.output
    assert _value(args, "--eos-token-id") == str(DEFAULT_EOS_TOKEN_ID)
    assert _value(args, "--sim-answer-tokens") == str(DEFAULT_ANSWER_TOKENS)
    r, args = _up_worker_args(monkeypatch, tmp_path, "--sim-answer-tokens", "0")
    assert r.exit_code == 0, r.output
    assert _value(args, "--sim-answer-tokens") == "0"


def test_up_refuses_it_with_vllm(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    r, args = _up_worker_args(
        monkeypatch, tmp_path, "--engine", "vllm", "--model", "/m", "--sim-answer-tokens", "5"
    )
    assert r.exit_code == 2, r.output
    assert "--sim-answer-tokens" in r.output
    assert args is None


def test_up_with_a_tokenizer_without_end_of_text(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A tokenizer with no end-of-text token cannot end simulated answers: they run to
    max_tokens (the workers get --sim-answer-tokens 0 and --eos-token-id -1, and `up` says
    so); a --sim-answer-tokens the user gave is refused, naming it."""
    tok = _no_eos_tokenizer(tmp_path)
    r, args = _up_worker_args(monkeypatch, tmp_path, "--tokenizer", str(tok))
    assert r.exit_code == 0, r.output
    assert "no end-of-text token" in r.output
    assert _value(args, "--eos-token-id") == "-1"
    assert _value(args, "--sim-answer-tokens") == "0"
    r, args = _up_worker_args(
        monkeypatch, tmp_path, "--tokenizer", str(tok), "--sim-answer-tokens", "5"
    )
    assert r.exit_code == 2, r.output
    assert "--sim-answer-tokens" in r.output
    assert "no end-of-text token" in r.output
    assert args is None


def _no_eos_tokenizer(tmp_path: Path) -> Path:
    tok = tmp_path / "tok"
    shutil.copytree(default_tokenizer_path(), tok)
    cfg = json.loads((tok / "tokenizer_config.json").read_text())
    del cfg["eos_token"]
    (tok / "tokenizer_config.json").write_text(json.dumps(cfg))
    return tok


def test_sim_worker_takes_its_vocabulary_from_a_tokenizer(served: list[WorkerConfig]) -> None:
    """`worker serve --engine sim --tokenizer X` (what the operator renders for a service with
    `model.tokenizer`): the ids it draws and its end of text are X's, as `up` derives them."""
    tok = default_tokenizer_path()
    r = CliRunner().invoke(worker, ["serve", "--engine", "sim", "--tokenizer", str(tok)])
    assert r.exit_code == 0, r.output
    vocab, first, clean, eos = tokenizer_vocab(tok)
    cfg = served[0]
    assert (cfg.vocab_size, cfg.first_token_id, cfg.token_ids) == (vocab, first, tuple(clean))
    assert (cfg.eos_token_id, cfg.sim_answer_tokens) == (eos, DEFAULT_ANSWER_TOKENS)


@pytest.mark.parametrize("flag", ["--vocab-size", "--first-token-id", "--eos-token-id"])
def test_sim_worker_refuses_a_tokenizer_and_what_it_sets(
    served: list[WorkerConfig], flag: str
) -> None:
    args = ["serve", "--engine", "sim", "--tokenizer", str(default_tokenizer_path()), flag, "3"]
    r = CliRunner().invoke(worker, args)
    assert r.exit_code == 2, r.output
    assert flag in r.output
    assert "set by --tokenizer" in r.output
    assert served == []


def test_sim_worker_with_a_tokenizer_without_end_of_text(
    served: list[WorkerConfig], tmp_path: Path
) -> None:
    tok = str(_no_eos_tokenizer(tmp_path))
    r = CliRunner().invoke(worker, ["serve", "--engine", "sim", "--tokenizer", tok])
    assert r.exit_code == 0, r.output
    assert (served[0].eos_token_id, served[0].sim_answer_tokens) == (None, 0)
    args = ["serve", "--engine", "sim", "--tokenizer", tok, "--sim-answer-tokens", "5"]
    r = CliRunner().invoke(worker, args)
    assert r.exit_code == 2, r.output
    assert "--sim-answer-tokens" in r.output
    assert len(served) == 1
