"""Worker and router pod specs for real clusters: env from Secrets, shm, scheduling, KV transport,
model artifacts. Each CRD field shows up in the rendered pod, or is refused naming the field."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from splitserve.api import v1alpha1 as v1
from splitserve.operator import podspec, render, status, validate

REF = render.ServiceRef(name="llama", namespace="ml", uid="uid-1")


def make_spec(**overrides: Any) -> v1.LLMServiceSpec:
    spec: dict[str, Any] = {
        "model": {"name": "llama-8b", "source": "hf://meta/llama@v1"},
        "engine": {"kind": "vllm", "image": "img:1"},
        "workerGroups": [{"name": "gpu", "roles": ["prefill", "decode"], "gpus": 1}],
        "pools": {"prefill": {"replicas": 1}, "decode": {"replicas": 1}},
    }
    spec.update(overrides)
    return v1.LLMServiceSpec.model_validate(spec)


SIM_MODEL: dict[str, Any] = {"name": "llama-8b", "source": "hf://meta/llama"}
"""`make_spec`'s model without its revision: the sim engine refuses one (it loads no weights)."""


def objects(spec: v1.LLMServiceSpec) -> dict[tuple[str, str], render.Manifest]:
    return {
        (m["kind"], m["metadata"]["name"]): m for m in render.render(spec, render.Observed(REF))
    }


def worker_pod(spec: v1.LLMServiceSpec, group: str = "gpu") -> dict[str, Any]:
    dep = objects(spec)[("Deployment", f"llama-{group}")]
    pod: dict[str, Any] = dep["spec"]["template"]["spec"]
    return pod


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def router_pod(spec: v1.LLMServiceSpec) -> dict[str, Any]:
    pod: dict[str, Any] = objects(spec)[("Deployment", "llama-router")]["spec"]["template"]["spec"]
    return pod


# --- env and secrets -------------------------------------------------------------------------


def test_env_value_from_secret_config_map_and_field_and_env_from() -> None:
    spec = make_spec(
        engine={
            "image": "img:1",
            "env": [
                {"name": "A", "value": "1"},
                {"name": "WANDB_API_KEY", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
                {"name": "B", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "b"}}},
                {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            ],
            "envFrom": [
                {"secretRef": {"name": "all"}, "prefix": "X_"},
                {"configMapRef": {"name": "c"}},
            ],
        }
    )
    container = worker_pod(spec)["containers"][0]
    env = env_of(container)
    assert env["A"] == "1"
    assert env["WANDB_API_KEY"] == {"secretKeyRef": {"name": "s", "key": "k"}}
    assert env["B"] == {"configMapKeyRef": {"name": "c", "key": "b"}}
    assert env["NODE"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert container["envFrom"] == [
        {"secretRef": {"name": "all"}, "prefix": "X_"},
        {"configMapRef": {"name": "c"}},
    ]


def test_hf_token_comes_from_the_auth_secret() -> None:
    spec = make_spec(
        model={"name": "m", "source": "hf://org/m", "authSecret": {"name": "hf", "key": "tok"}}
    )
    env = env_of(worker_pod(spec)["containers"][0])
    assert env["HF_TOKEN"] == {"secretKeyRef": {"name": "hf", "key": "tok"}}


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        ({"name": "HF_TOKEN", "value": "hf_abc"}, "valueFrom.secretKeyRef"),
        ({"name": "DB_PASSWORD", "value": "x"}, "credential"),
        ({"name": "A", "value": "1", "valueFrom": {"fieldRef": {"fieldPath": "x"}}}, "not both"),
        ({"name": "A", "valueFrom": {}}, "exactly one"),
        (
            {
                "name": "A",
                "valueFrom": {
                    "secretKeyRef": {"name": "s", "key": "k"},
                    "configMapKeyRef": {"name": "c", "key": "k"},
                },
            },
            "exactly one",
        ),
    ],
)
def test_bad_env_is_refused_naming_the_field(env: dict[str, Any], needle: str) -> None:
    with pytest.raises(ValidationError, match=needle):
        make_spec(engine={"image": "img:1", "env": [env]})


def test_env_from_needs_exactly_one_source() -> None:
    with pytest.raises(ValidationError, match="envFrom: set exactly one"):
        make_spec(engine={"image": "i", "envFrom": [{"prefix": "A"}]})


# --- shm, scheduling, pod settings -----------------------------------------------------------


