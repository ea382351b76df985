"""CRD fields whose effect no other test showed (docs/crd-fields.md names these tests): each is
set to a value other than its default and found where it acts (the rendered objects, the
router's class table, the control loop), or refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from splitserve.api import v1alpha1 as v1
from splitserve.core.clock import ManualClock
from splitserve.core.roles import Role
from splitserve.obs.metrics import RouterMetrics
from splitserve.operator import render
from splitserve.router.slo import SloRuntime
from tests.fakes.kube import FakeWorkers, MemoryKube
from tests.unit.operator.test_operator_control import Env
from tests.unit.operator.test_operator_reconcile import NS, add_pods, make_service, roles, run
from tests.unit.operator.test_render_pod import (
    POD_SETTINGS,
    REF,
    env_of,
    make_spec,
    objects,
    router_pod,
    worker_pod,
)


def router_yaml(spec: v1.LLMServiceSpec) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(
        objects(spec)[("ConfigMap", "llama-router")]["data"]["router.yaml"]
    )
    return data


# --- model and engine ------------------------------------------------------------------------


def test_model_name_reaches_the_router_and_the_workers() -> None:
    spec = make_spec(model={"name": "team-llama", "source": "hf://meta/llama@v1"})
    assert router_yaml(spec)["model"]["name"] == "team-llama"
    assert "--served-model-name=team-llama" in worker_pod(spec)["containers"][0]["args"]


def test_engine_image_and_pull_policy_reach_the_workers() -> None:
    spec = make_spec(engine={"kind": "vllm", "image": "reg/vllm:7", "imagePullPolicy": "Always"})
    c = worker_pod(spec)["containers"][0]
    assert (c["image"], c["imagePullPolicy"]) == ("reg/vllm:7", "Always")
    assert worker_pod(make_spec())["containers"][0]["imagePullPolicy"] == "IfNotPresent"


def test_download_image_and_pull_policy_reach_the_download_job() -> None:
    def job_container(spec: v1.LLMServiceSpec) -> dict[str, Any]:
        job = next(m for k, m in objects(spec).items() if k[0] == "Job")
        c: dict[str, Any] = job["spec"]["template"]["spec"]["containers"][0]
        return c

    model = {"name": "m", "source": "hf://a/b@v1", "cache": {"size": "1Gi"}}
    engine = {"kind": "vllm", "image": "reg/vllm:7", "imagePullPolicy": "Never"}
    c = job_container(make_spec(model=model, engine=engine))
    assert (c["image"], c["imagePullPolicy"]) == ("reg/vllm:7", "Never")
    own = {**model, "cache": {"size": "1Gi", "downloadImage": "reg/hf-get:2"}}
    assert job_container(make_spec(model=own, engine=engine))["image"] == "reg/hf-get:2"


def test_download_pod_settings_reach_the_download_job() -> None:
    settings = {k: v for k, v in POD_SETTINGS.items() if k != "resourceClaims"}
    model = {"name": "m", "source": "hf://a/b", "cache": {"size": "1Gi", "downloadPod": settings}}
    job = next(m for k, m in objects(make_spec(model=model)).items() if k[0] == "Job")
    template = job["spec"]["template"]
    pod, meta = template["spec"], template["metadata"]
    own = render.service_labels("llama", "model-download")
    assert meta["annotations"]["k8s.v1.cni.cncf.io/networks"] == "rdma-net"
    assert meta["labels"]["team"] == "ml"
    assert pod["nodeSelector"] == {"pool": "gpu"}
    assert pod["tolerations"] == POD_SETTINGS["tolerations"]
    aff = pod["affinity"]
    assert aff["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == [
        {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": own}}
    ]
    assert aff["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]["weight"] == 10
    assert pod["topologySpreadConstraints"][0]["labelSelector"] == {"matchLabels": own}
    assert pod["priorityClassName"] == "llm-serving"
    assert pod["runtimeClassName"] == "nvidia"
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert {"name": "certs", "secret": {"secretName": "tls"}} in pod["volumes"]
    mounts = pod["containers"][0]["volumeMounts"]
    assert {"name": "certs", "mountPath": "/certs", "readOnly": True} in mounts


def test_engine_args_then_group_engine_args_follow_the_double_dash() -> None:
    spec = make_spec(
        engine={"kind": "vllm", "image": "i", "args": ["--max-model-len", "8192"]},
        workerGroups=[
            {"name": "gpu", "roles": ["prefill", "decode"], "gpus": 1, "engineArgs": ["--a=1"]}
        ],
    )
    args = worker_pod(spec)["containers"][0]["args"]
    assert args[args.index("--") :] == ["--", "--max-model-len", "8192", "--a=1"]
    assert "--" not in worker_pod(make_spec())["containers"][0]["args"]


def test_engine_ports_reach_the_workers_the_router_and_the_policy() -> None:
    spec = make_spec(engine={"kind": "vllm", "image": "i", "grpcPort": 7001, "metricsPort": 7002})
    c = worker_pod(spec)["containers"][0]
    assert {"--grpc-port=7001", "--metrics-port=7002"} <= set(c["args"])
    ports = {p["containerPort"] for p in c["ports"]}
    assert {7001, 7002} <= ports
    assert router_yaml(spec)["discovery"]["grpcPort"] == 7001
    policy = objects(spec)[("NetworkPolicy", "llama-workers")]["spec"]["ingress"]
    assert policy[0]["ports"] == [{"protocol": "TCP", "port": 7001}]
    assert policy[2]["ports"] == [{"protocol": "TCP", "port": 7002}]


# --- worker groups ---------------------------------------------------------------------------


def test_group_name_names_the_deployment_and_its_selector() -> None:
    spec = make_spec(workerGroups=[{"name": "h200", "roles": ["prefill", "decode"]}])
    dep = objects(spec)[("Deployment", "llama-h200")]
    assert dep["spec"]["selector"]["matchLabels"][v1.LABEL_GROUP] == "h200"
    assert router_yaml(spec)["discovery"]["ownerDeployments"] == ["llama-h200"]


def test_gpus_and_gpu_resource_are_requested_and_limited() -> None:
    group = {"name": "gpu", "roles": ["prefill", "decode"], "gpus": 2, "gpuResource": "amd.com/gpu"}
    res = worker_pod(make_spec(workerGroups=[group]))["containers"][0]["resources"]
    assert res["requests"]["amd.com/gpu"] == "2"
    assert res["limits"]["amd.com/gpu"] == "2"
    assert "nvidia.com/gpu" not in res["limits"]
    cpu_only = {"name": "gpu", "roles": ["prefill", "decode"]}
    res = worker_pod(make_spec(workerGroups=[cpu_only]))["containers"][0]["resources"]
    assert "nvidia.com/gpu" not in res.get("limits", {})


def test_tensor_parallel_reaches_the_worker_command_line() -> None:
    group = {"name": "gpu", "roles": ["prefill", "decode"], "gpus": 4, "tensorParallel": 4}
    args = worker_pod(make_spec(workerGroups=[group]))["containers"][0]["args"]
    assert "--tensor-parallel-size=4" in args


def test_group_resources_and_node_selector_reach_the_worker_pod() -> None:
    group = {
        "name": "gpu",
        "roles": ["prefill", "decode"],
        "gpus": 1,
        "resources": {"requests": {"cpu": "8", "memory": "64Gi"}, "limits": {"memory": "80Gi"}},
        "nodeSelector": {"gpu": "h100"},
    }
    pod = worker_pod(make_spec(workerGroups=[group]))
    res = pod["containers"][0]["resources"]
    assert res["requests"] == {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "1"}
    assert res["limits"] == {"memory": "80Gi", "nvidia.com/gpu": "1"}
    assert pod["nodeSelector"] == {"gpu": "h100"}
    with pytest.raises(ValueError, match=r"nodeSelector or pod\.nodeSelector, not both"):
        make_spec(workerGroups=[{**group, "pod": {"nodeSelector": {"a": "b"}}}])


# --- pools -----------------------------------------------------------------------------------


@pytest.mark.parametrize("role", ["prefill", "decode", "mixed"])
def test_pool_bounds_reach_the_llmpools(role: str) -> None:
    """Each role's pool: replicas, minReplicas and maxReplicas on its LLMPool, replicas in the
    size of the group serving it; maxReplicas left out stays out."""
    other = "decode" if role != "decode" else "prefill"
    spec = make_spec(
        workerGroups=[{"name": "gpu", "roles": [role, other], "gpus": 1}],
        pools={role: {"replicas": 2, "minReplicas": 1, "maxReplicas": 4}, other: {"replicas": 3}},
    )
    out = objects(spec)
    assert out[("LLMPool", f"llama-{role}")]["spec"] == {
        "service": "llama",
        "role": role,
        "replicas": 2,
        "minReplicas": 1,
        "maxReplicas": 4,
    }
    assert "maxReplicas" not in out[("LLMPool", f"llama-{other}")]["spec"]
    assert out[("Deployment", "llama-gpu")]["spec"]["replicas"] == 5


# --- SLO classes -----------------------------------------------------------------------------


def test_slo_class_settings_reach_the_routers_class_table(tmp_path: Path) -> None:
    """percentile, attainment, sheddable and allowOverrides travel through router.yaml into the
    router's class table (`SloRuntime`), and percentile / attainment into the control loop."""
    from splitserve.cli.router import config_from_file
    from splitserve.operator.control.loop import class_targets

    given = {
        "name": "chat",
        "ttftMs": 300,
        "tpotMs": 40,
        "percentile": 0.99,
        "attainment": 0.95,
        "sheddable": True,
        "allowOverrides": True,
    }
    spec = make_spec(sloClasses=[given])
    path = tmp_path / "router.yaml"
    path.write_text(yaml.safe_dump(router_yaml(spec)))
    config = config_from_file(path, {"tokenizer_dir": "/tok"})
    runtime = SloRuntime(config.slo, ManualClock(), RouterMetrics(CollectorRegistry()))
    cls = runtime.table.resolve("chat")
    assert (cls.percentile, cls.attainment, cls.sheddable, cls.allow_overrides) == (
        0.99,
        0.95,
        True,
        True,
    )
    [target] = class_targets(spec.slo_classes)
    assert (target.percentile, target.attainment) == (0.99, 0.95)


