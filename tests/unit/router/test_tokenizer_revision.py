"""The router loads its tokenizer at the revision the workers load the model at.

Before: the operator rendered the router's tokenizer as the `hf://` source's repository id and the
router loaded it at the hub's default revision, while vLLM workers got `--revision`: with a pinned
revision whose tokenizer changed, router and workers could tokenize differently.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import pytest
import yaml

from splitserve.api.router import RouterConfig, RouterFile
from splitserve.cli import router as cli_router
from splitserve.cli.tokenizer_check import load_tokenizer
from splitserve.operator import render
from splitserve.router.tokenizer import TextTokenizer
from tests.unit.operator.test_render_pod import REF, make_spec


def _router_config(**overrides: Any) -> RouterConfig:
    out = {
        (m["kind"], m["metadata"]["name"]): m
        for m in render.render(make_spec(**overrides), render.Observed(REF))
    }
    text = out[("ConfigMap", "llama-router")]["data"]["router.yaml"]
    parsed, ignored = RouterFile.from_configmap(yaml.safe_load(text))
    assert ignored == ()
    return parsed.router_config()


@pytest.mark.parametrize(
    ("model", "tokenizer", "revision"),
    [
        ({"name": "llama-8b", "source": "hf://meta/llama@v1"}, "meta/llama", "v1"),
        (
            {"name": "llama-8b", "source": "hf://meta/llama", "revision": "abc123"},
            "meta/llama",
            "abc123",
        ),
        ({"name": "llama-8b", "source": "hf://meta/llama"}, "meta/llama", None),
        # another tokenizer than the source's repository: not the model's revision
        (
            {"name": "llama-8b", "source": "hf://meta/llama@v1", "tokenizer": "org/tok"},
            "org/tok",
            None,
        ),
    ],
)
def test_the_rendered_router_config_carries_the_workers_revision(
    model: dict[str, Any], tokenizer: str, revision: str | None
) -> None:
    config = _router_config(model=model)
    assert config.tokenizer_dir == tokenizer
    assert config.tokenizer_revision == revision


def test_a_cached_model_is_loaded_from_the_revisions_directory() -> None:
    model = {"name": "llama-8b", "source": "hf://meta/llama@v1", "cache": {"size": "10Gi"}}
    config = _router_config(model=model)
    assert config.tokenizer_dir.endswith("/hf/meta/llama/v1")
    assert config.tokenizer_revision is None  # a directory holds one version


class _Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def from_pretrained(self, name: str, **kwargs: Any) -> Any:
        self.calls.append((name, kwargs))
        raise OSError("recorded")


def test_the_loaders_pass_the_revision(monkeypatch: pytest.MonkeyPatch) -> None:
    import transformers

    recorder = _Recorder()
    monkeypatch.setattr(transformers, "AutoTokenizer", recorder)
    with pytest.raises(click.BadParameter):
        load_tokenizer("meta/llama", "--config", "v1")
    with pytest.raises(OSError, match="recorded"):
        TextTokenizer.from_dir("meta/llama", "v1")
    assert recorder.calls == [("meta/llama", {"revision": "v1"})] * 2


def test_a_tokenizer_flag_drops_the_files_revision(tmp_path: Path) -> None:
    file = tmp_path / "router.yaml"
    text = render.render(make_spec(), render.Observed(REF))
    cm = next(
        m for m in text if m["kind"] == "ConfigMap" and m["metadata"]["name"] == "llama-router"
    )
    file.write_text(cm["data"]["router.yaml"])
    assert cli_router.config_from_file(file, {}).tokenizer_revision == "v1"
    other = cli_router.config_from_file(file, {"tokenizer_dir": str(tmp_path)})
    assert other.tokenizer_revision is None