@pytest.mark.parametrize(
    ("group", "size"),
    [
        ({"gpus": 1}, "2Gi"),
        ({"gpus": 4, "tensorParallel": 4}, "8Gi"),
        ({"gpus": 0}, None),
        ({"gpus": 1, "shmSize": "16Gi"}, "16Gi"),
        ({"gpus": 1, "shmSize": 0}, None),
    ],
)
def test_dev_shm_is_sized_from_tensor_parallel(group: dict[str, Any], size: str | None) -> None:
    spec = make_spec(workerGroups=[{"name": "gpu", "roles": ["prefill", "decode"], **group}])
    pod = worker_pod(spec)
    shm = [v for v in pod.get("volumes", []) if v["name"] == "dshm"]
    mounts = [m for m in pod["containers"][0].get("volumeMounts", []) if m["name"] == "dshm"]
    if size is None:
        assert not shm
        assert not mounts
    else:
        assert shm == [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": size}}]
        assert mounts == [{"name": "dshm", "mountPath": "/dev/shm"}]


def test_tensor_parallel_beyond_the_pods_gpus_is_refused() -> None:
    with pytest.raises(ValidationError, match=r"tensorParallel: 4 ranks need"):
        make_spec(
            workerGroups=[
                {"name": "g", "roles": ["prefill", "decode"], "gpus": 2, "tensorParallel": 4}
            ]
        )


def test_multi_node_workers_are_refused_clearly() -> None:
    with pytest.raises(
        ValidationError, match=r"multi-node workers .LeaderWorkerSet. are not supported"
    ):
        make_spec(workerGroups=[{"name": "g", "roles": ["prefill", "decode"], "nodes": 2}])


POD_SETTINGS: dict[str, Any] = {
    "annotations": {"k8s.v1.cni.cncf.io/networks": "rdma-net"},
    "labels": {"team": "ml"},
    "nodeSelector": {"pool": "gpu"},
    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    "affinity": {
        "nodeAffinity": {
            "required": [
                {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["h100"]}]}
            ],
            "preferred": [
                {
                    "weight": 10,
                    "preference": {"matchExpressions": [{"key": "z", "operator": "Exists"}]},
                }
            ],
        },
        "podAntiAffinity": {"required": [{"topologyKey": "kubernetes.io/hostname"}]},
        "podAffinity": {
            "preferred": [
                {
                    "weight": 5,
                    "term": {"topologyKey": "zone", "labelSelector": {"matchLabels": {"a": "b"}}},
                }
            ]
        },
    },
    "topologySpread": [{"topologyKey": "topology.kubernetes.io/zone", "maxSkew": 2}],
    "priorityClassName": "llm-serving",
    "runtimeClassName": "nvidia",
    "imagePullSecrets": ["regcred"],
    "volumes": [
        {"name": "scratch", "emptyDir": {"sizeLimit": "10Gi"}},
        {"name": "certs", "secret": {"name": "tls"}},
    ],
    "volumeMounts": [
        {"name": "scratch", "mountPath": "/scratch"},
        {"name": "certs", "mountPath": "/certs", "readOnly": True},
    ],
    "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "h100-pair"}],
}


