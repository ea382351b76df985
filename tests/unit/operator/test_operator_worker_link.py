"""`spec.router.workerLink` (issue 17's stream link on Kubernetes): CRD -> rendered router.yaml
`pool.link` -> `RouterConfig.pool.link`; the workers' fixed link port (`--link-port`, a named
containerPort, the NetworkPolicy rule admitting the router pods); bad values refused.

The NetworkPolicy is checked as rendered only: kmock (the emulated API server) stores policies
but enforces none, so no test here shows a pod being refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import pytest
import yaml
from pydantic import ValidationError

from splitserve.api import v1alpha1 as v1
from splitserve.api.router import PoolSettings, RouterFile
from splitserve.cli.router import config_from_file
from splitserve.operator import render, validate
from tests.unit.operator.test_render_pod import make_spec, objects, worker_pod

ROOT = Path(__file__).resolve().parents[3]


def router_yaml(spec: v1.LLMServiceSpec) -> str:
    text: str = objects(spec)[("ConfigMap", "llama-router")]["data"][render.CONFIG_KEY]
    return text


@pytest.mark.parametrize(
    ("router", "link"),
    [({}, "stream"), ({"workerLink": "grpc"}, "grpc"), ({"workerLink": "stream"}, "stream")],
    ids=["default", "grpc", "stream"],
)
def test_worker_link_reaches_the_router(router: dict[str, Any], link: str, tmp_path: Path) -> None:
    text = router_yaml(make_spec(router=router))
    assert yaml.safe_load(text)["pool"] == {"link": link}
    path = tmp_path / render.CONFIG_KEY
    path.write_text(text)
    assert config_from_file(path, {}).pool.link == link


def test_workers_listen_on_a_fixed_link_port_whatever_the_link() -> None:
    from splitserve.cli.worker import worker as worker_cli

    grpc, stream = make_spec(router={"workerLink": "grpc"}), make_spec()
    port = render.worker_link_port(grpc)
    assert port == render.LINK_PORT_BASE == 50053
    (container,) = worker_pod(stream)["containers"]
    assert f"--link-port={port}" in container["args"]
    assert {"name": "link", "containerPort": port, "protocol": "TCP"} in container["ports"]
    serve = worker_cli.get_command(click.Context(worker_cli), "serve")
    assert serve is not None
    ctx = serve.make_context("serve", [a for a in container["args"][2:] if a != "--"])
    assert ctx.params["link_port"] == port
    # Switching the link changes the router's file only: the worker pods (model loads) stay.
    assert worker_pod(grpc) == worker_pod(stream)
    assert router_yaml(grpc) != router_yaml(stream)


@pytest.mark.parametrize(
    "overrides",
    [
        {"engine": {"kind": "vllm", "image": "i", "grpcPort": 50053}},
        {"engine": {"kind": "vllm", "image": "i", "metricsPort": 50053}},
        {"engine": {"kind": "vllm", "image": "i", "grpcPort": 50052, "metricsPort": 50054}},
        {"kvTransfer": {"sideChannelPort": 50053}},
    ],
    ids=["grpc-on-it", "metrics-on-it", "health-pushed-on-it", "nixl-on-it"],
)
def test_link_port_moves_off_the_other_worker_ports(overrides: dict[str, Any]) -> None:
    (container,) = worker_pod(make_spec(**overrides))["containers"]
    ports = [p["containerPort"] for p in container["ports"]]
    assert len(set(ports)) == len(ports), container["ports"]
    link = next(p["containerPort"] for p in container["ports"] if p["name"] == "link")
    assert link != render.LINK_PORT_BASE
    assert f"--link-port={link}" in container["args"]


def test_network_policy_admits_the_router_pods_to_the_link_port() -> None:
    spec = make_spec(router={"workerLink": "stream"})
    rules = objects(spec)[("NetworkPolicy", "llama-workers")]["spec"]["ingress"]
    port = render.worker_link_port(spec)
    on_link = [r for r in rules if {"protocol": "TCP", "port": port} in r.get("ports", [])]
    routers = {"matchLabels": {v1.LABEL_SERVICE: "llama", v1.LABEL_COMPONENT: "router"}}
    assert on_link == [
        {"from": [{"podSelector": routers}], "ports": [{"protocol": "TCP", "port": port}]}
    ]
    # The gRPC rule names the same router selector (and the operator besides).
    [grpc] = [
        r for r in rules if {"protocol": "TCP", "port": spec.engine.grpc_port} in r.get("ports", [])
    ]
    assert grpc["from"][0] == {"podSelector": routers}


def test_a_bad_link_is_refused_naming_the_field() -> None:
    obj = yaml.safe_load((ROOT / "deploy/examples/llmservice-sim.yaml").read_text())
    obj["spec"].setdefault("router", {})["workerLink"] = "quic"
    found = validate.validate_object(
        obj, validate.load_crd_schemas(ROOT / "charts/splitserve/crds")
    )
    assert len(found) == 1, found
    assert found[0].endswith("spec.router.workerLink: 'quic' is not one of ['grpc', 'stream']")
    with pytest.raises(ValidationError, match="workerLink"):
        make_spec(router={"workerLink": "quic"})
    with pytest.raises(ValidationError, match="link"):
        RouterFile.from_configmap({"model": {"name": "m", "source": "s"}, "pool": {"link": "quic"}})
    obj["spec"]["router"]["workerLink"] = "stream"
    assert (
        validate.validate_object(obj, validate.load_crd_schemas(ROOT / "charts/splitserve/crds"))
        == []
    )


def test_a_router_file_without_pool_gets_the_documented_default_link() -> None:
    """router.yaml without `pool` (written by hand, or by an operator older than `pool.link`)
    means the same link as a file that names none of the router's settings: `stream`."""
    file, _ = RouterFile.from_configmap({"model": {"name": "m", "source": "s"}})
    assert file.pool.link is v1.WorkerLink.STREAM
    assert file.router_config().pool.link == PoolSettings().link == "stream"
