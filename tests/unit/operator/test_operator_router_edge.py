"""`spec.router.edge` in an LLMService reaches the router: CRD -> rendered router.yaml ->
`RouterConfig.edge` (as `splitserve router --config` reads it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from splitserve.api import v1alpha1 as v1
from splitserve.api.router_edge import EdgeSettings
from splitserve.cli.router import config_from_file
from splitserve.operator.render import CONFIG_KEY, ROUTER_STOP_MARGIN_S, render_documents


def service(router: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": v1.API_VERSION,
        "kind": "LLMService",
        "metadata": {"name": "edgy", "namespace": "ns"},
        "spec": {
            "model": {"name": "m", "source": "org/m", "tokenizer": "/models/tok"},
            "engine": {"kind": "sim", "image": "img:1"},
            "workerGroups": [{"name": "w", "roles": ["prefill", "decode"]}],
            "pools": {"prefill": {"replicas": 1}, "decode": {"replicas": 1}},
            "router": router,
        },
    }


def rendered(router: dict[str, Any], kind: str) -> dict[str, Any]:
    manifests, _ = render_documents([service(router)], None, "router:1")
    [found] = [m for m in manifests if m["kind"] == kind and "router" in m["metadata"]["name"]]
    return found


def router_reads(router: dict[str, Any], tmp_path: Path) -> EdgeSettings:
    path = tmp_path / CONFIG_KEY
    path.write_text(rendered(router, "ConfigMap")["data"][CONFIG_KEY])
    return config_from_file(path, {}).edge


def test_edge_limits_reach_the_router(tmp_path: Path) -> None:
    edge = {
        "maxBodyBytes": 2048,
        "maxConnections": 7,
        "headerTimeoutSeconds": 3,
        "idleTimeoutSeconds": 4.5,
        "drainGraceSeconds": 50,
    }
    got = router_reads({"edge": edge}, tmp_path)
    want = EdgeSettings(
        max_body_bytes=2048,
        max_connections=7,
        header_timeout_s=3,
        idle_timeout_s=4.5,
        drain_grace_s=50,
    )
    assert got == want
    pod = rendered({"edge": edge}, "Deployment")["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == 50 + 1 + ROUTER_STOP_MARGIN_S


def test_no_edge_keeps_the_router_defaults_and_the_file_unchanged(tmp_path: Path) -> None:
    assert router_reads({}, tmp_path) == EdgeSettings()
    assert "edge" not in rendered({}, "ConfigMap")["data"][CONFIG_KEY]
    pod = rendered({}, "Deployment")["spec"]["template"]["spec"]
    # longer than the router's default drain (30 s): Kubernetes' own default grace is 30 s too,
    # so without it the kubelet killed the router as its drain ended (a new-user probe)
    assert pod["terminationGracePeriodSeconds"] == EdgeSettings().drain_grace_s + 1 + 5


def test_every_edge_limit_is_settable_from_the_crd() -> None:
    every = {
        name: EdgeSettings.model_fields[name].default or 1 for name in EdgeSettings.model_fields
    }
    every["tool_call_parser"] = "hermes"  # a name, not a number
    crd_names = {
        name.removesuffix("_s") + "_seconds" if name.endswith("_s") else name: value
        for name, value in every.items()
    }
    spec = v1.RouterEdgeSpec(**crd_names)
    assert spec.settings_fields() == every


@pytest.mark.parametrize(
    ("edge", "field"),
    [
        ({"maxBodyBytes": 10}, "maxBodyBytes"),
        ({"headerTimeoutSeconds": 0}, "headerTimeoutSeconds"),
        ({"tokenizerThreads": 0}, "tokenizerThreads"),
        ({"maxBody": 1}, "maxBody"),
    ],
)
def test_bad_edge_values_are_refused_naming_the_field(edge: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as err:
        v1.RouterSpec.model_validate({"edge": edge})
    assert field in str(err.value)
