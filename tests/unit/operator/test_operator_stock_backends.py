"""`spec.router.backends` / `spec.router.backendDiscovery` in an LLMService reach the router:
CRD -> rendered router.yaml -> `RouterConfig.backends` / `backend_discovery` (as
`splitserve router --config` reads it). Stock `vllm serve` servers, docs/engines.md."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from splitserve.api import v1alpha1 as v1
from splitserve.api.backends import BackendDiscoverySettings, HttpBackend
from splitserve.api.router import RouterConfig
from splitserve.cli.router import config_from_file
from splitserve.core.roles import Role
from splitserve.operator.render import CONFIG_KEY
from tests.unit.operator.test_operator_router_edge import rendered


def router_reads(router: dict[str, Any], tmp_path: Path) -> RouterConfig:
    path = tmp_path / CONFIG_KEY
    path.write_text(rendered(router, "ConfigMap")["data"][CONFIG_KEY])
    return config_from_file(path, {})


def test_static_backends_and_discovery_reach_the_router(tmp_path: Path) -> None:
    router = {
        "backends": [
            {"url": "http://vllm-p.ns:8000", "role": "prefill"},
            {"url": "https://vllm-d.ns:8443/", "role": "decode"},
            {"url": "http://vllm-m.ns:8000"},
        ],
        "backendDiscovery": {"selector": "app=vllm,tier in (a,b)", "roleLabel": "vllm/role"},
    }
    config = router_reads(router, tmp_path)
    assert config.backends == (
        HttpBackend(url="http://vllm-p.ns:8000", role=Role.PREFILL),
        HttpBackend(url="https://vllm-d.ns:8443", role=Role.DECODE),
        HttpBackend(url="http://vllm-m.ns:8000", role=Role.MIXED),
    )
    assert config.backend_discovery == BackendDiscoverySettings(
        namespace="ns",  # the service's own: the router's Role reads pods there
        selector="app=vllm,tier in (a,b)",
        role_label="vllm/role",
        fenced_label="splitserve.io/fenced",
        http_port=8000,
        scheme="http",
    )
    # Our own workers are still discovered beside them.
    assert config.discovery is not None


def test_no_backends_leaves_router_yaml_without_them(tmp_path: Path) -> None:
    text = rendered({}, "ConfigMap")["data"][CONFIG_KEY]
    assert "backend" not in text
    config = router_reads({}, tmp_path)
    assert config.backends == ()
    assert config.backend_discovery is None
    custom = yaml.safe_load(
        rendered(
            {"backendDiscovery": {"selector": "a=b", "roleLabel": "r", "httpPort": 9000,
                                  "scheme": "https", "fencedLabel": "x/f"}},
            "ConfigMap",
        )["data"][CONFIG_KEY]
    )  # fmt: skip
    assert custom["backend_discovery"] == {
        "namespace": "ns",
        "selector": "a=b",
        "roleLabel": "r",
        "fencedLabel": "x/f",
        "httpPort": 9000,
        "scheme": "https",
    }


@pytest.mark.parametrize(
    ("router", "field"),
    [
        ({"backends": [{"url": "ftp://x:1"}]}, "url"),
        ({"backends": [{"url": "http://x:1/v1"}]}, "url"),
        ({"backends": [{"url": "http://x:1", "role": "boss"}]}, "role"),
        ({"backends": [{"url": "http://x:1", "weight": 2}]}, "weight"),
        ({"backendDiscovery": {"selector": "a=b"}}, "roleLabel"),
        ({"backendDiscovery": {"selector": "a=b", "roleLabel": "r", "httpPort": 0}}, "httpPort"),
    ],
)
def test_bad_backends_are_refused_naming_the_field(router: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as err:
        v1.RouterSpec.model_validate(router)
    assert field in str(err.value)
