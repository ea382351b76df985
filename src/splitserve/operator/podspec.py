"""Pod-spec pieces for real clusters: model artifacts, env from Secrets, shm, scheduling, KV
transport, security context. Pure: the `LLMService` spec in, Kubernetes dicts out.

`render` assembles them into the worker and router Deployments and the model-cache objects:

- **Model artifacts** (`model.source`): `hf://` with `model.cache` is downloaded once by a Job
  into a shared PersistentVolumeClaim (the operator's `<service>-model-cache` or a given one);
  worker pods mount it read-only, wait in an init container until the Job wrote its completion
  marker, and load the directory offline (`HF_HUB_OFFLINE=1`). `hf://` without a cache: every
  pod downloads at start (as vLLM does by itself). `pvc://` mounts a claim read-only, `oci://`
  mounts an image volume (Kubernetes 1.33+), `file://` is a path already in the container.
- **Secrets**: `HF_TOKEN` and `engine.env[].valueFrom` reach containers as `secretKeyRef`s; no
  value is ever read or written by the operator.
- **KV transport** (`kvTransfer`, vLLM): `UCX_TLS` / `UCX_NET_DEVICES`, the NIXL backend, the
  side-channel host (the pod IP) and port, the RDMA device resource and `IPC_LOCK`.
- **vLLM on CPU** (a group without GPUs): `THP_MEM_ALLOC_ENABLE=1` (the KV cache in huge pages).
- **Security**: no privilege escalation, every capability dropped except `IPC_LOCK` where RDMA
  needs it, the runtime's default seccomp profile (what Pod Security "restricted" asks, minus
  `runAsNonRoot`, which depends on the image).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from splitserve.api import v1alpha1 as v1

Obj = dict[str, Any]

CACHE_VOLUME: Final = "model-cache"
MODEL_VOLUME: Final = "model"
SHM_VOLUME: Final = "dshm"
READY_MARKER: Final = ".splitserve-complete"
"""Written by the download Job into the model directory when the download is complete."""
SHM_PER_RANK_GI: Final = 2
"""Default `/dev/shm` per tensor-parallel rank, in GiB (NCCL and vLLM's worker processes)."""
DOWNLOAD_BACKOFF: Final = 6

DOWNLOAD_SCRIPT: Final = """\
import os, pathlib, sys
from huggingface_hub import snapshot_download
d = pathlib.Path(os.environ["MODEL_DIR"])
marker = d / ".splitserve-complete"
if marker.exists():
    print(f"{d}: already complete"); sys.exit(0)
print(f"downloading {os.environ['MODEL_REPO']}@{os.environ['MODEL_REVISION']} into {d}", flush=True)
snapshot_download(os.environ["MODEL_REPO"], revision=os.environ["MODEL_REVISION"], local_dir=d)
marker.write_text(os.environ["MODEL_REVISION"] + "\\n")
print(f"{d}: complete", flush=True)
"""
"""The download Job's program (runs in an image with `huggingface_hub`, e.g. any vLLM image)."""

WAIT_SCRIPT: Final = (
    'until [ -f "$MODEL_MARKER" ]; do echo "waiting for $MODEL_MARKER (model download Job)"; '
    "sleep 10; done"
)

UCX_TRANSPORT: Final[Mapping[v1.KvTransport, str]] = {
    v1.KvTransport.RDMA: "rc",
    v1.KvTransport.TCP: "tcp",
    v1.KvTransport.NVLINK: "cuda_ipc",
}


def k8s(model: v1.Model) -> Obj:
    """A model as a Kubernetes object: camelCase, unset and empty fields left out."""
    out: Obj = _compact(model.wire())
    return out


def _compact(node: Any) -> Any:
    if isinstance(node, dict):
        kept = {k: _compact(v) for k, v in node.items()}
        return {k: v for k, v in kept.items() if v not in ({}, [])}
    if isinstance(node, list):
        return [_compact(v) for v in node]
    return node


# ---------------------------------------------------------------------------------------------
# Model artifacts


@dataclass(frozen=True, slots=True)
class Artifact:
    """How the workers get the weights."""

    source: v1.ModelSource
    model_arg: str
    """`--model` of the worker: a directory in the pod, or a repository id it downloads."""
    revision_arg: str | None = None
    """`--revision` of the worker (only when it downloads by itself)."""
    volumes: list[Obj] = field(default_factory=list)
    mounts: list[Obj] = field(default_factory=list)
    env: list[Obj] = field(default_factory=list)
    marker: str | None = None
    """A file the init container waits for before the engine starts."""
    cache_claim: str | None = None
    claim_created: bool = False
    """The operator creates `cache_claim` (no `model.cache.claimName`)."""
    directory: str | None = None


def cache_claim_name(service: str) -> str:
    return f"{service}-model-cache"


def hf_token_env(spec: v1.LLMServiceSpec) -> list[Obj]:
    ref = spec.model.auth_secret
    if ref is None:
        return []
    return [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": k8s(ref)}}]


def artifact(spec: v1.LLMServiceSpec, service: str = "") -> Artifact:
    """How the workers of `service` get the weights (`service` only names the claim the operator
    creates; the model path does not depend on it)."""
    src = spec.model.parsed_source()
    token = hf_token_env(spec)
    if src.kind is v1.SourceKind.HF:
        revision = src.revision or spec.model.revision
        cache = spec.model.cache
        if cache is None:
            return Artifact(src, src.location, revision_arg=revision, env=token)
        claim = cache.claim_name or cache_claim_name(service)
        directory = f"{cache.mount_path.rstrip('/')}/hf/{src.location}/{revision or 'main'}"
        offline = [
            {"name": "HF_HUB_OFFLINE", "value": "1"},
            {"name": "TRANSFORMERS_OFFLINE", "value": "1"},
        ]
        tokenizer = spec.model.tokenizer
        needs_hub = tokenizer is not None and not tokenizer.startswith("/")
        return Artifact(
            src,
            directory,
            volumes=[{"name": CACHE_VOLUME, "persistentVolumeClaim": {"claimName": claim}}],
            mounts=[{"name": CACHE_VOLUME, "mountPath": cache.mount_path, "readOnly": True}],
            env=[*token, *([] if needs_hub else offline)],
            marker=f"{directory}/{READY_MARKER}",
            cache_claim=claim,
            claim_created=cache.claim_name is None,
            directory=directory,
        )
    if src.kind is v1.SourceKind.PVC:
        claim_vol = {"claimName": src.location, "readOnly": True}
        return Artifact(
            src,
            f"/models/{src.path}".rstrip("/") if src.path else "/models",
            volumes=[{"name": MODEL_VOLUME, "persistentVolumeClaim": claim_vol}],
            mounts=[{"name": MODEL_VOLUME, "mountPath": "/models", "readOnly": True}],
            env=token,
            directory=f"/models/{src.path}".rstrip("/"),
        )
    if src.kind is v1.SourceKind.OCI:
        image = {"reference": src.location, "pullPolicy": "IfNotPresent"}
        return Artifact(
            src,
            "/models",
            volumes=[{"name": MODEL_VOLUME, "image": image}],
            mounts=[{"name": MODEL_VOLUME, "mountPath": "/models", "readOnly": True}],
            env=token,
            directory="/models",
        )
    return Artifact(src, src.location, env=token, directory=src.location)


def _short(service: str, suffix: str, digest: str) -> str:
    return f"{service[: 63 - len(suffix) - len(digest) - 2]}-{suffix}-{digest}"


def cache_claim_spec(cache: v1.ModelCacheSpec) -> Obj:
    out: Obj = {
        "accessModes": [cache.access_mode.value],
        "resources": {"requests": {"storage": str(cache.size)}},
    }
    if cache.storage_class_name:
        out["storageClassName"] = cache.storage_class_name
    return out


def download_job(
    spec: v1.LLMServiceSpec, art: Artifact, labels: Mapping[str, str], service: str
) -> tuple[str, Obj]:
    """(name, Job spec) of the download into the cache. The name carries a digest of the spec:
    a Job's template is immutable, so another model, revision or image is another Job."""
    cache = spec.model.cache
    assert cache is not None
    assert art.directory is not None
    assert art.cache_claim is not None
    revision = art.source.revision or spec.model.revision or "main"
    container: Obj = {
        "name": "download",
        "image": cache.download_image or spec.engine.image,
        "imagePullPolicy": spec.engine.image_pull_policy.value,
        "command": ["python3", "-c", DOWNLOAD_SCRIPT],
        "env": [
            {"name": "MODEL_REPO", "value": art.source.location},
            {"name": "MODEL_REVISION", "value": revision},
            {"name": "MODEL_DIR", "value": art.directory},
            {"name": "HF_HOME", "value": f"{cache.mount_path.rstrip('/')}/.hf-home"},
            {"name": "HF_HUB_DISABLE_TELEMETRY", "value": "1"},
            *hf_token_env(spec),
        ],
        "volumeMounts": [{"name": CACHE_VOLUME, "mountPath": cache.mount_path}],
        "securityContext": container_security(ipc_lock=False),
    }
    pull_secrets = sorted({s for g in spec.worker_groups for s in g.pod.image_pull_secrets})
    pod: Obj = {
        "restartPolicy": "OnFailure",
        "securityContext": pod_security(),
        "automountServiceAccountToken": False,  # downloads files, never calls the API
        "containers": [container],
        "volumes": [
            {"name": CACHE_VOLUME, "persistentVolumeClaim": {"claimName": art.cache_claim}}
        ],
    }
    writable_dirs(pod, container)
    if pull_secrets:
        pod["imagePullSecrets"] = [{"name": s} for s in pull_secrets]
    meta: Obj = {"labels": dict(labels)}
    if cache.download_pod is not None:
        apply_pod_settings(pod, meta, container, cache.download_pod, own_selector=labels)
    body: Obj = {"backoffLimit": DOWNLOAD_BACKOFF, "template": {"metadata": meta, "spec": pod}}
    digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:8]
    return _short(service, "model", digest), body


def wait_container(spec: v1.LLMServiceSpec, art: Artifact) -> Obj:
    """Init container: blocks the worker until the download Job completed (no network used)."""
    return {
        "name": "wait-for-model",
        "image": spec.engine.image,
        "imagePullPolicy": spec.engine.image_pull_policy.value,
        "command": ["sh", "-c", WAIT_SCRIPT],
        "env": [{"name": "MODEL_MARKER", "value": art.marker}],
        "volumeMounts": art.mounts,
        "securityContext": container_security(ipc_lock=False),
    }


# ---------------------------------------------------------------------------------------------
# Env, shm, KV transport, security


def env_var(e: v1.EnvVar) -> Obj:
    if e.value_from is not None:
        return {"name": e.name, "valueFrom": k8s(e.value_from)}
    return {"name": e.name, "value": e.value or ""}


def env_from(spec: v1.LLMServiceSpec) -> list[Obj]:
    return [k8s(e) for e in spec.engine.env_from]


def shm_size(group: v1.WorkerGroup) -> str | None:
    """The `/dev/shm` size limit, or None for no shm volume."""
    if group.shm_size is not None:
        text = str(group.shm_size)
        return None if text.strip("0.") == "" else text
    if group.gpus == 0:
        return None
    return f"{SHM_PER_RANK_GI * group.tensor_parallel}Gi"


def ucx_tls(kv: v1.KvTransferSpec, gpus: int) -> str | None:
    if not kv.transports:
        return None
    names = [UCX_TRANSPORT[t] for t in kv.transports] + ["sm", "self"]
    if gpus:
        names.append("cuda_copy")
    return ",".join(dict.fromkeys(names))


def kv_env(spec: v1.LLMServiceSpec, group: v1.WorkerGroup) -> list[Obj]:
    kv = spec.kv_transfer
    if kv is None or spec.engine.kind is not v1.EngineKind.VLLM:
        return []
    out: list[Obj] = [
        {
            "name": "VLLM_NIXL_SIDE_CHANNEL_HOST",
            "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}},
        },
        {"name": "SPLITSERVE_NIXL_BACKENDS", "value": kv.backend.value},
    ]
    tls = ucx_tls(kv, group.gpus)
    if tls is not None:
        out.append({"name": "UCX_TLS", "value": tls})
    if kv.net_devices:
        out.append({"name": "UCX_NET_DEVICES", "value": kv.net_devices})
    return out + [env_var(e) for e in kv.env]


THP_ENV: Final = "THP_MEM_ALLOC_ENABLE"


def cpu_engine_env(spec: v1.LLMServiceSpec, group: v1.WorkerGroup) -> list[Obj]:
    """vLLM on CPU (a group without GPUs): `THP_MEM_ALLOC_ENABLE=1`, so torch backs the CPU KV
    cache with transparent huge pages (a NIXL READ between two processes on one host copies it
    page by page: 1.4-1.9x faster on huge pages, docs/benchmarks.md). A value of the user's own
    in `engine.env` replaces it (no duplicate entry)."""
    if spec.engine.kind is not v1.EngineKind.VLLM or group.gpus:
        return []
    if any(e.name == THP_ENV for e in spec.engine.env):
        return []
    return [{"name": THP_ENV, "value": "1"}]


def kv_resources(spec: v1.LLMServiceSpec) -> dict[str, str]:
    kv = spec.kv_transfer
    if kv is None or kv.rdma_resource is None:
        return {}
    return {kv.rdma_resource: str(kv.rdma_count)}


RUN_AS_USER: Final = 65532
"""The numeric user (and group, and fsGroup) every rendered pod runs as (Pod Security
"restricted": non-root). Images that run as root by default, such as vLLM's, work as this user:
their files are world-readable and what they write goes to the emptyDirs of `writable_dirs`."""
HOME_DIR: Final = "/var/lib/splitserve"
"""The containers' `HOME`: an emptyDir (the root filesystem is read-only). Not under `/home`,
which images may populate."""


def cache_env(home: str = HOME_DIR) -> list[Obj]:
    """Where the processes keep caches, all under `home`: the XDG bases (Hugging Face, vLLM,
    outlines and FlashInfer derive theirs from `XDG_CACHE_HOME`), and the ones that do not follow
    them (Triton's `~/.triton`, TorchInductor's `/tmp/torchinductor_<user>`) named outright.
    `USER` is set because the numeric user has no passwd entry and `getpass.getuser()` (torch's
    compile cache) reads it."""
    cache = f"{home}/.cache"
    return [
        {"name": "HOME", "value": home},
        {"name": "USER", "value": "splitserve"},
        {"name": "XDG_CACHE_HOME", "value": cache},
        {"name": "XDG_CONFIG_HOME", "value": f"{home}/.config"},
        {"name": "HF_HOME", "value": f"{cache}/huggingface"},
        {"name": "VLLM_CACHE_ROOT", "value": f"{cache}/vllm"},
        {"name": "VLLM_CONFIG_ROOT", "value": f"{home}/.config/vllm"},
        {"name": "TRITON_CACHE_DIR", "value": f"{home}/.triton/cache"},
        {"name": "TORCHINDUCTOR_CACHE_DIR", "value": f"{cache}/torchinductor"},
    ]


def pod_security() -> Obj:
    return {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS_USER,
        "runAsGroup": RUN_AS_USER,
        "fsGroup": RUN_AS_USER,  # volumes (the model cache) writable by that group
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security(*, ipc_lock: bool) -> Obj:
    caps: Obj = {"drop": ["ALL"]}
    if ipc_lock:
        caps["add"] = ["IPC_LOCK"]
    return {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "capabilities": caps}


def writable_dirs(pod: Obj, *containers: Obj) -> None:
    """The root filesystem is read-only: `/tmp` and a home directory become emptyDirs (in
    place), and the cache locations (`cache_env`) point into the home directory. A variable the
    container already sets (e.g. the download Job's `HF_HOME`, or `engine.env`) is kept."""
    pod["volumes"] = [
        *pod.get("volumes", []),
        {"name": "tmp", "emptyDir": {}},
        {"name": "home", "emptyDir": {}},
    ]
    for c in containers:
        c["volumeMounts"] = [
            *c.get("volumeMounts", []),
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "home", "mountPath": HOME_DIR},
        ]
        own = {e["name"] for e in c.get("env", [])}
        c["env"] = [*(e for e in cache_env() if e["name"] not in own), *c.get("env", [])]


# ---------------------------------------------------------------------------------------------
# Scheduling and pod settings


def _selector(sel: v1.LabelSelector | None, default: Mapping[str, str]) -> Obj:
    if sel is None:
        return {"matchLabels": dict(default)}
    return k8s(sel)


def _pod_affinity(a: v1.PodAffinity, default: Mapping[str, str]) -> Obj:
    def term(t: v1.PodAffinityTerm) -> Obj:
        return {
            "topologyKey": t.topology_key,
            "labelSelector": _selector(t.label_selector, default),
        }

    out: Obj = {}
    if a.required:
        out["requiredDuringSchedulingIgnoredDuringExecution"] = [term(t) for t in a.required]
    if a.preferred:
        out["preferredDuringSchedulingIgnoredDuringExecution"] = [
            {"weight": p.weight, "podAffinityTerm": term(p.term)} for p in a.preferred
        ]
    return out


def affinity(a: v1.Affinity, default_selector: Mapping[str, str]) -> Obj:
    """Kubernetes `affinity` from the CRD's shortened form. Pod terms without a selector mean
    the pods of the same worker group (or the router's pods)."""
    out: Obj = {}
    if a.node_affinity is not None:
        na = a.node_affinity
        node: Obj = {}
        if na.required:
            node["requiredDuringSchedulingIgnoredDuringExecution"] = {
                "nodeSelectorTerms": [k8s(t) for t in na.required]
            }
        if na.preferred:
            node["preferredDuringSchedulingIgnoredDuringExecution"] = [k8s(p) for p in na.preferred]
        out["nodeAffinity"] = node
    if a.pod_affinity is not None:
        out["podAffinity"] = _pod_affinity(a.pod_affinity, default_selector)
    if a.pod_anti_affinity is not None:
        out["podAntiAffinity"] = _pod_affinity(a.pod_anti_affinity, default_selector)
    return out


def apply_pod_settings(
    pod: Obj,
    template_meta: Obj,
    container: Obj,
    settings: v1.PodSettings,
    *,
    own_selector: Mapping[str, str],
) -> None:
    """Merge `settings` into a pod template (in place): metadata, scheduling, volumes, claims."""
    if settings.annotations:
        template_meta["annotations"] = {
            **settings.annotations,
            **template_meta.get("annotations", {}),
        }
    if settings.labels:
        template_meta["labels"] = {**settings.labels, **template_meta["labels"]}
    if settings.node_selector:
        pod["nodeSelector"] = dict(sorted(settings.node_selector.items()))
    if settings.tolerations:
        pod["tolerations"] = [k8s(t) for t in settings.tolerations]
    if settings.affinity is not None:
        pod["affinity"] = affinity(settings.affinity, own_selector)
    if settings.topology_spread:
        pod["topologySpreadConstraints"] = [
            {**k8s(t), "labelSelector": {"matchLabels": dict(own_selector)}}
            for t in settings.topology_spread
        ]
    if settings.priority_class_name:
        pod["priorityClassName"] = settings.priority_class_name
    if settings.runtime_class_name:
        pod["runtimeClassName"] = settings.runtime_class_name
    if settings.service_account_name:
        pod["serviceAccountName"] = settings.service_account_name
    if settings.image_pull_secrets:
        pod["imagePullSecrets"] = [{"name": s} for s in settings.image_pull_secrets]
    if settings.volumes:
        extra = []
        for v in settings.volumes:
            key, body = v.source()
            extra.append({"name": v.name, key: _compact(body)})
        pod["volumes"] = [*pod.get("volumes", []), *extra]
    if settings.volume_mounts:
        mounts = [k8s(m) for m in settings.volume_mounts]
        container["volumeMounts"] = [*container.get("volumeMounts", []), *mounts]
    if settings.resource_claims:
        pod["resourceClaims"] = [k8s(c) for c in settings.resource_claims]
        claims = [{"name": c.name} for c in settings.resource_claims]
        container.setdefault("resources", {})["claims"] = claims


def volumes_and_mounts(art: Artifact, shm: str | None) -> tuple[list[Obj], list[Obj]]:
    volumes, mounts = list(art.volumes), list(art.mounts)
    if shm is not None:
        volumes.append({"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": shm}})
        mounts.append({"name": SHM_VOLUME, "mountPath": "/dev/shm"})
    return volumes, mounts


