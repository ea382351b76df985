"""`render(spec, observed)`: the objects an `LLMService` should own, as plain manifests. Pure.

For a service `S` in namespace `N`:

- `LLMPool S-<role>` per pool (the `/scale` target);
- `Deployment S-<group>` per worker group: selector = service + component + group labels, never
  the role (roles are per-pod labels the operator sets, so a flip never restarts a pod);
- the router: `ConfigMap S-router` (its config), `ServiceAccount`, `Role` and `RoleBinding`
  `S-router` (watch pods), `Deployment S-router`, and `Service S` (OpenAI HTTP + gRPC).

Every object carries the service's labels and a controller `ownerReference`, so deleting the
`LLMService` garbage-collects everything (the operator also deletes them itself, for API servers
without a garbage collector). The same inputs always give the same manifests, so reconciling
twice changes nothing.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final

import yaml

from splitserve.api import v1alpha1 as v1
from splitserve.api.router_edge import EdgeSettings
from splitserve.core.roles import Role
from splitserve.operator import otel, podspec

Manifest = dict[str, Any]

MANAGED_BY: Final = "splitserve-operator"
CONFIG_KEY: Final = "router.yaml"
API_KEYS_PATH: Final = "/var/run/splitserve/api-keys"
"""Where the router pods mount `router.apiKeySecret` (a directory: the kubelet updates it)."""
API_KEYS_KEY: Final = "keys.yaml"
CONFIG_HASH: Final = f"{v1.GROUP}/config-hash"
ROUTER_CONFIG_PATH: Final = "/etc/splitserve"


@dataclass(frozen=True, slots=True)
class ServiceRef:
    name: str
    namespace: str
    uid: str


@dataclass(frozen=True, slots=True)
class Observed:
    """What render needs from the cluster."""

    service: ServiceRef
    pool_replicas: Mapping[Role, int] = field(default_factory=dict)
    """`spec.replicas` of the `LLMPool`s that exist."""
    recreate: Mapping[Role, int] = field(default_factory=dict)
    """Manual, External: the last size of a pool that existed and was deleted (status), which
    it is recreated at instead of the service's initial `replicas`."""
    router_image: str = "ghcr.io/splitserve/splitserve:latest"
    """The router image for services that name none (the operator's `--router-image`)."""
    internal_tls: bool = True
    """Mount the service's internal TLS Secrets (`certs.Pki` issues them; the operator's
    `--no-internal-tls` turns this off): workers and routers speak mutual TLS."""


# ---------------------------------------------------------------------------------------------
# Names and labels


def pool_name(service: str, role: Role) -> str:
    return f"{service}-{role.value}"


def group_deployment_name(service: str, group: str) -> str:
    return f"{service}-{group}"


def router_name(service: str) -> str:
    return f"{service}-router"


def service_labels(service: str, component: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "splitserve",
        "app.kubernetes.io/instance": service,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/managed-by": MANAGED_BY,
        v1.LABEL_SERVICE: service,
        v1.LABEL_COMPONENT: component,
    }


def worker_selector(service: str, group: str | None = None) -> dict[str, str]:
    sel = {v1.LABEL_SERVICE: service, v1.LABEL_COMPONENT: "worker"}
    if group is not None:
        sel[v1.LABEL_GROUP] = group
    return sel