def check_pod_settings(template: dict[str, Any], own: dict[str, str]) -> None:
    pod, meta = template["spec"], template["metadata"]
    container = pod["containers"][0]
    assert meta["annotations"]["k8s.v1.cni.cncf.io/networks"] == "rdma-net"
    assert meta["labels"]["team"] == "ml"
    assert pod["nodeSelector"] == {"pool": "gpu"}
    assert pod["tolerations"] == POD_SETTINGS["tolerations"]
    aff = pod["affinity"]
    assert aff["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == {
        "nodeSelectorTerms": [
            {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["h100"]}]}
        ]
    }
    assert aff["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]["weight"] == 10
    assert aff["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == [
        {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": own}}
    ]
    assert aff["podAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"] == [
        {
            "weight": 5,
            "podAffinityTerm": {
                "topologyKey": "zone",
                "labelSelector": {"matchLabels": {"a": "b"}},
            },
        }
    ]
    assert pod["topologySpreadConstraints"] == [
        {
            "topologyKey": "topology.kubernetes.io/zone",
            "maxSkew": 2,
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": own},
        }
    ]
    assert pod["priorityClassName"] == "llm-serving"
    assert pod["runtimeClassName"] == "nvidia"
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    vols = {v["name"]: v for v in pod["volumes"]}
    assert vols["scratch"] == {"name": "scratch", "emptyDir": {"sizeLimit": "10Gi"}}
    assert vols["certs"] == {"name": "certs", "secret": {"secretName": "tls"}}
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["certs"] == {"name": "certs", "mountPath": "/certs", "readOnly": True}
    assert pod["resourceClaims"] == [{"name": "gpus", "resourceClaimTemplateName": "h100-pair"}]
    assert container["resources"]["claims"] == [{"name": "gpus"}]


def test_worker_pod_settings_reach_the_pod_template() -> None:
    spec = make_spec(
        workerGroups=[
            {"name": "gpu", "roles": ["prefill", "decode"], "gpus": 1, "pod": POD_SETTINGS}
        ]
    )
    dep = objects(spec)[("Deployment", "llama-gpu")]
    check_pod_settings(dep["spec"]["template"], render.worker_selector("llama", "gpu"))
    # operator labels are kept; the selector still matches the template
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert dep["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_router_pod_gets_the_same_controls() -> None:
    spec = make_spec(router={"pod": POD_SETTINGS})
    dep = objects(spec)[("Deployment", "llama-router")]
    own = {v1.LABEL_SERVICE: "llama", v1.LABEL_COMPONENT: "router"}
    check_pod_settings(dep["spec"]["template"], own)
    vols = [v["name"] for v in dep["spec"]["template"]["spec"]["volumes"]]
    assert vols[0] == "config"  # the router's own config volume stays


@pytest.mark.parametrize(
    ("pod", "needle"),
    [
        ({"labels": {"splitserve.io/role": "decode"}}, "set by the operator"),
        ({"volumes": [{"name": "dshm", "emptyDir": {}}]}, "used by the operator"),
        ({"volumes": [{"name": "a"}]}, "exactly one source"),
        (
            {"volumes": [{"name": "a", "emptyDir": {}, "nfs": {"server": "s", "path": "/"}}]},
            "exactly one",
        ),
        ({"volumeMounts": [{"name": "nope", "mountPath": "/x"}]}, "no volume 'nope'"),
        ({"resourceClaims": [{"name": "c"}]}, "resourceClaimName"),
        ({"tolerations": [{"operator": "Sometimes"}]}, "operator"),
        ({"priorityClassName": "Not_Valid"}, "priorityClassName"),
    ],
)
def test_bad_pod_settings_are_refused(pod: dict[str, Any], needle: str) -> None:
    with pytest.raises(ValidationError, match=needle):
        make_spec(workerGroups=[{"name": "g", "roles": ["prefill", "decode"], "pod": pod}])


@pytest.mark.parametrize(
    ("toleration", "named"),
    [
        ({"key": "k", "operator": "Exists", "value": "v"}, "value"),
        ({"value": "v"}, "key"),
        ({"key": "k", "operator": "Equal", "value": "v", "tolerationSeconds": 60}, "effect"),
    ],
    ids=["value-with-exists", "equal-without-key", "seconds-without-no-execute"],
)
def test_tolerations_the_api_server_refuses_in_a_pod_are_refused_in_the_spec(
    toleration: dict[str, Any], named: str
) -> None:
    """Each was accepted here and rendered into a Deployment whose pods the API server refuses
    (the ReplicaSet retries forever, no worker starts); now pydantic and CEL refuse it."""
    pytest.importorskip("celpy")
    from tests.unit.api.test_api_cel import cel_accepts, pydantic_accepts

    def spec(t: dict[str, Any]) -> dict[str, Any]:
        return {
            "model": {"name": "m", "source": "s"},
            "engine": {"image": "i"},
            "workerGroups": [{"name": "w", "roles": ["decode"], "pod": {"tolerations": [t]}}],
            "pools": {"decode": {"replicas": 1, "minReplicas": 0}},
        }

    assert pydantic_accepts(spec(toleration)) is False
    assert cel_accepts(spec(toleration)) is False
    with pytest.raises(ValidationError, match=rf"tolerations\[\]\.{named}"):
        v1.LLMServiceSpec.model_validate(spec(toleration))
    for ok in (
        {"operator": "Exists"},
        {"key": "k", "value": "v"},
        {"key": "k", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 60},
    ):
        assert pydantic_accepts(spec(ok))
        assert cel_accepts(spec(ok))


def test_router_cannot_take_a_service_account() -> None:
    with pytest.raises(ValidationError, match=r"router\.pod\.serviceAccountName"):
        make_spec(router={"pod": {"serviceAccountName": "x"}})


def test_security_context_is_restricted_friendly() -> None:
    pod = worker_pod(make_spec())
    assert pod["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 65532,
        "runAsGroup": 65532,
        "fsGroup": 65532,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    sc = pod["containers"][0]["securityContext"]
    assert sc == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert router_pod(make_spec())["containers"][0]["securityContext"] == sc
    # The read-only root's writable places: /tmp and HOME, emptyDirs.
    for p in (pod, router_pod(make_spec())):
        c = p["containers"][0]
        mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
        assert mounts["tmp"] == "/tmp"
        assert mounts["home"] == "/var/lib/splitserve"
        assert {"name": "HOME", "value": "/var/lib/splitserve"} in c["env"]
        assert {"name": "tmp", "emptyDir": {}} in p["volumes"]
        env = {e["name"]: e.get("value") for e in c["env"]}
        for name in (
            "XDG_CACHE_HOME",
            "XDG_CONFIG_HOME",
            "HF_HOME",
            "VLLM_CACHE_ROOT",
            "VLLM_CONFIG_ROOT",
            "TRITON_CACHE_DIR",
            "TORCHINDUCTOR_CACHE_DIR",
        ):
            assert env[name].startswith("/var/lib/splitserve/"), name  # the writable home


def test_a_cache_variable_the_user_sets_is_kept_once() -> None:
    engine = {"kind": "vllm", "image": "img:1", "env": [{"name": "HF_HOME", "value": "/models/hf"}]}
    pod = worker_pod(make_spec(engine=engine))
    env = [e for e in pod["containers"][0]["env"] if e["name"] == "HF_HOME"]
    assert env == [{"name": "HF_HOME", "value": "/models/hf"}]


# --- KV transport ----------------------------------------------------------------------------


def test_kv_transfer_rdma_requests_device_ipc_lock_and_sets_ucx() -> None:
    spec = make_spec(
        kvTransfer={
            "transports": ["rdma", "nvlink"],
            "netDevices": "mlx5_0:1",
            "rdmaResource": "rdma/ib",
            "rdmaCount": 2,
            "sideChannelPort": 5601,
            "env": [{"name": "UCX_IB_GID_INDEX", "value": "3"}],
        }
    )
    c = worker_pod(spec)["containers"][0]
    env = env_of(c)
    assert env["UCX_TLS"] == "rc,cuda_ipc,sm,self,cuda_copy"
    assert env["UCX_NET_DEVICES"] == "mlx5_0:1"
    assert env["UCX_IB_GID_INDEX"] == "3"
    assert env["SPLITSERVE_NIXL_BACKENDS"] == "UCX"
    assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert "--nixl-port=5601" in c["args"]
    assert {"name": "nixl", "containerPort": 5601, "protocol": "TCP"} in c["ports"]
    assert c["resources"]["requests"]["rdma/ib"] == "2"
    assert c["resources"]["limits"]["rdma/ib"] == "2"
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert c["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]


def test_kv_transfer_tcp_has_no_ipc_lock_and_libfabric_has_no_ucx_tls() -> None:
    c = worker_pod(make_spec(kvTransfer={"transports": ["tcp"]}))["containers"][0]
    assert env_of(c)["UCX_TLS"] == "tcp,sm,self,cuda_copy"
    assert "add" not in c["securityContext"]["capabilities"]
    c = worker_pod(
        make_spec(kvTransfer={"backend": "LIBFABRIC", "rdmaResource": "vpc.amazonaws.com/efa"})
    )["containers"][0]
    env = env_of(c)
    assert "UCX_TLS" not in env
    assert env["SPLITSERVE_NIXL_BACKENDS"] == "LIBFABRIC"
    assert c["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]
    with pytest.raises(ValidationError, match="UCX transports need backend UCX"):
        make_spec(kvTransfer={"backend": "LIBFABRIC", "transports": ["tcp"]})


@pytest.mark.parametrize(
    ("kv", "named"),
    [
        ({"rdmaCount": 2}, "kvTransfer.rdmaCount"),
        ({"backend": "LIBFABRIC", "netDevices": "mlx5_0:1"}, "kvTransfer.netDevices"),
        ({"backend": "LIBFABRIC", "transports": ["tcp"]}, "kvTransfer.transports"),
    ],
    ids=["rdma-count-without-resource", "net-devices-with-libfabric", "transports-libfabric"],
)
def test_kv_transfer_settings_that_would_do_nothing_are_refused_in_pydantic_and_cel(
    kv: dict[str, Any], named: str
) -> None:
    """`rdmaCount` counts `rdmaResource` devices (none requested without one: the count was
    ignored); `netDevices` is `UCX_NET_DEVICES`, which the LIBFABRIC backend never reads."""
    pytest.importorskip("celpy")
    from tests.unit.api.test_api_cel import cel_accepts, decode_spec, pydantic_accepts

    spec = decode_spec(kvTransfer=kv)
    assert pydantic_accepts(spec) is False
    assert cel_accepts(spec) is False
    with pytest.raises(ValidationError, match=named):
        v1.LLMServiceSpec.model_validate(spec)
    ok = {**spec, "kvTransfer": {"rdmaCount": 2, "rdmaResource": "rdma/ib", "netDevices": "x"}}
    assert pydantic_accepts(ok)
    assert cel_accepts(ok)


def test_gpu_resource_without_gpus_is_refused_in_pydantic_and_cel() -> None:
    """`gpuResource` names what `gpus` requests; with no gpus nothing is requested and it was
    ignored (a group meant for AMD or TPU nodes silently ran on CPU-only pods)."""
    pytest.importorskip("celpy")
    from tests.unit.api.test_api_cel import cel_accepts, pydantic_accepts

    def spec(group: dict[str, Any]) -> dict[str, Any]:
        return {
            "model": {"name": "m", "source": "s"},
            "engine": {"image": "i"},
            "workerGroups": [{"name": "gpu", "roles": ["decode"], **group}],
            "pools": {"decode": {"replicas": 1, "minReplicas": 0}},
        }

    bad = spec({"gpuResource": "amd.com/gpu"})
    assert pydantic_accepts(bad) is False
    assert cel_accepts(bad) is False
    with pytest.raises(ValidationError, match=r"workerGroups\[gpu\]\.gpuResource"):
        v1.LLMServiceSpec.model_validate(bad)
    good = spec({"gpuResource": "amd.com/gpu", "gpus": 1})
    assert pydantic_accepts(good)
    assert cel_accepts(good)
    pod = worker_pod(v1.LLMServiceSpec.model_validate(good))
    assert pod["containers"][0]["resources"]["limits"]["amd.com/gpu"] == "1"


def test_vllm_cpu_workers_keep_their_kv_cache_in_huge_pages() -> None:
    """vLLM on a CPU group gets THP_MEM_ALLOC_ENABLE=1 (torch's huge pages for the KV cache);
    GPU groups and the simulated engine do not; a user's own engine.env value replaces it."""
    cpu = {"workerGroups": [{"name": "cpu", "roles": ["prefill", "decode"], "gpus": 0}]}
    env = env_of(worker_pod(make_spec(**cpu), "cpu")["containers"][0])
    assert env["THP_MEM_ALLOC_ENABLE"] == "1"
    assert "THP_MEM_ALLOC_ENABLE" not in env_of(worker_pod(make_spec())["containers"][0])
    sim = make_spec(**cpu, engine={"kind": "sim", "image": "img:1"}, model=SIM_MODEL)
    assert "THP_MEM_ALLOC_ENABLE" not in env_of(worker_pod(sim, "cpu")["containers"][0])
    own = make_spec(
        **cpu,
        engine={
            "kind": "vllm",
            "image": "img:1",
            "env": [{"name": "THP_MEM_ALLOC_ENABLE", "value": "0"}],
        },
    )
    entries = [
        e
        for e in worker_pod(own, "cpu")["containers"][0]["env"]
        if e["name"] == "THP_MEM_ALLOC_ENABLE"
    ]
    assert entries == [{"name": "THP_MEM_ALLOC_ENABLE", "value": "0"}]


def test_no_kv_transfer_keeps_the_defaults() -> None:
    c = worker_pod(make_spec())["containers"][0]
    assert not [e for e in env_of(c) if e.startswith(("UCX_", "VLLM_NIXL", "SPLITSERVE_NIXL"))]
    assert not [a for a in c["args"] if a.startswith("--nixl-port")]


def test_sim_engine_refuses_kv_transfer_and_cache() -> None:
    base = {"image": "i", "kind": "sim"}
    with pytest.raises(ValidationError, match="kvTransfer: the sim engine"):
        make_spec(engine=base, kvTransfer={})
    with pytest.raises(ValidationError, match=r"model\.cache: the sim engine"):
        make_spec(engine=base, model={"name": "m", "source": "hf://a/b", "cache": {"size": "1Gi"}})


def test_sim_engine_refuses_engine_args_naming_each_field() -> None:
    """They went after `--` on the sim workers' command line, which ignored them (now the
    worker refuses them too, so the pods would not start)."""
    base = {"image": "i", "kind": "sim"}
    groups = [
        {"name": "a", "roles": ["prefill"], "engineArgs": ["--enforce-eager"]},
        {"name": "b", "roles": ["decode"]},
    ]
    with pytest.raises(ValidationError) as err:
        make_spec(
            engine={**base, "args": ["--max-model-len", "8"]}, workerGroups=groups, model=SIM_MODEL
        )
    assert validate.spec_errors(err.value) == [
        "spec: engine.args, workerGroups[a].engineArgs: engine arguments apply to engine.kind "
        "vllm only; the sim engine takes none"
    ]
    with pytest.raises(ValidationError, match=r"^(?s:.*)workerGroups\[a\]\.engineArgs: engine"):
        make_spec(engine=base, workerGroups=groups, model=SIM_MODEL)
    assert make_spec(engine=base, model=SIM_MODEL).engine.args == []
    vllm = make_spec(engine={"image": "i", "args": ["--max-model-len", "8"]}, workerGroups=groups)
    assert worker_pod(vllm, "a")["containers"][0]["args"][-4:] == [
        "--",
        "--max-model-len",
        "8",
        "--enforce-eager",
    ]


# --- model artifacts -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "kind", "location", "extra"),
    [
        ("hf://meta/llama@abc", v1.SourceKind.HF, "meta/llama", {"revision": "abc"}),
        ("meta/llama", v1.SourceKind.HF, "meta/llama", {}),
        ("gpt2", v1.SourceKind.HF, "gpt2", {}),
        ("pvc://models/meta/llama", v1.SourceKind.PVC, "models", {"path": "meta/llama"}),
        ("pvc://models", v1.SourceKind.PVC, "models", {"path": ""}),
        ("oci://ghcr.io/org/llama:1", v1.SourceKind.OCI, "ghcr.io/org/llama:1", {}),
        ("file:///opt/model", v1.SourceKind.FILE, "/opt/model", {}),
        ("/opt/model", v1.SourceKind.FILE, "/opt/model", {}),
    ],
)
def test_model_source_uris(
    source: str, kind: v1.SourceKind, location: str, extra: dict[str, Any]
) -> None:
    parsed = v1.parse_model_source(source)
    assert (parsed.kind, parsed.location) == (kind, location)
    for k, v in extra.items():
        assert getattr(parsed, k) == v


@pytest.mark.parametrize(
    ("model", "needle"),
    [
        ({"source": "s3://bucket/x"}, "unknown scheme 's3'"),
        ({"source": "hf://org/m@"}, "hf://<org>/<name>"),
        ({"source": "pvc://Bad_Claim/x"}, "pvc://<claim>"),
        ({"source": "pvc://c/../etc"}, "pvc://<claim>"),
        ({"source": "file://relative"}, "absolute path"),
        ({"source": "hf://a/b@v1", "revision": "v2"}, "differs"),
        ({"source": "pvc://c/x", "cache": {"size": "1Gi"}}, "cache holds hf://"),
        ({"source": "hf://a/b", "cache": {}}, "model.cache.size: required"),
        ({"source": "hf://a/b", "cache": {"size": "lots"}}, "not a quantity"),
    ],
)
def test_bad_model_sources_are_refused(model: dict[str, Any], needle: str) -> None:
    with pytest.raises(ValidationError, match=needle):
        make_spec(model={"name": "m", **model})


def test_hf_with_cache_downloads_once_and_workers_start_offline() -> None:
    spec = make_spec(
        model={
            "name": "m",
            "source": "hf://meta/llama@abc",
            "authSecret": {"name": "hf", "key": "HF_TOKEN"},
            "cache": {"size": "40Gi", "storageClassName": "nfs", "mountPath": "/cache"},
        }
    )
    out = objects(spec)
    pvc = out[("PersistentVolumeClaim", "llama-model-cache")]
    assert pvc["spec"] == {
        "accessModes": ["ReadWriteMany"],
        "resources": {"requests": {"storage": "40Gi"}},
        "storageClassName": "nfs",
    }
    jobs = [m for k, m in out.items() if k[0] == "Job"]
    assert len(jobs) == 1
    job = jobs[0]
    assert job["metadata"]["name"] == render.model_cache_job_name(spec, REF)
    jc = job["spec"]["template"]["spec"]["containers"][0]
    jenv = env_of(jc)
    assert jenv["MODEL_REPO"] == "meta/llama"
    assert jenv["MODEL_REVISION"] == "abc"
    assert jenv["MODEL_DIR"] == "/cache/hf/meta/llama/abc"
    assert jenv["HF_TOKEN"] == {"secretKeyRef": {"name": "hf", "key": "HF_TOKEN"}}
    assert jc["volumeMounts"][0] == {"name": "model-cache", "mountPath": "/cache"}
    assert [m["name"] for m in jc["volumeMounts"][1:]] == ["tmp", "home"]
    pod = worker_pod(spec)
    c = pod["containers"][0]
    assert "--model=/cache/hf/meta/llama/abc" in c["args"]
    assert not [a for a in c["args"] if a.startswith("--revision")]
    env = env_of(c)
    assert env["HF_HUB_OFFLINE"] == "1"
    assert {"name": "model-cache", "mountPath": "/cache", "readOnly": True} in c["volumeMounts"]
    assert {
        "name": "model-cache",
        "persistentVolumeClaim": {"claimName": "llama-model-cache"},
    } in pod["volumes"]
    (init,) = pod["initContainers"]
    assert env_of(init)["MODEL_MARKER"] == "/cache/hf/meta/llama/abc/.splitserve-complete"


def test_given_claim_is_used_not_created_and_a_new_revision_is_a_new_job() -> None:
    def spec_for(rev: str) -> v1.LLMServiceSpec:
        cache = {"claimName": "shared-models"}
        return make_spec(model={"name": "m", "source": f"hf://a/b@{rev}", "cache": cache})

    out = objects(spec_for("v1"))
    assert not [k for k in out if k[0] == "PersistentVolumeClaim"]
    job = next(m for k, m in out.items() if k[0] == "Job")
    vols = job["spec"]["template"]["spec"]["volumes"]
    assert vols[0] == {
        "name": "model-cache",
        "persistentVolumeClaim": {"claimName": "shared-models"},
    }
    assert [v["name"] for v in vols[1:]] == ["tmp", "home"]
    assert render.model_cache_job_name(spec_for("v1"), REF) != render.model_cache_job_name(
        spec_for("v2"), REF
    )


@pytest.mark.parametrize(
    ("cache", "named"),
    [
        ({"claimName": "shared-models", "size": "200Gi"}, "model.cache.size"),
        (
            {"claimName": "shared-models", "storageClassName": "fast"},
            "model.cache.storageClassName",
        ),
        ({"claimName": "shared-models", "accessMode": "ReadWriteOnce"}, "model.cache.accessMode"),
    ],
    ids=["size", "storage-class", "access-mode"],
)
def test_settings_of_the_created_claim_are_refused_with_a_given_claim(
    cache: dict[str, Any], named: str
) -> None:
    """`size`, `storageClassName` and `accessMode` describe the claim the operator creates;
    with `claimName` none is created and they were ignored."""
    pytest.importorskip("celpy")
    from tests.unit.api.test_api_cel import cel_accepts, pydantic_accepts

    model: dict[str, Any] = {"name": "m", "source": "hf://a/b@v1"}
    spec: dict[str, Any] = {
        "model": {**model, "cache": cache},
        "engine": {"image": "i"},
        "workerGroups": [{"name": "w", "roles": ["decode"]}],
        "pools": {"decode": {"replicas": 1, "minReplicas": 0}},
    }
    assert pydantic_accepts(spec) is False
    assert cel_accepts(spec) is False
    with pytest.raises(ValidationError, match=named):
        v1.LLMServiceSpec.model_validate(spec)
    for ok in ({"claimName": "shared-models", "accessMode": "ReadWriteMany"}, {"size": "1Gi"}):
        good = {**spec, "model": {**model, "cache": ok}}
        assert pydantic_accepts(good)
        assert cel_accepts(good)


def test_hf_without_cache_downloads_in_each_pod() -> None:
    spec = make_spec(model={"name": "m", "source": "hf://a/b@v3"})
    c = worker_pod(spec)["containers"][0]
    assert "--model=a/b" in c["args"]
    assert "--revision=v3" in c["args"]
    assert not [k for k in objects(spec) if k[0] in ("Job", "PersistentVolumeClaim")]
    art = status.artifact_status(spec, REF, None)
    assert art.phase is v1.ArtifactPhase.PER_POD


@pytest.mark.parametrize(
    ("source", "volume", "model_arg"),
    [
        (
            "pvc://models/meta/llama",
            {"name": "model", "persistentVolumeClaim": {"claimName": "models", "readOnly": True}},
            "/models/meta/llama",
        ),
        (
            "oci://ghcr.io/org/w:1",
            {
                "name": "model",
                "image": {"reference": "ghcr.io/org/w:1", "pullPolicy": "IfNotPresent"},
            },
            "/models",
        ),
        ("file:///opt/w", None, "/opt/w"),
    ],
)
def test_in_place_sources_mount_read_only(
    source: str, volume: dict[str, Any] | None, model_arg: str
) -> None:
    spec = make_spec(model={"name": "m", "source": source, "tokenizer": "org/tok"})
    pod = worker_pod(spec)
    c = pod["containers"][0]
    assert f"--model={model_arg}" in c["args"]
    if volume is None:
        assert "model" not in [v["name"] for v in pod.get("volumes", [])]
    else:
        assert volume in pod["volumes"]
        assert {"name": "model", "mountPath": "/models", "readOnly": True} in c["volumeMounts"]
    assert "initContainers" not in pod
    assert status.artifact_status(spec, REF, None).phase is v1.ArtifactPhase.READY


@pytest.mark.parametrize("source", ["pvc://models/meta/llama", "oci://ghcr.io/org/w:1"])
def test_sim_workers_mount_no_model_volume(source: str) -> None:
    """The simulated engine loads no weights: its pods do not wait for a claim or an image
    volume they would never read (before: mounted, so a missing claim kept them Pending)."""
    spec = make_spec(
        model={"name": "m", "source": source}, engine={"kind": "sim", "image": "img:1"}
    )
    pod = worker_pod(spec)
    c = pod["containers"][0]
    assert "model" not in [v["name"] for v in pod.get("volumes", [])]
    assert "model" not in [m["name"] for m in c.get("volumeMounts", [])]
    assert "initContainers" not in pod
    assert "model" not in [v["name"] for v in router_pod(spec).get("volumes", [])]


@pytest.mark.parametrize(
    ("job_status", "phase"),
    [
        (None, v1.ArtifactPhase.PENDING),
        (
            {"active": 1, "startTime": "2026-01-01T00:00:00Z", "failed": 1},
            v1.ArtifactPhase.DOWNLOADING,
        ),
        ({"succeeded": 1}, v1.ArtifactPhase.READY),
        (
            {
                "failed": 7,
                "conditions": [
                    {"type": "Failed", "status": "True", "message": "BackoffLimitExceeded"}
                ],
            },
            v1.ArtifactPhase.FAILED,
        ),
    ],
)
def test_artifact_status_follows_the_download_job(
    job_status: dict[str, Any] | None, phase: v1.ArtifactPhase
) -> None:
    spec = make_spec(model={"name": "m", "source": "hf://a/b", "cache": {"size": "1Gi"}})
    job = None if job_status is None else {"status": job_status}
    art = status.artifact_status(spec, REF, job)
    assert art.phase is phase
    assert art.job == render.model_cache_job_name(spec, REF)
    assert art.path == "/models/hf/a/b/main"
    if phase is v1.ArtifactPhase.FAILED:
        assert "BackoffLimitExceeded" in art.message
    if phase is v1.ArtifactPhase.DOWNLOADING:
        assert "1 failed attempt" in art.message


def test_shm_and_cache_volumes_never_collide_with_user_volumes() -> None:
    assert {podspec.SHM_VOLUME, podspec.CACHE_VOLUME, podspec.MODEL_VOLUME} <= v1.RESERVED_VOLUMES


def test_ready_condition_says_the_model_is_downloading() -> None:
    spec = make_spec(model={"name": "m", "source": "hf://a/b", "cache": {"size": "1Gi"}})
    job = {"status": {"active": 1, "startTime": "2026-01-01T00:00:00Z"}}
    art = status.artifact_status(spec, REF, job)
    st = status.service_status(
        spec=spec,
        ref=REF,
        desired={},
        workers=[],
        pods=status.PodCounts(total=2),
        router=None,
        previous=None,
        now="2026-01-01T00:01:00Z",
        generation=1,
        artifact=art,
    )
    ready = next(c for c in st.conditions if c.type == "Ready")
    assert ready.status is v1.ConditionStatus.FALSE
    assert ready.reason == "ModelDownloading"
    assert "kubectl logs -n ml job/" in ready.message
    assert st.model_artifact == art


def test_download_job_takes_its_own_pod_settings() -> None:
    cache = {
        "size": "1Gi",
        "accessMode": "ReadWriteOnce",
        "downloadPod": {
            "nodeSelector": {"kubernetes.io/hostname": "gpu-node-1"},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
            "serviceAccountName": "model-reader",
        },
    }
    spec = make_spec(model={"name": "m", "source": "hf://a/b", "cache": cache})
    job = next(m for k, m in objects(spec).items() if k[0] == "Job")
    pod = job["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"kubernetes.io/hostname": "gpu-node-1"}
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists"}]
    assert pod["serviceAccountName"] == "model-reader"
    pvc = objects(spec)[("PersistentVolumeClaim", "llama-model-cache")]
    assert pvc["spec"]["accessModes"] == ["ReadWriteOnce"]
    with pytest.raises(ValidationError, match="the download needs no devices"):
        make_spec(
            model={
                "name": "m",
                "source": "hf://a/b",
                "cache": {
                    "size": "1Gi",
                    "downloadPod": {"resourceClaims": [{"name": "g", "resourceClaimName": "c"}]},
                },
            }
        )


@pytest.mark.parametrize(
    ("model", "tokenizer", "mounted"),
    [
        ({"source": "hf://a/b@v1"}, "a/b", False),
        ({"source": "hf://a/b@v1", "cache": {"size": "1Gi"}}, "/models/hf/a/b/v1", True),
        ({"source": "pvc://models/x"}, "/models/x", True),
        ({"source": "oci://r/w:1"}, "/models", True),
        ({"source": "pvc://models/x", "tokenizer": "org/tok"}, "org/tok", False),
        ({"source": "file:///w", "tokenizer": "org/tok"}, "org/tok", False),
    ],
)
def test_router_loads_the_tokenizer_the_workers_load(
    model: dict[str, Any], tokenizer: str, mounted: bool
) -> None:
    spec = make_spec(model={"name": "m", "authSecret": {"name": "hf", "key": "t"}, **model})
    out = objects(spec)
    config = yaml.safe_load(out[("ConfigMap", "llama-router")]["data"]["router.yaml"])
    assert config["model"]["tokenizer"] == tokenizer
    pod = router_pod(spec)
    c = pod["containers"][0]
    assert env_of(c)["HF_TOKEN"] == {"secretKeyRef": {"name": "hf", "key": "t"}}
    mounts = [m for m in c["volumeMounts"] if m["name"] in ("model", "model-cache")]
    assert bool(mounts) == mounted
    assert all(m["readOnly"] for m in mounts)
    has_wait = "initContainers" in pod
    assert has_wait == ("cache" in model and "tokenizer" not in model)


def test_file_source_needs_a_tokenizer_for_the_router() -> None:
    with pytest.raises(ValidationError, match=r"model\.tokenizer: required with a file:// source"):
        make_spec(model={"name": "m", "source": "file:///w"})
    sim = make_spec(engine={"kind": "sim", "image": "i"}, model={"name": "m", "source": "/w"})
    config = yaml.safe_load(objects(sim)[("ConfigMap", "llama-router")]["data"]["router.yaml"])
    assert "tokenizer" not in config["model"]  # the sim engine's own tokenizer
