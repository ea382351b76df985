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


def test_edge_flags_override_single_fields_of_the_files_edge(tmp_path: Path) -> None:
    """`router serve --config FILE --edge K=V` changes K only; before, the flag's whole
    `EdgeSettings` replaced the file's, so `edge.maxBodyBytes: 1024` fell back to 8 MiB."""
    from splitserve.cli.router import edge_settings

    data = {**_file("vllm", "/tok"), "edge": {"maxBodyBytes": 1024, "idleTimeoutSeconds": 7}}
    path = tmp_path / "router.yaml"
    path.write_text(yaml.safe_dump(data))
    plain = config_from_file(path, {}).edge
    assert (plain.max_body_bytes, plain.idle_timeout_s) == (1024, 7)
    edge = config_from_file(path, {"edge": edge_settings(("header_timeout_s=5",))}).edge
    assert (edge.max_body_bytes, edge.idle_timeout_s, edge.header_timeout_s) == (1024, 7, 5)
    again = config_from_file(path, {"edge": edge_settings(("max_body_bytes=2048",))}).edge
    assert (again.max_body_bytes, again.idle_timeout_s) == (2048, 7)
