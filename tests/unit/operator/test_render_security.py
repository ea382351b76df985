"""Issue 19: what the operator renders for security (API-key Secret on the router)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from splitserve.api import v1alpha1 as v1
from splitserve.api.router import RouterFile
from splitserve.operator import render
from tests.unit.operator.test_render_pod import REF, make_spec, objects, router_pod, worker_pod


def test_api_key_secret_is_mounted_and_named_in_router_yaml() -> None:
    spec = make_spec(router={"apiKeySecret": "llama-keys"})
    pod = router_pod(spec)
    assert {"name": "api-keys", "secret": {"secretName": "llama-keys"}} in pod["volumes"]
    (container,) = pod["containers"]
    mount = next(m for m in container["volumeMounts"] if m["name"] == "api-keys")
    assert mount == {"name": "api-keys", "mountPath": render.API_KEYS_PATH, "readOnly": True}
    # Not nested in the ConfigMap's (read-only) mount.
    assert not mount["mountPath"].startswith(render.ROUTER_CONFIG_PATH + "/")
    text = objects(spec)[("ConfigMap", "llama-router")]["data"][render.CONFIG_KEY]
    parsed, ignored = RouterFile.from_configmap(yaml.safe_load(text))
    assert ignored == ()
    config = parsed.router_config()
    assert config.auth.key_file == f"{render.API_KEYS_PATH}/{render.API_KEYS_KEY}"


def test_without_a_secret_the_router_yaml_has_no_auth() -> None:
    spec = make_spec()
    text = objects(spec)[("ConfigMap", "llama-router")]["data"][render.CONFIG_KEY]
    assert "auth" not in yaml.safe_load(text)
    assert all(v["name"] != "api-keys" for v in router_pod(spec)["volumes"])


def _policies(spec: v1.LLMServiceSpec) -> dict[str, Any]:
    return {
        m["metadata"]["name"]: m["spec"]
        for m in render.render(spec, render.Observed(REF))
        if m["kind"] == "NetworkPolicy"
    }


def test_worker_grpc_only_from_router_workers_and_operator() -> None:
    spec = make_spec()
    pol = _policies(spec)["llama-workers"]
    workers = {"matchLabels": render.worker_selector("llama")}
    assert pol["podSelector"] == workers
    assert pol["policyTypes"] == ["Ingress"]
    grpc_rule, kv_rule, metrics_rule, link_rule = pol["ingress"]
    assert grpc_rule["ports"] == [{"protocol": "TCP", "port": spec.engine.grpc_port}]
    router_peer, operator_peer = grpc_rule["from"]
    assert router_peer["podSelector"]["matchLabels"]["splitserve.io/component"] == "router"
    assert router_peer["podSelector"]["matchLabels"]["splitserve.io/service"] == "llama"
    assert operator_peer["namespaceSelector"] == {}
    assert operator_peer["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "operator"
    assert kv_rule == {"from": [{"podSelector": workers}]}
    assert "from" not in metrics_rule
    assert metrics_rule["ports"] == [{"protocol": "TCP", "port": spec.engine.metrics_port}]
    # The stream link's port: the service's router pods only (not the operator, not anyone).
    assert link_rule == {
        "from": [{"podSelector": router_peer["podSelector"]}],
        "ports": [{"protocol": "TCP", "port": render.worker_link_port(spec)}],
    }


def test_router_from_and_metrics_from_and_the_switch() -> None:
    spec = make_spec(
        networkPolicy={
            "routerFrom": [{"namespaceSelector": {"matchLabels": {"team": "a"}}}],
            "metricsFrom": [{"ipBlock": {"cidr": "10.0.0.0/8"}}],
        }
    )
    pols = _policies(spec)
    rule, _operator = pols["llama-router"]["ingress"]
    assert rule["from"] == [{"namespaceSelector": {"matchLabels": {"team": "a"}}}]
    assert {p["port"] for p in rule["ports"]} == {spec.router.http_port, spec.router.grpc_port}
    assert pols["llama-workers"]["ingress"][2]["from"] == [{"ipBlock": {"cidr": "10.0.0.0/8"}}]
    assert _policies(make_spec(networkPolicy={"enabled": False})) == {}


def test_router_from_still_admits_the_operators_scrape_of_router_metrics() -> None:
    """The control loop (`metricsSource: Router`, the default) reads each router pod's
    `/metrics` on its HTTP port: a `routerFrom` list must not cut the operator off, else every
    Managed / Advise tick holds on "scrape failed". Only the HTTP port, only the operator."""
    spec = make_spec(
        router={"httpPort": 8088},
        networkPolicy={"routerFrom": [{"namespaceSelector": {"matchLabels": {"team": "a"}}}]},
    )
    rules = _policies(spec)["llama-router"]["ingress"]
    operator = {"namespaceSelector": {}, "podSelector": {"matchLabels": OPERATOR_LABELS}}
    assert {"from": [operator], "ports": [{"protocol": "TCP", "port": 8088}]} in rules
    # Without routerFrom the one rule admits anyone already.
    (open_rule,) = _policies(make_spec())["llama-router"]["ingress"]
    assert "from" not in open_rule


OPERATOR_LABELS = {
    "app.kubernetes.io/name": "splitserve",
    "app.kubernetes.io/component": "operator",
}


def test_workers_get_no_service_account_token_unless_given_an_account() -> None:
    pod = worker_pod(make_spec())
    assert pod["automountServiceAccountToken"] is False
    given = make_spec(
        workerGroups=[
            {
                "name": "gpu",
                "roles": ["prefill", "decode"],
                "gpus": 1,
                "pod": {"serviceAccountName": "model-reader"},
            }
        ]
    )
    assert "automountServiceAccountToken" not in worker_pod(given)


@pytest.mark.parametrize(
    ("router", "ok"),
    [
        ({}, True),
        ({"serviceType": "ClusterIP"}, True),
        ({"serviceType": "LoadBalancer"}, False),
        ({"serviceType": "NodePort"}, False),
        ({"serviceType": "LoadBalancer", "apiKeySecret": "keys"}, True),
        ({"serviceType": "NodePort", "exposeWithoutKeys": True}, True),
        ({"serviceType": "NodePort", "exposeWithoutKeys": False}, False),
    ],
)
def test_exposing_the_router_needs_keys_in_pydantic_and_cel(
    router: dict[str, Any], ok: bool
) -> None:
    pytest.importorskip("celpy")
    from tests.unit.api.test_api_cel import cel_accepts, decode_spec, pydantic_accepts

    spec = decode_spec(router=router)
    assert pydantic_accepts(spec) is ok
    assert cel_accepts(spec) is ok
    if not ok:
        with pytest.raises(ValueError, match="apiKeySecret"):
            v1.LLMServiceSpec.model_validate(spec)


@pytest.mark.parametrize(
    "router",
    [
        {"exposeWithoutKeys": True},
        {"serviceType": "ClusterIP", "exposeWithoutKeys": True},
        {"serviceType": "LoadBalancer", "apiKeySecret": "keys", "exposeWithoutKeys": True},
    ],
    ids=["cluster-ip-default", "cluster-ip", "with-keys"],
)
def test_expose_without_keys_where_it_does_nothing_is_refused_in_pydantic_and_cel(
    router: dict[str, Any],
) -> None:
    """`exposeWithoutKeys: true` acts only on an exposed Service without `apiKeySecret`: on a
    ClusterIP Service it was ignored, and next to an `apiKeySecret` it read as "no keys needed"
    while the router still demanded them."""
    pytest.importorskip("celpy")
    from tests.unit.api.test_api_cel import cel_accepts, decode_spec, pydantic_accepts

    spec = decode_spec(router=router)
    assert pydantic_accepts(spec) is False
    assert cel_accepts(spec) is False
    with pytest.raises(ValueError, match="exposeWithoutKeys"):
        v1.LLMServiceSpec.model_validate(spec)


def test_model_download_job_gets_no_service_account_token() -> None:
    spec = make_spec(
        model={"name": "llama-8b", "source": "hf://meta/llama@v1", "cache": {"size": "40Gi"}}
    )
    (job,) = [m for m in render.render(spec, render.Observed(REF)) if m["kind"] == "Job"]
    assert job["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