def selector_string(labels: Mapping[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def role_selector(service: str, role: Role) -> str:
    """The `LLMPool`'s `status.selector`: the pods currently in the role (for HPA metrics)."""
    return selector_string({**worker_selector(service), v1.LABEL_ROLE: role.value})


def owner_reference(ref: ServiceRef) -> dict[str, Any]:
    return {
        "apiVersion": v1.API_VERSION,
        "kind": "LLMService",
        "name": ref.name,
        "uid": ref.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _meta(ref: ServiceRef, name: str, component: str) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": ref.namespace,
        "labels": service_labels(ref.name, component),
        "ownerReferences": [owner_reference(ref)],
    }


# ---------------------------------------------------------------------------------------------
# Internal TLS (certificates issued by `operator.certs`)

TLS_DIR: Final = "/var/run/splitserve/tls"
TLS_VOLUME: Final = "internal-tls"
TLS_ENV: Final = "SPLITSERVE_TLS_DIR"
HEALTH_PORT_BASE: Final = 50052
LINK_PORT_BASE: Final = 50053


def tls_secret_name(service: str, role: str) -> str:
    """The `kubernetes.io/tls` Secret of a service's `role` (router or worker)."""
    return f"{service}-tls-{role}"


def worker_health_port(spec: v1.LLMServiceSpec) -> int:
    """The workers' plaintext health-only port (kubelet's gRPC probes cannot present a client
    certificate): the first port from 50052 that none of the engine's ports use."""
    return _first_free(HEALTH_PORT_BASE, _engine_ports(spec))


def _engine_ports(spec: v1.LLMServiceSpec) -> set[int]:
    """The ports the engine itself listens on (gRPC, metrics, the KV side channel)."""
    taken = {spec.engine.grpc_port, spec.engine.metrics_port}
    if spec.kv_transfer is not None:
        taken.add(spec.kv_transfer.side_channel_port)
    return taken


def _first_free(port: int, taken: set[int]) -> int:
    while port in taken:
        port += 1
    return port


def worker_link_port(spec: v1.LLMServiceSpec) -> int:
    """The workers' stream-link port (`worker serve --link-port`, the router's `pool.link:
    stream`): the first port from 50053 that neither the engine's ports nor the health port
    use. Rendered whatever `router.workerLink` says, so switching the link rolls only the
    router pods, not the workers (a worker restart reloads the model)."""
    return _first_free(LINK_PORT_BASE, _engine_ports(spec) | {worker_health_port(spec)})


def mount_tls(pod: dict[str, Any], container: dict[str, Any], service: str, role: str) -> None:
    """Mount `role`'s TLS Secret read-only at `TLS_DIR` and point `SPLITSERVE_TLS_DIR` at it
    (in place). The kubelet updates the files when the operator renews the Secret."""
    secret = {"secretName": tls_secret_name(service, role), "defaultMode": 0o440}
    pod["volumes"] = [*pod.get("volumes", []), {"name": TLS_VOLUME, "secret": secret}]
    mount = {"name": TLS_VOLUME, "mountPath": TLS_DIR, "readOnly": True}
    container["volumeMounts"] = [*container.get("volumeMounts", []), mount]
    container["env"] = [*container.get("env", []), {"name": TLS_ENV, "value": TLS_DIR}]


# ---------------------------------------------------------------------------------------------
# Sizes


def desired_replicas(spec: v1.LLMServiceSpec, observed: Observed) -> dict[Role, int]:
    """Workers each pool should have.

    Managed: the operator owns it (the service's `pools.<role>.replicas`, within min/max).
    Manual, External: the `LLMPool`'s `spec.replicas`, whoever set it (the service's value only
    until the pool exists).
    """
    out: dict[Role, int] = {}
    for role, pool in spec.pools.items():
        if spec.scaling.mode is v1.ScalingMode.MANAGED:
            n = pool.replicas
        elif role not in observed.pool_replicas:
            n = observed.recreate.get(role, pool.replicas)
        else:
            n = observed.pool_replicas[role]
        out[role] = max(0, n)
    return out


def group_replicas(spec: v1.LLMServiceSpec, desired: Mapping[Role, int]) -> dict[str, int]:
    """Pods per worker group: its fixed `replicas`, or the pools it serves.

    Each pool is served by the first group that may take its role and has no fixed size.
    """
    out = {g.name: g.replicas or 0 for g in spec.worker_groups}
    for role, n in desired.items():
        sized = [g for g in spec.worker_groups if role in g.roles and g.replicas is None]
        if sized:
            out[sized[0].name] += n
    return out


def group_coverage_problems(
    spec: v1.LLMServiceSpec, desired: Mapping[Role, int]
) -> list[tuple[str, str]]:
    """(reason, message) for worker groups and pools that `group_replicas` cannot size: a pool
    whose workers no group without a fixed size adds, beyond what the fixed groups hold
    (`PoolsNotSized`), and a group without a fixed size that serves no pool, so it runs 0 pods
    forever (`GroupServesNoPool`). Said in status (`SpecApplied=False`) rather than left as a
    Deployment at 0 or a pool below its size that nothing explains."""
    out: list[tuple[str, str]] = []
    sized = {
        role: next((g for g in spec.worker_groups if role in g.roles and g.replicas is None), None)
        for role in desired
    }
    unsized = {role: n for role, n in desired.items() if n > 0 and sized[role] is None}
    if unsized:
        fixed = [
            g
            for g in spec.worker_groups
            if g.replicas is not None and any(r in g.roles for r in unsized)
        ]
        need = sum(unsized.values())
        have = sum(g.replicas or 0 for g in fixed)
        if need > have:
            roles = ", ".join(f"{r.value} {n}" for r, n in unsized.items())
            holders = ", ".join(f"{g.name} ({g.replicas})" for g in fixed) or "none"
            out.append(
                (
                    "PoolsNotSized",
                    f"spec.pools want {roles} workers, but every group that takes those roles "
                    f"has a fixed replicas ({holders}: {have} pods in all), so {need - have} "
                    "can never run: leave replicas out on one of them, or add a group",
                )
            )
    first = {g.name for g in sized.values() if g is not None}
    for i, g in enumerate(spec.worker_groups):
        if g.replicas is None and g.name not in first:
            out.append(
                (
                    "GroupServesNoPool",
                    f"workerGroups[{i}] ({g.name}) serves no pool, so it runs 0 pods: each pool "
                    "is served by the first group that takes its role without a fixed replicas "
                    f"(pools: {', '.join(r.value for r in desired) or 'none'})",
                )
            )
    return out


# ---------------------------------------------------------------------------------------------
# Manifests


def render(spec: v1.LLMServiceSpec, observed: Observed) -> list[Manifest]:
    """Every object the service owns, in apply order."""
    desired = desired_replicas(spec, observed)
    sizes = group_replicas(spec, desired)
    out: list[Manifest] = [llm_pool(spec, observed, role) for role, _ in spec.pools.items()]
    out += model_artifact_manifests(spec, observed.service)
    out += [
        worker_deployment(spec, observed.service, g, sizes[g.name], observed.internal_tls)
        for g in spec.worker_groups
    ]
    out += router_manifests(spec, observed)
    out += network_policies(spec, observed.service)
    return out


def _peer(peer: v1.NetworkPeer) -> dict[str, Any]:
    return podspec.k8s(peer)


def network_policies(spec: v1.LLMServiceSpec, ref: ServiceRef) -> list[Manifest]:
    """Ingress rules for the service's pods (docs/security.md): workers' gRPC port only from
    the service's router pods, its own workers and the operator; their stream-link port
    (`worker_link_port`) from the router pods; every worker port from the
    service's workers (KV transports: NIXL side channel, UCX / RDMA connections on ports they
    pick); the metrics port from `metricsFrom` (empty: anyone); the router's ports from
    `routerFrom` (empty: anyone) and, with a `routerFrom`, its HTTP port from the operator too
    (the control loop scrapes `/metrics`). Empty with `networkPolicy.enabled: false`."""
    np = spec.network_policy
    if not np.enabled:
        return []
    workers = {"matchLabels": worker_selector(ref.name)}
    routers = {"matchLabels": {v1.LABEL_SERVICE: ref.name, v1.LABEL_COMPONENT: "router"}}
    operator = {"namespaceSelector": {}, "podSelector": {"matchLabels": dict(np.operator_labels)}}
    grpc_port = [{"protocol": "TCP", "port": spec.engine.grpc_port}]
    link_port = [{"protocol": "TCP", "port": worker_link_port(spec)}]
    metrics: dict[str, Any] = {"ports": [{"protocol": "TCP", "port": spec.engine.metrics_port}]}
    if np.metrics_from:
        metrics["from"] = [_peer(p) for p in np.metrics_from]
    worker_policy = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta(ref, f"{ref.name}-workers", "worker"),
        "spec": {
            "podSelector": workers,
            "policyTypes": ["Ingress"],
            "ingress": [
                {"from": [{"podSelector": routers}, operator], "ports": grpc_port},
                {"from": [{"podSelector": workers}]},
                metrics,
                # The stream link (router.workerLink: stream): the router pods only.
                {"from": [{"podSelector": routers}], "ports": link_port},
            ],
        },
    }
    router_rule: dict[str, Any] = {
        "ports": [
            {"protocol": "TCP", "port": spec.router.http_port},
            {"protocol": "TCP", "port": spec.router.grpc_port},
        ]
    }
    router_rules = [router_rule]
    if np.router_from:
        router_rule["from"] = [_peer(p) for p in np.router_from]
        # The control loop scrapes each router pod's /metrics on its HTTP port.
        http_port = [{"protocol": "TCP", "port": spec.router.http_port}]
        router_rules.append({"from": [operator], "ports": http_port})
    router_policy = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta(ref, router_name(ref.name), "router"),
        "spec": {"podSelector": routers, "policyTypes": ["Ingress"], "ingress": router_rules},
    }
    return [worker_policy, router_policy]


