"""`router serve --config router.yaml` with SLO flags: the flags override what they name, the
file keeps the rest (the admission queue, the length predictor, the default class's classes).

Before: any SLO flag built the SLO settings from the flags alone, so `--slo-class` reset the
file's `admission.queueCapacity` (8) to 1024 and its `placement.lengthPredictor` to per-class,
and `--default-slo-class batch` was refused as "not one of ['default']" though the file
declares `batch`.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from splitserve.api import v1alpha1 as v1
from splitserve.api.router import RouterConfig
from splitserve.cli import router as cli_router


def _serve(monkeypatch: pytest.MonkeyPatch, args: list[str]) -> RouterConfig:
    seen: list[RouterConfig] = []
    monkeypatch.setattr(cli_router, "_serve", lambda config, *_: seen.append(config))
    result = CliRunner().invoke(cli_router.router, ["serve", *args])
    assert result.exit_code == 0, result.output
    return seen.pop()


@pytest.fixture
def base(tmp_path: Path) -> list[str]:
    path = tmp_path / "router.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "model": {"name": "m", "source": "org/m"},
                "engine": {"kind": "sim"},
                "placement": {"lengthPredictor": "history"},
                "admission": {"queueCapacity": 8, "unfittedPrefillsPerWorker": 2},
                "sloClasses": [
                    {"name": "chat", "ttftMs": 500, "tpotMs": 50},
                    {"name": "batch", "ttftMs": 5000, "tpotMs": 500, "sheddable": True},
                ],
            }
        )
    )
    return ["--config", str(path), "--tokenizer", str(tmp_path)]


def test_a_class_flag_replaces_the_classes_and_keeps_the_admission_settings(
    monkeypatch: pytest.MonkeyPatch, base: list[str]
) -> None:
    config = _serve(monkeypatch, [*base, "--slo-class", "x:ttftMs=100,tpotMs=10"])
    assert [c.name for c in config.slo.classes] == ["x"]
    assert config.slo.default_class is None  # the flags' first class
    assert config.slo.queue_capacity == 8
    assert config.slo.unfitted_prefills_per_worker == 2
    assert config.slo.length_predictor is v1.LengthPredictor.HISTORY


def test_a_default_class_flag_picks_one_of_the_files_classes(
    monkeypatch: pytest.MonkeyPatch, base: list[str]
) -> None:
    config = _serve(monkeypatch, [*base, "--default-slo-class", "batch"])
    assert [c.name for c in config.slo.classes] == ["chat", "batch"]
    assert config.slo.default_class == "batch"
    assert config.slo.queue_capacity == 8


def test_an_slo_config_file_overrides_only_what_it_sets(
    monkeypatch: pytest.MonkeyPatch, base: list[str], tmp_path: Path
) -> None:
    slo = tmp_path / "slo.yaml"
    slo.write_text("router: {admissionQueueCapacity: 3}\n")
    config = _serve(monkeypatch, [*base, "--slo-config", str(slo)])
    assert config.slo.queue_capacity == 3
    assert [c.name for c in config.slo.classes] == ["chat", "batch"]
    assert config.slo.unfitted_prefills_per_worker == 2
    assert config.slo.length_predictor is v1.LengthPredictor.HISTORY
