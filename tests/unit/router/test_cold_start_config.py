"""The cold-start wait's configuration: `router serve` flags, router.yaml, and what the operator
renders for it (`render.cold_start_wait_s`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from splitserve.api import v1alpha1 as v1
from splitserve.api.router import RouterConfig, RouterFile
from splitserve.cli import router as cli_router
from splitserve.operator import render
from tests.unit.operator.test_render_pod import make_spec

REF = render.ServiceRef(name="llama", namespace="ml", uid="uid-1")


def _serve(monkeypatch: pytest.MonkeyPatch, args: list[str]) -> RouterConfig:
    seen: list[RouterConfig] = []
    monkeypatch.setattr(cli_router, "_serve", lambda config, *_: seen.append(config))
    result = CliRunner().invoke(cli_router.router, ["serve", *args])
    assert result.exit_code == 0, result.output
    return seen.pop()


def test_the_flags_reach_the_dispatch_settings(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    base = ["--worker", "127.0.0.1:1", "--tokenizer", str(tmp_path)]
    config = _serve(monkeypatch, base)
    assert config.dispatch.cold_start_wait_s == 0  # off by default: a 503 at once
    assert config.dispatch.cold_start_max_held == 1024
    flags = ["--cold-start-wait-s", "30", "--cold-start-max-held", "5"]
    config = _serve(monkeypatch, [*base, *flags])
    assert config.dispatch.cold_start_wait_s == 30
    assert config.dispatch.cold_start_max_held == 5


def test_the_config_files_wait_holds_unless_a_flag_overrides_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    path = tmp_path / "router.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "model": {"name": "m", "source": "org/m"},
                "engine": {"kind": "sim"},
                "admission": {"coldStartWaitSeconds": 120, "coldStartMaxHeld": 9},
            }
        )
    )
    base = ["--config", str(path), "--tokenizer", str(tmp_path)]
    # Another dispatch flag given explicitly keeps the file's wait (it replaced the block).
    config = _serve(monkeypatch, [*base, "--token-stall-timeout-s", "5"])
    assert config.dispatch.token_stall_timeout_s == 5
    assert config.dispatch.cold_start_wait_s == 120
    assert config.dispatch.cold_start_max_held == 9
    config = _serve(monkeypatch, [*base, "--cold-start-wait-s", "0"])
    assert config.dispatch.cold_start_wait_s == 0


@pytest.mark.parametrize("bad", ["-1", "nan", "inf"])
def test_a_bad_wait_is_a_usage_error_naming_the_flag(bad: str) -> None:
    result = CliRunner().invoke(cli_router.router, ["serve", "--cold-start-wait-s", bad])
    assert result.exit_code == 2
    assert "--cold-start-wait-s" in result.output


def _rendered(spec: v1.LLMServiceSpec) -> tuple[dict[str, Any], RouterConfig]:
    out = {(m["kind"], m["metadata"]["name"]): m for m in render.render(spec, render.Observed(REF))}
    text = out[("ConfigMap", "llama-router")]["data"]["router.yaml"]
    parsed, ignored = RouterFile.from_configmap(yaml.safe_load(text))
    assert ignored == ()
    return yaml.safe_load(text)["admission"], parsed.router_config()


@pytest.mark.parametrize(
    ("overrides", "wait_s"),
    [
        ({}, render.SCALE_FROM_ZERO_WAIT_S),  # minReplicas 0, Managed: can scale to zero
        ({"scaling": {"mode": "External"}}, render.SCALE_FROM_ZERO_WAIT_S),
        ({"scaling": {"mode": "Manual"}}, 0),  # people scale it: no autoscaler brings one back
        ({"pools": {"prefill": {"replicas": 2}, "decode": {"replicas": 3, "minReplicas": 1}}}, 0),
        ({"pools": {"prefill": {"replicas": 1}}}, 0),  # no decode-capable pool to wait for
        ({"router": {"coldStartWaitSeconds": 45}, "scaling": {"mode": "Manual"}}, 45),
        ({"router": {"coldStartWaitSeconds": 0}}, 0),
    ],
)
def test_the_operator_renders_the_routers_wait(overrides: dict[str, Any], wait_s: int) -> None:
    admission, config = _rendered(make_spec(**overrides))
    assert admission["coldStartWaitSeconds"] == wait_s
    assert config.dispatch.cold_start_wait_s == wait_s


def test_the_bound_is_the_admission_queue_capacity() -> None:
    admission, config = _rendered(make_spec(router={"admissionQueueCapacity": 7}))
    assert admission["coldStartMaxHeld"] == 7
    assert config.dispatch.cold_start_max_held == 7


def test_the_crd_refuses_a_negative_wait() -> None:
    with pytest.raises(ValueError, match="coldStartWaitSeconds"):
        make_spec(router={"coldStartWaitSeconds": -1})