def llm_pool(spec: v1.LLMServiceSpec, observed: Observed, role: Role) -> Manifest:
    ref = observed.service
    pool = getattr(spec.pools, role.value)
    body: dict[str, Any] = {"service": ref.name, "role": role.value}
    # Managed: the operator owns replicas. Otherwise only the initial value, at creation.
    if spec.scaling.mode is v1.ScalingMode.MANAGED:
        body["replicas"] = pool.replicas
    elif role not in observed.pool_replicas:
        body["replicas"] = observed.recreate.get(role, pool.replicas)
    body["minReplicas"] = pool.min_replicas
    if pool.max_replicas is not None:
        body["maxReplicas"] = pool.max_replicas
    return {
        "apiVersion": v1.API_VERSION,
        "kind": "LLMPool",
        "metadata": _meta(ref, pool_name(ref.name, role), "pool"),
        "spec": body,
    }


def _resources(res: v1.ResourceRequirements, gpus: int = 0, gpu_name: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    if res.requests:
        out["requests"] = {k: str(v) for k, v in sorted(res.requests.items())}
    limits = {k: str(v) for k, v in sorted(res.limits.items())}
    if gpus:
        limits[gpu_name] = str(gpus)
        out.setdefault("requests", {})[gpu_name] = str(gpus)
    if limits:
        out["limits"] = limits
    return out


def _downward_env() -> list[dict[str, Any]]:
    return [
        {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}
        for name, path in (
            ("SPLITSERVE_POD_NAME", "metadata.name"),
            ("SPLITSERVE_POD_NAMESPACE", "metadata.namespace"),
            ("SPLITSERVE_POD_IP", "status.podIP"),
        )
    ]


def worker_args(spec: v1.LLMServiceSpec, group: v1.WorkerGroup) -> list[str]:
    """The worker command line (`splitserve worker serve ...`); engine arguments go after `--`.

    The pod's name and IP reach the worker as `SPLITSERVE_POD_NAME` / `SPLITSERVE_POD_IP`
    (its worker id and the address it advertises).
    """
    art = podspec.artifact(spec)
    args = [
        "worker",
        "serve",
        f"--engine={spec.engine.kind.value}",
        f"--model={art.model_arg}",
        f"--served-model-name={spec.model.name}",
        f"--role={group.roles[0].value}",
        "--host=0.0.0.0",
        f"--grpc-port={spec.engine.grpc_port}",
        f"--metrics-port={spec.engine.metrics_port}",
        f"--link-port={worker_link_port(spec)}",
        f"--tensor-parallel-size={group.tensor_parallel}",
    ]
    vllm = spec.engine.kind is v1.EngineKind.VLLM  # the sim worker refuses vLLM-only flags
    if art.revision_arg and vllm:
        args.append(f"--revision={art.revision_arg}")
    if spec.kv_transfer is not None and vllm:
        args.append(f"--nixl-port={spec.kv_transfer.side_channel_port}")
    if spec.model.tokenizer:  # sim: its vocabulary and end of text are the router's
        args.append(f"--tokenizer={spec.model.tokenizer}")
    params = json.loads(spec.engine.batching_params)
    if spec.engine.batching != v1.BatchingPolicyName.FCFS or params:
        args.append(f"--batching={spec.engine.batching.value}")
        args.append(f"--batching-params={json.dumps(params, sort_keys=True)}")
    extra = [*spec.engine.args, *group.engine_args]
    return [*args, "--", *extra] if extra else args


def worker_deployment(
    spec: v1.LLMServiceSpec,
    ref: ServiceRef,
    group: v1.WorkerGroup,
    replicas: int,
    internal_tls: bool = True,
) -> Manifest:
    name = group_deployment_name(ref.name, group.name)
    selector = worker_selector(ref.name, group.name)
    labels = {**service_labels(ref.name, "worker"), **selector}
    art = podspec.artifact(spec, ref.name)
    if spec.engine.kind is v1.EngineKind.SIM:
        # The simulated engine loads no weights: a `pvc://` claim or `oci://` image it would
        # never read must not hold its pods (a claim that does not exist keeps them Pending).
        art = replace(art, volumes=[], mounts=[])
    volumes, mounts = podspec.volumes_and_mounts(art, podspec.shm_size(group))
    kv = spec.kv_transfer if spec.engine.kind is v1.EngineKind.VLLM else None
    ports = [
        {"name": "grpc", "containerPort": spec.engine.grpc_port, "protocol": "TCP"},
        {"name": "metrics", "containerPort": spec.engine.metrics_port, "protocol": "TCP"},
        {"name": "link", "containerPort": worker_link_port(spec), "protocol": "TCP"},
    ]
    if kv is not None:
        ports.append({"name": "nixl", "containerPort": kv.side_channel_port, "protocol": "TCP"})
    # With internal TLS the gRPC port wants a client certificate: probes use the health port.
    probe_port = spec.engine.grpc_port
    args = worker_args(spec, group)
    if internal_tls:
        probe_port = worker_health_port(spec)
        ports.append({"name": "health", "containerPort": probe_port, "protocol": "TCP"})
        at = args.index("--") if "--" in args else len(args)
        args = [*args[:at], f"--health-port={probe_port}", *args[at:]]
    container: dict[str, Any] = {
        "name": "worker",
        "image": spec.engine.image,
        "imagePullPolicy": spec.engine.image_pull_policy.value,
        "command": ["splitserve"],
        "args": args,
        "env": [
            *_downward_env(),
            *art.env,
            *podspec.kv_env(spec, group),
            *podspec.cpu_engine_env(spec, group),
            *(podspec.env_var(e) for e in spec.engine.env),
            *otel.tracing_env(spec),
        ],
        "ports": ports,
        "readinessProbe": {
            "grpc": {"port": probe_port},
            "periodSeconds": 5,
            "failureThreshold": 3,
        },
        "startupProbe": {
            "grpc": {"port": probe_port},
            "periodSeconds": 10,
            "failureThreshold": 180,
        },
        "resources": podspec.merge_resources(
            _resources(group.resources, group.gpus, group.gpu_resource),
            podspec.kv_resources(spec) if kv is not None else {},
        ),
        "securityContext": podspec.container_security(
            ipc_lock=kv is not None and kv.wants_ipc_lock
        ),
    }
    if spec.engine.env_from:
        container["envFrom"] = podspec.env_from(spec)
    if mounts:
        container["volumeMounts"] = mounts
    pod_spec: dict[str, Any] = {
        "containers": [container],
        # A drain can take as long as the longest generation.
        "terminationGracePeriodSeconds": int(spec.flipping.drain_timeout_seconds) + 30,
        "securityContext": podspec.pod_security(),
        # Workers never call the Kubernetes API: no token in the pod to steal.
        "automountServiceAccountToken": False,
    }
    if art.marker is not None:
        pod_spec["initContainers"] = [podspec.wait_container(spec, art)]
    if volumes:
        pod_spec["volumes"] = volumes
    if internal_tls:
        mount_tls(pod_spec, container, ref.name, "worker")
    podspec.writable_dirs(pod_spec, container)
    if group.node_selector:
        pod_spec["nodeSelector"] = dict(sorted(group.node_selector.items()))
    template_meta: dict[str, Any] = {"labels": labels}
    podspec.apply_pod_settings(
        pod_spec,
        template_meta,
        container,
        group.pod,
        own_selector=selector,
    )
    if "serviceAccountName" in pod_spec:  # the user's account: it may need its token
        del pod_spec["automountServiceAccountToken"]
    meta = _meta(ref, name, "worker")
    meta["labels"] = labels
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta,
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": selector},
            "template": {"metadata": template_meta, "spec": pod_spec},
        },
    }