# --- router ----------------------------------------------------------------------------------


def test_router_deployment_and_service_settings() -> None:
    spec = make_spec(
        router={
            "replicas": 3,
            "image": "reg/router:9",
            "httpPort": 8080,
            "grpcPort": 9090,
            "serviceType": "LoadBalancer",
            "apiKeySecret": "keys",
            "resources": {"requests": {"cpu": "2"}, "limits": {"memory": "4Gi"}},
        }
    )
    out = objects(spec)
    dep = out[("Deployment", "llama-router")]
    assert dep["spec"]["replicas"] == 3
    c = router_pod(spec)["containers"][0]
    assert c["image"] == "reg/router:9"
    assert [p["containerPort"] for p in c["ports"]] == [8080, 9090]
    assert c["resources"] == {"requests": {"cpu": "2"}, "limits": {"memory": "4Gi"}}
    svc = out[("Service", "llama")]["spec"]
    assert svc["type"] == "LoadBalancer"
    assert [p["port"] for p in svc["ports"]] == [8080, 9090]
    assert router_yaml(spec)["listen"] == {"httpPort": 8080, "grpcPort": 9090}
    assert router_pod(make_spec())["containers"][0]["image"] == render.Observed(REF).router_image


# --- scaling, flipping -----------------------------------------------------------------------


