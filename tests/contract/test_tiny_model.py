"""The tiny model builder: deterministic, loadable as a Hugging Face directory, CLI works.

These run in the main venv (no torch, no vLLM); loading the weights into a model is checked in
`vllm/test_vllm_tiny_model.py`, where torch is installed.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from splitserve.cli.gen_model import tiny_model
from splitserve.worker.vllm_adapter.tiny_model import (
    MODEL_FILES,
    TinyModelSpec,
    weight_shapes,
    write_tiny_model,
)

SMALL = TinyModelSpec(vocab_size=512, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2)


def test_same_spec_gives_same_bytes(tmp_path: Path) -> None:
    a = write_tiny_model(tmp_path / "a", SMALL)
    b = write_tiny_model(tmp_path / "b", SMALL)
    assert a.fingerprint == b.fingerprint
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == sorted(MODEL_FILES)
    c = write_tiny_model(tmp_path / "c", replace(SMALL, seed=1))
    assert c.fingerprint != a.fingerprint


def test_config_matches_tokenizer_and_weights(tmp_path: Path) -> None:
    info = write_tiny_model(tmp_path, SMALL)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["vocab_size"] == info.vocab_size == 512
    assert config["num_key_value_heads"] == 2
    from safetensors import safe_open

    with safe_open(str(tmp_path / "model.safetensors"), framework="numpy") as f:
        shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118
    assert shapes == dict(weight_shapes(SMALL, info.vocab_size))
    assert info.num_parameters == sum(_prod(s) for s in shapes.values())


def test_tokenizer_round_trips_and_has_a_chat_template(tmp_path: Path) -> None:
    write_tiny_model(tmp_path, SMALL)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tmp_path))
    text = "Hello world: the prefill worker sends 42 blocks to the decode worker."
    ids = tok(text)["input_ids"]
    assert ids[0] == tok.bos_token_id
    assert tok.decode(ids, skip_special_tokens=True) == text
    assert max(ids) < 512
    chat = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert chat == "<s><|user|>\nhi</s>\n<|assistant|>\n"


def test_cli_writes_the_directory_and_refuses_a_non_empty_one(tmp_path: Path) -> None:
    dest = tmp_path / "m"
    args = [str(dest), "--vocab-size", "400", "--hidden-size", "32", "--num-layers", "1"]
    result = CliRunner().invoke(tiny_model, args)
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert out["vocab_size"] == 400
    assert (dest / "model.safetensors").is_file()
    again = CliRunner().invoke(tiny_model, args)
    assert again.exit_code != 0
    assert "not empty" in again.output
    assert CliRunner().invoke(tiny_model, [*args, "--force"]).exit_code == 0


def test_cli_rejects_a_bad_shape(tmp_path: Path) -> None:
    result = CliRunner().invoke(tiny_model, [str(tmp_path / "m"), "--num-heads", "3"])
    assert result.exit_code != 0
    assert "multiple of num_heads" in result.output


def test_spec_validation() -> None:
    with pytest.raises(ValueError, match="dtype"):
        TinyModelSpec(dtype="bfloat16")
    with pytest.raises(ValueError, match="vocab_size"):
        TinyModelSpec(vocab_size=10)


def _prod(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