def model_cache_job_name(spec: v1.LLMServiceSpec, ref: ServiceRef) -> str | None:
    """The download Job of the service's model, if it has one."""
    art = podspec.artifact(spec, ref.name)
    if art.marker is None:
        return None
    labels = service_labels(ref.name, "model-download")
    return podspec.download_job(spec, art, labels, ref.name)[0]


def model_artifact_manifests(spec: v1.LLMServiceSpec, ref: ServiceRef) -> list[Manifest]:
    """The model cache's PersistentVolumeClaim (when the operator creates it) and download Job."""
    art = podspec.artifact(spec, ref.name)
    cache = spec.model.cache
    if cache is None or art.marker is None or art.cache_claim is None:
        return []
    out: list[Manifest] = []
    if art.claim_created:
        out.append(
            {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": _meta(ref, art.cache_claim, "model-cache"),
                "spec": podspec.cache_claim_spec(cache),
            }
        )
    labels = service_labels(ref.name, "model-download")
    job_name, body = podspec.download_job(spec, art, labels, ref.name)
    out.append(
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": _meta(ref, job_name, "model-download"),
            "spec": body,
        }
    )
    return out


def _router_model(spec: v1.LLMServiceSpec) -> dict[str, Any]:
    """`model` of the router's config: the tokenizer resolved to what the router can load."""
    tokenizer = podspec.router_tokenizer(spec)
    model = spec.model.wire()
    return model if tokenizer is None else {**model, "tokenizer": tokenizer}