def test_scaling_settings_reach_the_control_loop() -> None:
    """intervalSeconds is the loop's next wait; windowSeconds the observation's window;
    scaleDownStabilizationSeconds how long a lower size must be wanted before a scale-down."""

    def scale_downs_within(stabilization: float, ticks: int) -> dict[str, int]:
        env = Env(
            scaling={
                "mode": "Managed",
                "intervalSeconds": 10,
                "scaleDownStabilizationSeconds": stabilization,
                "windowSeconds": 30,
            }
        )
        env.tick(0.0)
        for _ in range(3):
            env.tick(n=300, prompt=2000, output=200)
        peak = env.pools_spec()
        assert peak["prefill"] > 1, peak
        for _ in range(ticks):
            env.tick(n=1, prompt=2000, output=200)
        return env.pools_spec()

    for interval, window in ((10, 30), (20, 60)):
        env = Env(scaling={"mode": "Managed", "intervalSeconds": interval, "windowSeconds": window})
        env.tick(0.0)
        spans = []
        for _ in range(6):
            result = env.tick(float(interval), n=10, prompt=100, output=10)
            assert result.interval_s == interval
            assert result.observation is not None
            spans.append(result.observation.window_s)
        assert max(spans) == window, spans
    # Five 10 s ticks of low load: within a 300 s stabilization nothing is given back; with 0
    # the pools shrink at once.
    held = scale_downs_within(300, 5)
    shrunk = scale_downs_within(0, 5)
    assert shrunk["prefill"] < held["prefill"]


