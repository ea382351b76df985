"""Which tokenizer a router loads from its ConfigMap: the model's, or the local BPE for sim."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from splitserve.api.router import RouterFile
from splitserve.cli.router import config_from_file


def _file(kind: str, tokenizer: str | None = None) -> dict[str, object]:
    model: dict[str, object] = {"name": "m", "source": "org/model"}
    if tokenizer:
        model["tokenizer"] = tokenizer
    return {"service": "s", "model": model, "engine": {"kind": kind}}


@pytest.mark.parametrize(
    ("kind", "tokenizer", "default", "expected"),
    [
        ("vllm", None, False, "org/model"),
        ("vllm", "/tok", False, "/tok"),
        ("sim", None, True, "org/model"),
        ("sim", "/tok", False, "/tok"),
    ],
    ids=["vllm-source", "vllm-explicit", "sim-default", "sim-explicit"],
)
def test_tokenizer_choice(kind: str, tokenizer: str | None, default: bool, expected: str) -> None:
    parsed, ignored = RouterFile.from_configmap(_file(kind, tokenizer))
    assert ignored == ()
    assert parsed.needs_default_tokenizer is default
    assert parsed.tokenizer_dir() == expected


def test_sim_service_router_gets_the_local_tokenizer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPLITSERVE_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "router.yaml"
    path.write_text(yaml.safe_dump(_file("sim")))
    config = config_from_file(path, {})
    assert Path(config.tokenizer_dir).is_relative_to(tmp_path / "cache")
    assert (Path(config.tokenizer_dir) / "tokenizer.json").is_file()