ROUTER_STOP_MARGIN_S: Final = 5
"""Seconds the router pods' termination grace exceeds `router.edge.drainGraceSeconds`."""


SCALE_FROM_ZERO_WAIT_S: Final = 300
"""The router's cold-start wait when `router.coldStartWaitSeconds` is left out and the service
can scale to zero: long enough for the autoscaler's tick, a pod's start and a model's load."""


def cold_start_wait_s(spec: v1.LLMServiceSpec) -> int:
    """`router.coldStartWaitSeconds`, or where it is left out: `SCALE_FROM_ZERO_WAIT_S` when
    every decode-capable pool may be at zero (minReplicas 0) and an autoscaler may bring one
    back (scaling Managed or External), else 0 (a 503 at once, as with people scaling)."""
    if spec.router.cold_start_wait_seconds is not None:
        return spec.router.cold_start_wait_seconds
    finishers = [p for p in (spec.pools.decode, spec.pools.mixed) if p is not None]
    to_zero = bool(finishers) and all(p.min_replicas == 0 for p in finishers)
    if to_zero and spec.scaling.mode is not v1.ScalingMode.MANUAL:
        return SCALE_FROM_ZERO_WAIT_S
    return 0


def router_config(spec: v1.LLMServiceSpec, ref: ServiceRef) -> dict[str, Any]:
    """What the router reads from its ConfigMap (`router.yaml`)."""
    classes = [c.wire() for c in spec.slo_classes]
    default_class = spec.default_slo_class or (spec.slo_classes[0].name if classes else "default")
    edge = spec.router.edge.wire()
    return ({"edge": edge} if edge else {}) | {
        "service": ref.name,
        "model": _router_model(spec),
        "engine": {"kind": spec.engine.kind.value},
        "listen": {"httpPort": spec.router.http_port, "grpcPort": spec.router.grpc_port},
        "discovery": {
            "kind": "kubernetes",
            "namespace": ref.namespace,
            "selector": selector_string(worker_selector(ref.name)),
            "roleLabel": v1.LABEL_ROLE,
            "fencedLabel": v1.LABEL_FENCED,
            "grpcPort": spec.engine.grpc_port,
            # Only pods of the service's worker Deployments, not any pod with these labels.
            "ownerDeployments": [
                group_deployment_name(ref.name, g.name) for g in spec.worker_groups
            ],
        },
        "placement": {
            "profile": spec.router.placement_profile.value,
            "disaggregation": spec.router.disaggregation.value,
            "lengthPredictor": spec.router.length_predictor.value,
        },
        "admission": {
            "queueCapacity": spec.router.admission_queue_capacity,
            # 0 in the CRD (which has no nulls) is the router's null: no cap before a fit.
            "unfittedPrefillsPerWorker": spec.router.unfitted_prefills_per_worker or None,
            # Requests held while no decode-capable worker is ready (scale from zero).
            "coldStartWaitSeconds": cold_start_wait_s(spec),
            "coldStartMaxHeld": spec.router.admission_queue_capacity,
        },
        "pool": {"link": spec.router.worker_link.value},
        "sloClasses": classes,
        "defaultSloClass": default_class,
        **(
            {"auth": {"keyFile": f"{API_KEYS_PATH}/{API_KEYS_KEY}"}}
            if spec.router.api_key_secret
            else {}
        ),
        **_stock_backends(spec, ref),
    }