def test_flipping_settings_reach_the_flip_planner() -> None:
    """`kubectl scale` moving two workers from decode to prefill: with flipping enabled and
    maxConcurrent 2 both flip in one pass; with maxConcurrent 1 one flips first; with flipping
    disabled none flips (the pools change size by pods only)."""

    def flipped(flipping: dict[str, Any]) -> list[str]:
        kube, workers = MemoryKube(), FakeWorkers()
        make_service(
            kube, pools={"prefill": {"replicas": 1}, "decode": {"replicas": 3}}, flipping=flipping
        )
        add_pods(kube, 4)
        run(kube, workers)
        kube.patch(v1.API_VERSION, "LLMPool", NS, "tiny-prefill", {"spec": {"replicas": 3}})
        kube.patch(v1.API_VERSION, "LLMPool", NS, "tiny-decode", {"spec": {"replicas": 1}})
        workers.calls.clear()
        run(kube, workers)
        return sorted(r for r in roles(kube).values() if r)

    assert flipped({"maxConcurrent": 2}) == ["decode", "prefill", "prefill", "prefill"]
    assert flipped({"maxConcurrent": 1}) == ["decode", "decode", "prefill", "prefill"]
    assert flipped({"enabled": False}) == ["decode", "decode", "decode", "prefill"]


# --- kvTransfer, network policy --------------------------------------------------------------


def test_ipc_lock_overrides_the_transport_default() -> None:
    def caps(kv: dict[str, Any]) -> list[str]:
        c = worker_pod(make_spec(kvTransfer=kv))["containers"][0]
        added: list[str] = c["securityContext"]["capabilities"].get("add", [])
        return added

    assert caps({"transports": ["rdma"]}) == ["IPC_LOCK"]
    assert caps({"transports": ["rdma"], "ipcLock": False}) == []
    assert caps({"transports": ["tcp"]}) == []
    assert caps({"transports": ["tcp"], "ipcLock": True}) == ["IPC_LOCK"]


def test_operator_labels_reach_the_network_policies() -> None:
    labels = {"app": "my-operator"}
    spec = make_spec(
        networkPolicy={
            "operatorLabels": labels,
            "routerFrom": [{"namespaceSelector": {"matchLabels": {"team": "a"}}}],
        }
    )
    out = objects(spec)
    operator = {"namespaceSelector": {}, "podSelector": {"matchLabels": labels}}
    workers = out[("NetworkPolicy", "llama-workers")]["spec"]["ingress"]
    assert operator in workers[0]["from"]
    routers = out[("NetworkPolicy", "llama-router")]["spec"]["ingress"]
    assert routers[1]["from"] == [operator]
    assert env_of(worker_pod(spec)["containers"][0])  # the pod still renders


def test_the_llmpool_role_is_what_the_operator_counts() -> None:
    kube, workers = MemoryKube(), FakeWorkers()
    make_service(kube)
    add_pods(kube, 3)
    run(kube, workers)
    pool = kube.get(v1.API_VERSION, "LLMPool", NS, "tiny-decode")
    assert pool is not None
    assert pool["spec"]["role"] == Role.DECODE.value
    assert pool["status"]["replicas"] == 2
    assert pool["status"]["selector"] == render.role_selector("tiny", Role.DECODE)


def test_every_edge_field_reaches_the_routers_edge_settings(tmp_path: Path) -> None:
    """Each `router.edge` field, set to a value other than the router's default, is what the
    router reads from the rendered router.yaml."""
    from splitserve.api.router_edge import EdgeSettings
    from tests.unit.operator.test_operator_router_edge import router_reads

    edge = {
        "maxBodyBytes": 4096,
        "maxPromptChars": 999,
        "maxStopStrings": 3,
        "maxStopStringChars": 77,
        "maxConnections": 12,
        "headerTimeoutSeconds": 4,
        "bodyTimeoutSeconds": 9,
        "idleTimeoutSeconds": 11,
        "inlineTokenizeMaxChars": 100,
        "tokenizerThreads": 5,
        "drainGraceSeconds": 7,
        "allowUnknownFields": True,
        "toolCallParser": "pythonic",
    }
    assert len(edge) == len(v1.RouterEdgeSpec.model_fields)
    got = router_reads({"edge": edge}, tmp_path)
    defaults = EdgeSettings()
    differ = {n for n in EdgeSettings.model_fields if getattr(got, n) != getattr(defaults, n)}
    assert differ == set(EdgeSettings.model_fields)
    assert got == EdgeSettings(**v1.RouterEdgeSpec.model_validate(edge).settings_fields())


