"""`splitserve up --engine vllm --tokenizer X`: the router and every worker tokenize with X.

Before: X went to the router only, and the vLLM workers loaded the model directory's own
tokenizer, so token ids could differ between the two. `worker serve --tokenizer X -- --tokenizer
Y` gave vLLM X silently; now it is refused, naming the flag."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from splitserve.cli import up as up_cli
from splitserve.cli import worker as worker_cli
from splitserve.cli.up import default_tokenizer_path, up, worker_args
from splitserve.cli.worker import worker
from splitserve.core.errors import ConfigError
from splitserve.worker.runtime import WorkerConfig, vllm_engine_kwargs


def _vllm_opts(**over: Any) -> dict[str, Any]:
    return {
        "engine": "vllm",
        "model": "/models/m",
        "served_model_name": "m",
        "log_level": "info",
        "max_model_len": 2048,
        "engine_args": ["--dtype", "float32"],
        "tokenizer": None,
    } | over


def _value(args: list[str], flag: str) -> str | None:
    """The value of `flag` among `splitserve`'s own options (before `--`)."""
    ours = args[: args.index("--")] if "--" in args else args
    return ours[ours.index(flag) + 1] if flag in ours else None


def test_a_vllm_worker_gets_the_stacks_tokenizer() -> None:
    args = worker_args("decode", "decode-0", _vllm_opts(tokenizer=Path("/tok")))
    assert _value(args, "--tokenizer") == "/tok"
    assert args[args.index("--") + 1 :] == ["--max-model-len", "2048", "--dtype", "float32"]


def test_without_tokenizer_a_vllm_worker_loads_the_models_own() -> None:
    assert _value(worker_args("decode", "decode-0", _vllm_opts()), "--tokenizer") is None


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "llama"}))
    return model


def test_up_gives_the_router_and_the_workers_the_same_tokenizer(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The command lines `up` would start, built from what the CLI parsed (nothing started)."""
    seen: dict[str, Any] = {}

    def start_stack(opts: dict[str, Any], _run_dir: Path, tokenizer_dir: Path) -> Any:
        seen["router"] = str(tokenizer_dir)
        seen["workers"] = [
            _value(worker_args(role, f"{role}-0", opts), "--tokenizer")
            for role in ("prefill", "decode")
        ]
        raise SystemExit(0)

    monkeypatch.setattr(up_cli, "start_stack", start_stack)
    tok = default_tokenizer_path()
    run_dir = str(tmp_path / "run")
    r = CliRunner().invoke(
        up,
        [
            "--engine",
            "vllm",
            "--model",
            str(model_dir),
            "--tokenizer",
            str(tok),
            "--run-dir",
            run_dir,
        ],
    )
    assert r.exit_code == 0, r.output
    assert seen["router"] == str(tok.resolve())
    assert seen["workers"] == [str(tok.resolve())] * 2


def test_up_help_says_the_workers_get_the_tokenizer() -> None:
    out = " ".join(CliRunner().invoke(up, ["--help"]).output.split())
    assert "by every worker, as vLLM's --tokenizer" in out


@pytest.mark.parametrize(
    ("cfg", "flag"),
    [
        (WorkerConfig(tokenizer="/a", engine_args=("--tokenizer", "/b")), "--tokenizer"),
        (WorkerConfig(revision="v1", engine_args=("--revision=v2",)), "--revision"),
        (
            WorkerConfig(tensor_parallel_size=2, engine_args=("--tensor-parallel-size", "4")),
            "--tensor-parallel-size",
        ),
    ],
)
def test_a_flag_and_an_engine_argument_that_disagree_are_refused(
    cfg: WorkerConfig, flag: str
) -> None:
    with pytest.raises(ConfigError, match=f"{flag} .* disagree"):
        vllm_engine_kwargs(cfg)


def test_a_flag_and_an_engine_argument_that_agree_are_one_setting() -> None:
    direct, extra = vllm_engine_kwargs(
        WorkerConfig(tokenizer="/a", engine_args=("--tokenizer", "/a", "--dtype", "float32"))
    )
    assert direct == {"dtype": "float32"}
    assert extra == {"tokenizer": "/a"}


def test_worker_serve_refuses_a_tokenizer_given_twice_differently(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[Any] = []
    monkeypatch.setattr(worker_cli, "run_until_signalled", calls.append)
    tok = str(default_tokenizer_path())
    r = CliRunner().invoke(
        worker,
        ["serve", "--engine", "vllm", "--tokenizer", tok, "--", "--tokenizer", "/elsewhere"],
    )
    assert r.exit_code == 2, r.output
    assert "--tokenizer" in r.output
    assert "disagree" in r.output
    assert calls == []
