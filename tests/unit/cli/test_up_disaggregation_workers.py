"""`up --disaggregation` against the workers `up` starts: a mode that the fleet makes inert is
refused before anything starts.

Tried on a live `up --engine sim` (2026-11-29): `--disaggregation Never` started the default
prefill worker and never sent it a request; `--disaggregation Always --prefill 0` served every
request aggregated (`placements_total{reason="no_prefill_worker"}`), the mode doing nothing.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from click.testing import CliRunner

from splitserve.api import v1alpha1 as v1
from splitserve.api.router import PlacementSettings
from splitserve.cli import up as up_cli
from splitserve.cli.main import cli


@pytest.fixture(autouse=True)
def _never_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """Were one accepted, `up` would start a stack and serve for ever: fail instead."""

    def start(*_: object) -> None:
        raise RuntimeError("up would have started the stack")

    monkeypatch.setattr(up_cli, "start_stack", start)
    monkeypatch.setattr(signal, "signal", lambda *_: None)  # `up` sets SIGINT / SIGTERM


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--disaggregation", "Never"], "1 prefill worker would never get a request"),
        (["--disaggregation", "Never", "--prefill", "2"], "2 prefill workers would never"),
        (["--disaggregation", "Always", "--prefill", "0"], "--prefill 0 starts no prefill"),
    ],
)
def test_up_refuses_a_mode_its_workers_make_inert(args: list[str], says: str) -> None:
    result = CliRunner().invoke(cli, ["up", *args])
    assert result.exit_code == 2, result.output
    assert says in result.output
    assert "Traceback" not in result.output


def test_the_same_from_the_slo_config_file(tmp_path: Path) -> None:
    f = tmp_path / "slo.yaml"
    f.write_text("router: {disaggregation: Never}\n")
    result = CliRunner().invoke(cli, ["up", "--slo-config", str(f)])
    assert result.exit_code == 2, result.output
    assert "would never get a request" in result.output


def _placement(mode: str, profile: str = "default") -> PlacementSettings:
    return PlacementSettings(
        disaggregation=v1.Disaggregation(mode), profile=v1.PlacementProfile(profile)
    )


@pytest.mark.parametrize(
    ("prefill", "mixed", "placement"),
    [
        (0, 0, _placement("Never")),
        (0, 2, _placement("Never")),
        (1, 0, _placement("Always")),
        (1, 0, _placement("Auto")),
        (0, 0, _placement("Auto")),  # Auto serves aggregated with no prefill worker: documented
        (0, 2, _placement("Always", "splitwise")),  # its prompt pool borrows mixed workers
    ],
)
def test_modes_the_workers_can_act_on_pass(
    prefill: int, mixed: int, placement: PlacementSettings
) -> None:
    assert up_cli.pd_mode_usage_error(prefill, placement) is None