def test_drain_timeout_sets_the_workers_termination_grace() -> None:
    spec = make_spec(flipping={"drainTimeoutSeconds": 300})
    assert worker_pod(spec)["terminationGracePeriodSeconds"] == 330


def test_engine_kind_reaches_the_workers_and_the_router() -> None:
    for kind in ("vllm", "sim"):
        spec = make_spec(engine={"kind": kind, "image": "i"}, model={"name": "m", "source": "o/m"})
        assert f"--engine={kind}" in worker_pod(spec)["containers"][0]["args"]
        assert router_yaml(spec)["engine"] == {"kind": kind}


def test_backend_discovery_settings_reach_the_router(tmp_path: Path) -> None:
    from tests.unit.operator.test_operator_stock_backends import router_reads

    found = {
        "selector": "app=vllm",
        "roleLabel": "vllm/role",
        "fencedLabel": "vllm/fenced",
        "httpPort": 8443,
        "scheme": "https",
    }
    got = router_reads({"backendDiscovery": found}, tmp_path).backend_discovery
    assert got is not None
    assert (got.selector, got.role_label, got.fenced_label, got.http_port, got.scheme) == (
        "app=vllm",
        "vllm/role",
        "vllm/fenced",
        8443,
        "https",
    )


def test_an_edit_of_an_llmpools_bounds_is_put_back_and_said() -> None:
    """The LLMPool's minReplicas / maxReplicas are written from the service's pools: an edit of
    them on the LLMPool is put back at the next reconcile, with a Warning Event and the
    SpecApplied condition naming the field and where to change it (it was put back silently).
    A change of the service's bounds reaches the pool with no such warning."""
    kube, workers = MemoryKube(), FakeWorkers()
    make_service(kube, pools={"prefill": {"replicas": 1}, "decode": {"replicas": 2}})
    add_pods(kube, 3)
    run(kube, workers)
    run(kube, workers)

    def pool() -> dict[str, Any]:
        obj = kube.get(v1.API_VERSION, "LLMPool", NS, "tiny-decode")
        assert obj is not None
        spec: dict[str, Any] = obj["spec"]
        return spec

    def warnings() -> list[str]:
        """The BoundsReverted Events (beside the one the SpecApplied transition posts)."""
        return [
            e["message"]
            for e in kube.list("v1", "Event", NS)
            if e["reason"] == "BoundsReverted" and not e["message"].startswith("SpecApplied=")
        ]

    def applied() -> dict[str, Any]:
        svc = kube.get(v1.API_VERSION, "LLMService", NS, "tiny")
        assert svc is not None
        return next(c for c in svc["status"]["conditions"] if c["type"] == "SpecApplied")

    kube.patch(
        v1.API_VERSION,
        "LLMService",
        NS,
        "tiny",
        {"spec": {"pools": {"decode": {"maxReplicas": 4}}}},
    )
    run(kube, workers)
    assert (pool()["minReplicas"], pool()["maxReplicas"]) == (0, 4)
    assert warnings() == []
    assert applied()["status"] == "True"

    kube.patch(
        v1.API_VERSION, "LLMPool", NS, "tiny-decode", {"spec": {"minReplicas": 2, "maxReplicas": 9}}
    )
    run(kube, workers)
    assert (pool()["minReplicas"], pool()["maxReplicas"]) == (0, 4)
    [message] = warnings()
    assert "LLMPool tiny-decode spec.minReplicas 2, spec.maxReplicas 9" in message
    assert "put back to 0, 4" in message
    assert "spec.pools.decode" in message
    assert (applied()["status"], applied()["reason"]) == ("False", "BoundsReverted")
    run(kube, workers)  # still explained, not warned again ...
    assert applied()["reason"] == "BoundsReverted"
    assert len(warnings()) == 1
    kube.patch(
        v1.API_VERSION,
        "LLMService",
        NS,
        "tiny",
        {"spec": {"pools": {"decode": {"maxReplicas": 5}}}},
    )
    run(kube, workers)  # ... until the service changes
    assert applied()["status"] == "True"
    assert len(warnings()) == 1