def _stock_backends(spec: v1.LLMServiceSpec, ref: ServiceRef) -> dict[str, Any]:
    """`backends` / `backend_discovery` of router.yaml: the stock `vllm serve` servers."""
    out: dict[str, Any] = {}
    if spec.router.backends:
        out["backends"] = [b.wire() for b in spec.router.backends]
    found = spec.router.backend_discovery
    if found is not None:
        out["backend_discovery"] = {"namespace": ref.namespace, **found.wire()}
    return out


def router_manifests(spec: v1.LLMServiceSpec, observed: Observed) -> list[Manifest]:
    ref = observed.service
    name = router_name(ref.name)
    config_text = yaml.safe_dump(router_config(spec, ref), sort_keys=True)
    config_hash = hashlib.sha256(config_text.encode()).hexdigest()[:16]
    selector = {v1.LABEL_SERVICE: ref.name, v1.LABEL_COMPONENT: "router"}
    labels = service_labels(ref.name, "router")
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(ref, name, "router"),
        "data": {CONFIG_KEY: config_text},
    }
    account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(ref, name, "router")}
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": _meta(ref, name, "router"),
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": _meta(ref, name, "router"),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ref.namespace}],
    }
    http, grpc = spec.router.http_port, spec.router.grpc_port
    container: dict[str, Any] = {
        "name": "router",
        "image": spec.router.image or observed.router_image,
        "command": ["splitserve"],
        "args": [
            "router",
            "serve",
            f"--config={ROUTER_CONFIG_PATH}/{CONFIG_KEY}",
            "--host=0.0.0.0",
        ],
        "env": _downward_env(),
        "ports": [
            {"name": "http", "containerPort": http, "protocol": "TCP"},
            {"name": "grpc", "containerPort": grpc, "protocol": "TCP"},
        ],
        "readinessProbe": {"httpGet": {"path": "/ready", "port": "http"}, "periodSeconds": 5},
        "livenessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 10},
        "resources": _resources(spec.router.resources),
        "volumeMounts": [{"name": "config", "mountPath": ROUTER_CONFIG_PATH, "readOnly": True}],
    }
    container["securityContext"] = podspec.container_security(ipc_lock=False)
    container["env"] = [*container["env"], *podspec.hf_token_env(spec)]
    container["env"] = [*container["env"], *otel.tracing_env(spec)]
    router_meta: dict[str, Any] = {"labels": labels, "annotations": {CONFIG_HASH: config_hash}}
    router_pod: dict[str, Any] = {
        "serviceAccountName": name,
        "securityContext": podspec.pod_security(),
        "containers": [container],
        "volumes": [{"name": "config", "configMap": {"name": name}}],
    }
    drain = spec.router.edge.drain_grace_seconds
    if drain is None:  # the router's own default: the pod's default grace (30 s) equals it
        drain = EdgeSettings.model_fields["drain_grace_s"].default
    # the kubelet must not kill the router before its drain ends
    router_pod["terminationGracePeriodSeconds"] = int(drain) + 1 + ROUTER_STOP_MARGIN_S
    if spec.router.api_key_secret:
        router_pod["volumes"].append(
            {"name": "api-keys", "secret": {"secretName": spec.router.api_key_secret}}
        )
        container["volumeMounts"] = [
            *container["volumeMounts"],
            {"name": "api-keys", "mountPath": API_KEYS_PATH, "readOnly": True},
        ]
    model_art = podspec.router_model_mounts(spec, ref.name)
    if model_art is not None:
        # The router reads the tokenizer from the workers' model volume.
        router_pod["volumes"] += model_art.volumes
        container["volumeMounts"] = [*container["volumeMounts"], *model_art.mounts]
        if model_art.marker is not None:
            init = podspec.wait_container(spec, model_art)
            init["image"] = container["image"]
            init.pop("imagePullPolicy")
            router_pod["initContainers"] = [init]
    if observed.internal_tls:
        mount_tls(router_pod, container, ref.name, "router")
    podspec.writable_dirs(router_pod, container)
    podspec.apply_pod_settings(
        router_pod,
        router_meta,
        container,
        spec.router.pod,
        own_selector=selector,
    )
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(ref, name, "router"),
        "spec": {
            "replicas": spec.router.replicas,
            "selector": {"matchLabels": selector},
            "template": {"metadata": router_meta, "spec": router_pod},
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(ref, ref.name, "router"),
        "spec": {
            "type": spec.router.service_type.value,
            "selector": selector,
            "ports": [
                {"name": "http", "port": http, "targetPort": "http", "protocol": "TCP"},
                {"name": "grpc", "port": grpc, "targetPort": "grpc", "protocol": "TCP"},
            ],
        },
    }
    return [config_map, account, role, binding, deployment, service]