def merge_resources(base: Obj, extra: Mapping[str, str]) -> Obj:
    """Add extended resources (requested = limit, as Kubernetes requires for them)."""
    if not extra:
        return base
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in base.items()}
    out.setdefault("requests", {}).update(extra)
    out.setdefault("limits", {}).update(extra)
    out["requests"] = dict(sorted(out["requests"].items()))
    out["limits"] = dict(sorted(out["limits"].items()))
    return out


# ---------------------------------------------------------------------------------------------
# The router's view of the model (it loads the tokenizer)


def router_tokenizer(spec: v1.LLMServiceSpec) -> str | None:
    """Where the router loads the tokenizer from, when it differs from `model.source` as
    written: the directory the workers load (cache, claim, image volume) or the repository id
    of an `hf://` URI. None: `model.tokenizer`, or the sim engine's own default."""
    if spec.model.tokenizer or spec.engine.kind is not v1.EngineKind.VLLM:
        return None
    art = artifact(spec)
    if art.source.kind is v1.SourceKind.FILE:
        return None  # refused by the spec validator unless model.tokenizer is given
    return None if art.model_arg == spec.model.source else art.model_arg


def router_model_mounts(spec: v1.LLMServiceSpec, service: str) -> Artifact | None:
    """The model volume for the router's pod, when the router reads the tokenizer from it."""
    if router_tokenizer(spec) is None:
        return None
    art = artifact(spec, service)
    return art if art.volumes else None