@pytest.mark.parametrize(
    ("field", "old", "new"), [("service", "tiny", "other"), ("role", "decode", "prefill")]
)
def test_an_llmpools_service_and_role_cannot_change(field: str, old: str, new: str) -> None:
    """The operator writes an LLMPool's service and role once, from its name, and puts an edit
    back at the next reconcile (silently, it was); the API server now refuses the edit, naming
    the field (a CEL transition rule: `oldSelf` is the stored object)."""
    celpy = pytest.importorskip("celpy")
    from splitserve.api import crds

    node = crds.openapi_schema(crds.LLM_POOL)["properties"]["spec"]["properties"][field]
    rules = node.get("x-kubernetes-validations", [])
    assert rules, f"spec.{field} has no rule"
    env = celpy.Environment()
    for rule in rules:
        assert field in rule["message"]
        program = env.program(env.compile(rule["rule"]))
        same = {"self": celpy.json_to_cel(old), "oldSelf": celpy.json_to_cel(old)}
        changed = {"self": celpy.json_to_cel(new), "oldSelf": celpy.json_to_cel(old)}
        assert program.evaluate(same)
        assert not program.evaluate(changed)


@pytest.mark.parametrize(
    ("network_policy", "named"),
    [
        ({"enabled": False, "routerFrom": [{"ipBlock": {"cidr": "10.0.0.0/8"}}]}, "routerFrom"),
        ({"enabled": False, "metricsFrom": [{"ipBlock": {"cidr": "10.0.0.0/8"}}]}, "metricsFrom"),
        ({"enabled": False, "operatorLabels": {"app": "my-operator"}}, "operatorLabels"),
    ],
    ids=["router-from", "metrics-from", "operator-labels"],
)
def test_network_policy_settings_beside_enabled_false_are_refused(
    network_policy: dict[str, Any], named: str
) -> None:
    """With `networkPolicy.enabled: false` no NetworkPolicy is rendered, so routerFrom,
    metricsFrom and operatorLabels did nothing (accepted silently); both sides refuse them,
    naming the field. The default operatorLabels beside false is no setting: accepted."""
    pytest.importorskip("celpy")
    from pydantic import ValidationError

    from tests.unit.api.test_api_cel import cel_accepts, decode_spec, pydantic_accepts

    spec = decode_spec(networkPolicy=network_policy)
    assert cel_accepts(spec) is False
    with pytest.raises(ValidationError, match=rf"networkPolicy\.{named}: read only with"):
        v1.LLMServiceSpec.model_validate(spec)
    for ok in (
        {**network_policy, "enabled": True},
        {"enabled": False},
        {"enabled": False, "operatorLabels": dict(v1.OPERATOR_LABELS)},
    ):
        assert cel_accepts(decode_spec(networkPolicy=ok)), ok
        assert pydantic_accepts(decode_spec(networkPolicy=ok)), ok


@pytest.mark.parametrize(
    "model",
    [
        {"name": "m", "source": "org/m", "revision": "v1"},
        {"name": "m", "source": "hf://org/m@v1"},
        {"name": "m", "source": "org/m@v1"},
    ],
    ids=["revision", "hf-at-revision", "bare-at-revision"],
)
def test_a_model_revision_with_the_sim_engine_is_refused(model: dict[str, Any]) -> None:
    """The sim engine loads no weights and its router the local tokenizer (unless
    model.tokenizer): a revision was passed to nothing. Both sides refuse it, naming it; the
    same model with vLLM passes, and a sim source without a revision too."""
    pytest.importorskip("celpy")
    from pydantic import ValidationError

    from tests.unit.api.test_api_cel import cel_accepts, decode_spec, pydantic_accepts

    sim = decode_spec(model=model, engine={"image": "i", "kind": "sim"})
    assert cel_accepts(sim) is False
    with pytest.raises(ValidationError, match=r"model\.revision: the sim engine"):
        v1.LLMServiceSpec.model_validate(sim)
    vllm = decode_spec(model=model, engine={"image": "i", "kind": "vllm"})
    assert cel_accepts(vllm)
    assert pydantic_accepts(vllm)
    for source in ("org/m", "hf://org/m", "pvc://claim/m", "oci://reg/m@sha256:ab", "/w"):
        plain = decode_spec(
            model={"name": "m", "source": source}, engine={"image": "i", "kind": "sim"}
        )
        assert cel_accepts(plain), source
        assert pydantic_accepts(plain), source