def router_endpoint(spec: v1.LLMServiceSpec, ref: ServiceRef) -> str:
    return f"http://{ref.name}.{ref.namespace}.svc:{spec.router.http_port}/v1"


def fingerprint(manifests: list[Manifest]) -> str:
    """A stable digest of rendered manifests (for tests and logs)."""
    return hashlib.sha256(json.dumps(manifests, sort_keys=True).encode()).hexdigest()


DRY_RUN_UID: Final = "00000000-0000-0000-0000-000000000000"
"""The owner UID in a dry run (the API server assigns the real one)."""


_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
"""A namespace name (RFC 1123 label)."""


_JSON_TYPES: Final[Mapping[str, Callable[[Any], bool]]] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
}


@functools.cache
def _service_spec_schema() -> Mapping[str, Any]:
    from splitserve.api import crds

    return crds.structural_schema(v1.LLMServiceSpec)


def _type_problems(node: Mapping[str, Any], value: Any, path: str) -> Iterator[str]:
    if value is None:  # the API server drops a null where the field is optional
        return
    if node.get("x-kubernetes-int-or-string"):
        if not _JSON_TYPES["integer"](value) and not isinstance(value, str):
            yield f"{path}: must be of type integer or string"
        return
    kind = node.get("type")
    if isinstance(kind, str) and kind in _JSON_TYPES and not _JSON_TYPES[kind](value):
        # YAML 1.1 (PyYAML, kubectl) reads an unquoted Off / On / Yes / No as a boolean.
        read_as = [e for e in node.get("enum", []) if yaml.safe_load(str(e)) is value]
        hint = ""
        if read_as:
            word = read_as[0]
            hint = f" (YAML reads an unquoted {word} as {str(value).lower()}: write '{word}')"
        yield f"{path}: must be of type {kind}{hint}"
        return
    if isinstance(value, dict):
        props, extra = node.get("properties") or {}, node.get("additionalProperties")
        for key, item in value.items():
            sub = props.get(key, extra if isinstance(extra, dict) else None)
            if sub is not None:  # an unknown field: the model refuses it by name
                yield from _type_problems(sub, item, f"{path}.{key}")
    elif isinstance(value, list) and isinstance(node.get("items"), dict):
        for i, item in enumerate(value):
            yield from _type_problems(node["items"], item, f"{path}[{i}]")


