"""render(spec, observed): names, selectors without roles, owner references, pool sizes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import pytest
import yaml

from splitserve.api import v1alpha1 as v1
from splitserve.core.roles import Role
from splitserve.operator import render

REF = render.ServiceRef(name="llama", namespace="ml", uid="uid-1")


def make_spec(**overrides: Any) -> v1.LLMServiceSpec:
    spec: dict[str, Any] = {
        "model": {"name": "llama-8b", "source": "meta/llama"},
        "engine": {"kind": "vllm", "image": "img:1", "args": ["--max-model-len", "8192"]},
        "workerGroups": [{"name": "h100", "roles": ["prefill", "decode"], "gpus": 1}],
        "pools": {"prefill": {"replicas": 2}, "decode": {"replicas": 3}},
    }
    spec.update(overrides)
    return v1.LLMServiceSpec.model_validate(spec)


def by_kind(manifests: list[render.Manifest]) -> dict[tuple[str, str], render.Manifest]:
    return {(m["kind"], m["metadata"]["name"]): m for m in manifests}


def test_renders_every_child_once() -> None:
    out = by_kind(render.render(make_spec(), render.Observed(REF)))
    assert sorted(out) == [
        ("ConfigMap", "llama-router"),
        ("Deployment", "llama-h100"),
        ("Deployment", "llama-router"),
        ("LLMPool", "llama-decode"),
        ("LLMPool", "llama-prefill"),
        ("NetworkPolicy", "llama-router"),
        ("NetworkPolicy", "llama-workers"),
        ("Role", "llama-router"),
        ("RoleBinding", "llama-router"),
        ("Service", "llama"),
        ("ServiceAccount", "llama-router"),
    ]
    for m in out.values():
        assert m["metadata"]["namespace"] == "ml"
        assert m["metadata"]["ownerReferences"] == [render.owner_reference(REF)]
        assert m["metadata"]["labels"][v1.LABEL_SERVICE] == "llama"


def test_render_is_deterministic() -> None:
    a = render.render(make_spec(), render.Observed(REF))
    b = render.render(make_spec(), render.Observed(REF))
    assert render.fingerprint(a) == render.fingerprint(b)


def test_role_is_never_in_a_selector() -> None:
    for m in render.render(make_spec(), render.Observed(REF)):
        if m["kind"] == "Deployment":
            assert v1.LABEL_ROLE not in m["spec"]["selector"]["matchLabels"]
            assert v1.LABEL_ROLE not in m["spec"]["template"]["metadata"]["labels"]
            sel = m["spec"]["selector"]["matchLabels"]
            assert sel.items() <= m["spec"]["template"]["metadata"]["labels"].items()


def test_group_size_is_the_sum_of_its_pools() -> None:
    dep = by_kind(render.render(make_spec(), render.Observed(REF)))[("Deployment", "llama-h100")]
    assert dep["spec"]["replicas"] == 5
    container = dep["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert container["args"][-3:] == ["--", "--max-model-len", "8192"]
    assert "--role=prefill" in container["args"]


def test_fixed_group_size_and_first_group_serves_a_pool() -> None:
    spec = make_spec(
        workerGroups=[
            {"name": "a", "roles": ["prefill"], "replicas": 4},
            {"name": "b", "roles": ["prefill", "decode"]},
        ]
    )
    assert render.group_replicas(spec, {Role.PREFILL: 2, Role.DECODE: 3}) == {"a": 4, "b": 5}


@pytest.mark.parametrize(
    ("mode", "exists", "replicas_written", "desired"),
    [
        ("Managed", False, 3, 3),
        ("Managed", True, 3, 3),
        ("Manual", False, 3, 3),
        ("Manual", True, None, 7),
        ("External", True, None, 7),
    ],
)
def test_who_owns_pool_replicas(
    mode: str, exists: bool, replicas_written: int | None, desired: int
) -> None:
    spec = make_spec(scaling={"mode": mode})
    observed = render.Observed(REF, pool_replicas={Role.DECODE: 7} if exists else {})
    pool = render.llm_pool(spec, observed, Role.DECODE)
    assert pool["spec"].get("replicas") == replicas_written
    assert pool["spec"]["role"] == "decode"
    assert render.desired_replicas(spec, observed)[Role.DECODE] == desired


def test_router_config_and_rollout_on_change() -> None:
    spec = make_spec(sloClasses=[{"name": "chat", "ttftMs": 500, "tpotMs": 50}])
    out = by_kind(render.render(spec, render.Observed(REF, router_image="r:1")))
    config = yaml.safe_load(out[("ConfigMap", "llama-router")]["data"]["router.yaml"])
    assert config["discovery"]["selector"] == (
        "splitserve.io/component=worker,splitserve.io/service=llama"
    )
    assert config["discovery"]["roleLabel"] == v1.LABEL_ROLE
    assert config["defaultSloClass"] == "chat"
    dep = out[("Deployment", "llama-router")]
    assert dep["spec"]["template"]["spec"]["containers"][0]["image"] == "r:1"
    hash_a = dep["spec"]["template"]["metadata"]["annotations"][render.CONFIG_HASH]
    spec_b = make_spec(sloClasses=[{"name": "chat", "ttftMs": 400, "tpotMs": 50}])
    dep_b = by_kind(render.render(spec_b, render.Observed(REF)))[("Deployment", "llama-router")]
    assert dep_b["spec"]["template"]["metadata"]["annotations"][render.CONFIG_HASH] != hash_a
    svc = out[("Service", "llama")]
    assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]


def test_role_selector() -> None:
    assert render.role_selector("llama", Role.DECODE) == (
        "splitserve.io/component=worker,splitserve.io/role=decode,splitserve.io/service=llama"
    )


def test_rendered_builtins_validate() -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    for m in render.render(make_spec(), render.Observed(REF)):
        if m["apiVersion"].startswith(v1.GROUP):
            continue
        kubernetes_validate.validate(m, "1.35.0", strict=True)


def test_router_reads_the_rendered_config() -> None:
    """Contract with the router: every key of the ConfigMap is one it knows."""
    from splitserve.api.router import RouterFile

    spec = make_spec(sloClasses=[{"name": "chat", "ttftMs": 500, "tpotMs": 50}])
    config_map = by_kind(render.render(spec, render.Observed(REF)))[("ConfigMap", "llama-router")]
    parsed, ignored = RouterFile.from_configmap(yaml.safe_load(config_map["data"]["router.yaml"]))
    assert ignored == ()
    router = parsed.router_config()
    assert router.model_name == "llama-8b"
    assert router.http_port == 8000
    assert router.discovery is not None


def test_worker_and_router_accept_the_rendered_command_lines(tmp_path: Path) -> None:
    """Contract with the CLIs: the pods' arguments parse (nothing is run)."""
    from splitserve.cli.router import router as router_cli
    from splitserve.cli.worker import worker as worker_cli

    # vLLM: engine arguments after `--` are refused with the sim engine (spec and worker CLI).
    spec = make_spec(engine={"kind": "vllm", "image": "i", "args": ["--foo", "1"]})
    out = by_kind(render.render(spec, render.Observed(REF)))
    worker_args = out[("Deployment", "llama-h100")]["spec"]["template"]["spec"]["containers"][0]
    assert worker_args["args"][:2] == ["worker", "serve"]
    serve = worker_cli.get_command(click.Context(worker_cli), "serve")
    assert serve is not None
    ctx = serve.make_context("serve", list(worker_args["args"][2:]))
    assert ctx.params["role"] == "prefill"
    assert ctx.params["engine_args"] == ("--foo", "1")
    config = tmp_path / "router.yaml"
    config.write_text(out[("ConfigMap", "llama-router")]["data"]["router.yaml"])
    router_args = out[("Deployment", "llama-router")]["spec"]["template"]["spec"]["containers"][0]
    args = [
        a if not a.startswith("--config=") else f"--config={config}" for a in router_args["args"]
    ]
    assert args[:2] == ["router", "serve"]
    serve = router_cli.get_command(click.Context(router_cli), "serve")
    assert serve is not None
    ctx = serve.make_context("serve", args[2:])
    assert ctx.params["host"] == "0.0.0.0"