def test_the_attainment_target_decides_slo_at_risk() -> None:
    """80 % of the class's requests meet their SLO: at risk against a 95 % target, not against
    70 % (the observed latencies are well within the targets either way)."""

    def at_risk(attainment: float) -> dict[str, Any]:
        env = Env(
            sloClasses=[{"name": "chat", "ttftMs": 2000, "tpotMs": 100, "attainment": attainment}]
        )
        env.tick(0.0)
        for _ in range(2):
            env.router.serve(16, met=False, prompt=500, output=100)
            env.tick(n=64, prompt=500, output=100)
        assert env.status()["sloClasses"][0]["attainment"] == 0.8
        return env.condition("SLOAtRisk")

    assert at_risk(0.7)["status"] == "False"
    risky = at_risk(0.95)
    assert risky["status"] == "True"
    assert risky["message"].startswith("class chat: attainment 80.0% < 95%")


def test_an_auth_secret_the_sim_engine_never_reads_is_refused() -> None:
    """With the sim engine the workers download nothing and the router loads the local
    tokenizer unless model.tokenizer names a Hugging Face repository: HF_TOKEN was mounted for
    nothing. Both sides refuse model.authSecret then; with a hub tokenizer (the router
    downloads it) or with vLLM it acts."""
    pytest.importorskip("celpy")
    from pydantic import ValidationError

    from tests.unit.api.test_api_cel import cel_accepts, decode_spec, pydantic_accepts

    secret = {"name": "hf", "key": "token"}
    sim = {"image": "i", "kind": "sim"}
    for tokenizer in (None, "/tok"):
        model = {"name": "m", "source": "org/m", "authSecret": secret}
        if tokenizer is not None:
            model["tokenizer"] = tokenizer
        spec = decode_spec(model=model, engine=sim)
        assert cel_accepts(spec) is False, tokenizer
        with pytest.raises(ValidationError, match=r"model\.authSecret: the sim engine"):
            v1.LLMServiceSpec.model_validate(spec)
    hub = decode_spec(
        model={"name": "m", "source": "org/m", "authSecret": secret, "tokenizer": "org/tok"},
        engine=sim,
    )
    vllm = decode_spec(model={"name": "m", "source": "org/m", "authSecret": secret})
    for ok in (hub, vllm):
        assert cel_accepts(ok), ok
        assert pydantic_accepts(ok), ok
    router = router_pod(v1.LLMServiceSpec.model_validate(hub))
    assert env_of(router["containers"][0])["HF_TOKEN"] == {"secretKeyRef": secret}


@pytest.mark.parametrize("image", ["", " reg/vllm:7", "reg/vllm:7 ", "reg/vllm 7"])
@pytest.mark.parametrize("field", ["engine.image", "router.image", "model.cache.downloadImage"])
def test_an_image_that_is_empty_or_has_whitespace_is_refused_naming_the_field(
    field: str, image: str
) -> None:
    """Found by the operator probe: `router.image: ""`, `engine.image: " reg/vllm:7"` and
    `downloadImage: "reg/vllm 7"` were accepted (the API server then refused the Deployment
    or Job, or the kubelet failed with InvalidImageName): an image reference has no
    whitespace. Refused in the model and in the CRD's schema (the API server), naming the
    field."""
    import jsonschema
    from pydantic import ValidationError

    from splitserve.api import crds

    model: dict[str, Any] = {"name": "m", "source": "hf://a/b@v1", "cache": {"size": "1Gi"}}
    body: dict[str, Any] = {"model": model, "engine": {"kind": "vllm", "image": "reg/vllm:7"}}
    where, key = field.rsplit(".", 1)
    node = body
    for part in where.split("."):
        node = node.setdefault(part, {})
    node[key] = image
    with pytest.raises(ValidationError) as err:
        make_spec(**body)
    assert f"'{key}'" in str(err.value) or key in str(err.value)
    schema = crds.structural_schema(v1.LLMServiceSpec)
    for part in [*where.split("."), key]:
        schema = schema["properties"][part]
    assert jsonschema.Draft4Validator(schema).is_valid(image) is False
    assert jsonschema.Draft4Validator(schema).is_valid("reg/vllm:7")