def spec_type_problems(spec: Any) -> list[str]:
    """The values of an `LLMService` spec whose JSON type the CRD's schema refuses, as the API
    server does: `replicas: '3'`, `enabled: 'false'`, which pydantic's lax parsing would take
    (`operator render` would show objects the cluster never gets). One line per field, naming
    it and the type, never the value (it may be a credential)."""
    return list(_type_problems(_service_spec_schema(), spec, "spec"))


def render_documents(
    docs: list[Any], namespace: str | None, router_image: str, uid: str = DRY_RUN_UID
) -> tuple[list[Manifest], list[str]]:
    """(every object the operator would create, notes on documents that are not LLMServices)
    for the `LLMService`s among YAML documents: `splitserve operator render`. A fresh cluster:
    no `LLMPool` exists yet, so each pool starts at the service's `replicas`."""
    out: list[Manifest] = []
    notes: list[str] = []
    seen: dict[tuple[str, str], int] = {}
    for i, doc in enumerate(docs):
        if doc is None:
            continue
        if not isinstance(doc, dict):
            raise ValueError(f"document {i}: not a Kubernetes object")
        kind, api_version = doc.get("kind"), doc.get("apiVersion")
        if str(api_version).split("/")[0] == v1.GROUP:  # ours: the API server would refuse these
            if kind == "LLMService" and api_version != v1.API_VERSION:
                raise ValueError(
                    f"document {i}: an LLMService of apiVersion {api_version}: this version "
                    f"serves {v1.API_VERSION}"
                )
            if kind not in ("LLMService", "LLMPool"):
                raise ValueError(
                    f"document {i}: kind {kind} is not a {v1.GROUP} kind (LLMService, LLMPool)"
                )
        if api_version != v1.API_VERSION or kind != "LLMService":
            notes.append(
                f"document {i}: skipped {doc.get('apiVersion')} {kind} (not an LLMService)"
            )
            continue
        meta = doc.get("metadata") or {}
        if not isinstance(meta, dict):  # was an AttributeError's traceback
            raise ValueError(f"document {i}: metadata must be a mapping")
        if not isinstance(meta.get("name"), str) or not meta["name"]:
            raise ValueError(f"document {i}: LLMService without metadata.name")
        name = meta["name"]
        problem = v1.service_name_problem(name)  # rendered Bad_Name!-*, my.svc, 1abc, 70 chars
        if problem is not None:  # the CRD's rule: the API server refuses it
            raise ValueError(f"document {i}: {problem}")
        ns = meta.get("namespace") or namespace or "default"
        if not isinstance(ns, str) or len(ns) > 63 or not re.fullmatch(_DNS_LABEL, ns):
            raise ValueError(
                f"document {i}: namespace {ns!r} is not a Kubernetes namespace name (lower-case "
                "letters, digits and '-', at most 63)"
            )
        if (ns, name) in seen:
            raise ValueError(
                f"document {i}: LLMService {ns}/{name} is also document {seen[ns, name]}: one "
                "object, applied twice (the later replaces the earlier)"
            )
        seen[ns, name] = i
        problems = spec_type_problems(doc.get("spec") or {})
        if problems:  # the API server refuses these; pydantic would coerce them
            raise ValueError("invalid LLMService:\n" + "\n".join(f"  {p}" for p in problems))
        spec = v1.LLMServiceSpec.model_validate(doc.get("spec") or {})
        observed = Observed(ServiceRef(meta["name"], ns, uid), router_image=router_image)
        out += render(spec, observed)
        for reason, message in group_coverage_problems(spec, desired_replicas(spec, observed)):
            notes.append(f"document {i}: warning {reason}: {message}")
    return out, notes


class _PlainDumper(yaml.SafeDumper):
    """YAML without anchors and aliases (objects that share a dict are written out twice)."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def dump_manifests(manifests: list[Manifest]) -> str:
    """Manifests as one multi-document YAML text, stable for diffs (keys in render order)."""
    return yaml.dump_all(manifests, Dumper=_PlainDumper, sort_keys=False, width=100)
