"""`splitserve.io/v1alpha1`: the `LLMService` and `LLMPool` custom resources.

These models are the single source of truth for the CRDs: `splitserve gen crds` turns them into
the OpenAPI schemas (attribute docstrings become the `kubectl explain` text), and the operator
parses every object it reads with them. Field names are snake_case in Python and camelCase on the
wire (`tensor_parallel` <-> `tensorParallel`).

Cross-field rules live twice, deliberately: as pydantic validators (what the operator and
`splitserve.operator.validate` enforce) and as CEL `x-kubernetes-validations` on the CRD (what the
API server enforces on `kubectl apply`). Tests keep the two in step.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any, Final, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from splitserve.core.roles import Role

GROUP: Final = "splitserve.io"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"

SERVICE_NAME_PATTERN: Final = "[a-z]([-a-z0-9]*[a-z0-9])?"
"""An LLMService's name: an RFC 1035 label of at most 63 characters, because its Service (a
Service name is such a label) and every child's `splitserve.io/service` label (a label value has
at most 63 characters) carry it."""
SERVICE_NAME_RULE: Final = (
    "metadata.name must be at most 63 lower-case letters, digits and '-', starting with a "
    "letter and ending with a letter or digit: the service's Service and its labels carry it"
)


def service_name_problem(name: str) -> str | None:
    """Why `name` cannot name an LLMService (`SERVICE_NAME_RULE`), or None."""
    if len(name) > 63 or not re.fullmatch(SERVICE_NAME_PATTERN, name):
        return f"metadata.name {name!r}: {SERVICE_NAME_RULE.removeprefix('metadata.name ')}"
    return None


DNS_LABEL: Final = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
"""RFC 1035 label: what Kubernetes accepts in names that become Service and Deployment names."""
CLASS_NAME: Final = r"^[A-Za-z0-9]([-_.A-Za-z0-9]*[A-Za-z0-9])?$"
IMAGE: Final = r"^\S+$"
"""An image reference: no whitespace (the API server refuses it at the ends, the kubelet
anywhere: `InvalidImageName`)."""

QUANTITY_PATTERN: Final = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
"""What Kubernetes accepts as a resource quantity (`resource.Quantity`'s grammar)."""


def _quantity(value: int | str) -> int | str:
    if isinstance(value, str) and re.fullmatch(QUANTITY_PATTERN, value) is None:
        raise ValueError(f"{value!r} is not a quantity (examples: 2, 500m, 1.5, 16Gi)")
    return value


Quantity = Annotated[
    int | str,
    AfterValidator(_quantity),
    WithJsonSchema(
        {"anyOf": [{"type": "integer"}, {"type": "string"}], "pattern": QUANTITY_PATTERN}
    ),
]
"""A Kubernetes resource quantity (`2`, `500m`, `16Gi`), checked by pattern; int-or-string."""


def not_a_bool(value: Any) -> Any:
    """`value`, unless it is a boolean: a `before` validator for a number field (pydantic reads
    `true` as 1 there, so a YAML file's `ttftMs: true` was a 1 ms target)."""
    if isinstance(value, bool):
        raise ValueError(f"expected a number, not a boolean ({str(value).lower()})")
    return value


class Model(BaseModel):
    """Base of every API model: frozen, strict about unknown fields, camelCase on the wire."""

    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        use_attribute_docstrings=True,
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
    )

    def wire(self) -> dict[str, Any]:
        """The object as Kubernetes stores it: camelCase keys, unset optional fields left out."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


# ---------------------------------------------------------------------------------------------
# LLMService spec


class EngineKind(StrEnum):
    VLLM = "vllm"
    """vLLM in-process, with KV transfer over NIXL."""
    SIM = "sim"
    """The simulator's engine driven by a real clock: synthetic tokens, no accelerator."""


class PullPolicy(StrEnum):
    ALWAYS = "Always"
    IF_NOT_PRESENT = "IfNotPresent"
    NEVER = "Never"


# ---------------------------------------------------------------------------------------------
# Cluster integration: model artifacts, env from Secrets, pod controls, KV transport.
# Kubernetes objects keep their Kubernetes field names (camelCase on the wire) and meaning.

DNS_SUBDOMAIN: Final = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
"""RFC 1123 subdomain: Secret, ConfigMap, PVC, PriorityClass and RuntimeClass names."""
QUANTITY: Final = r"^[0-9]+(\.[0-9]+)?(m|k|Ki|M|Mi|G|Gi|T|Ti|P|Pi|E|Ei)?$"
"""A Kubernetes resource quantity in its common forms (`512Mi`, `16Gi`, `1.5`)."""
HF_REPO: Final = r"^[A-Za-z0-9][-_.A-Za-z0-9]*(/[A-Za-z0-9][-_.A-Za-z0-9]*)?$"
SECRETISH_ENV: Final = re.compile(r"(TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|ACCESS_KEY|CREDENTIAL)")
"""Env names whose literal `value` would put a credential in the CR: use `valueFrom` instead."""


class SourceKind(StrEnum):
    HF = "hf"
    """A Hugging Face repository, downloaded (once into `model.cache`, or by every pod)."""
    PVC = "pvc"
    """A directory on an existing PersistentVolumeClaim, mounted read-only."""
    OCI = "oci"
    """An OCI image holding the weights, mounted as an image volume (Kubernetes 1.33+)."""
    FILE = "file"
    """A path inside the worker container (baked into the image or mounted by `pod.volumes`)."""


@dataclass(frozen=True, slots=True)
class ModelSource:
    """`model.source` parsed: what kind of artifact, and where."""

    kind: SourceKind
    location: str
    """HF repository id, PVC claim name, image reference or absolute path."""
    path: str = ""
    """PVC: the directory inside the claim ("" = its root)."""
    revision: str | None = None
    """HF: the revision after `@`."""


def parse_model_source(text: str) -> ModelSource:
    """`hf://org/name@rev`, `pvc://claim/dir`, `oci://registry/repo:tag`, `file:///path`.

    Without a scheme (the v1alpha1 form): an absolute path is `file://`, anything else a
    Hugging Face repository id.
    """
    scheme, sep, rest = text.partition("://")
    if not sep:
        scheme, rest = ("file", text) if text.startswith("/") else ("hf", text)
    if scheme == "hf":
        repo, at, revision = rest.partition("@")
        if not re.match(HF_REPO, repo) or (at and not revision):
            raise ValueError(f"model.source: {text!r} is not hf://<org>/<name>[@<revision>]")
        return ModelSource(SourceKind.HF, repo, revision=revision or None)
    if scheme == "pvc":
        claim, _, path = rest.partition("/")
        if not re.match(DNS_SUBDOMAIN, claim) or ".." in path.split("/"):
            raise ValueError(f"model.source: {text!r} is not pvc://<claim>/<path>")
        return ModelSource(SourceKind.PVC, claim, path=path.strip("/"))
    if scheme == "oci":
        if not rest or any(c.isspace() for c in rest):
            raise ValueError(f"model.source: {text!r} is not oci://<registry>/<repository>:<tag>")
        return ModelSource(SourceKind.OCI, rest)
    if scheme == "file":
        if not rest.startswith("/"):
            raise ValueError(f"model.source: {text!r} is not file:///<absolute path>")
        return ModelSource(SourceKind.FILE, rest)
    raise ValueError(
        f"model.source: unknown scheme {scheme!r}; use hf://, pvc://, oci:// or file://"
    )


class SecretKeyRef(Model):
    name: str = Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN)
    """Name of the Secret (or ConfigMap), in the service's namespace."""
    key: str = Field(min_length=1, max_length=253)
    """Key inside it."""
    optional: bool | None = None
    """Start the pod even if the object or key is missing."""


class FieldRef(Model):
    field_path: str = Field(min_length=1, max_length=253)
    """Pod field (`metadata.name`, `status.podIP`, `spec.nodeName`, ...)."""
    api_version: str | None = Field(None, max_length=63)
    """Schema version of `fieldPath` (default `v1`)."""


class EnvVarSource(Model):
    """Exactly one source, as in a container's `env[].valueFrom`."""

    secret_key_ref: SecretKeyRef | None = None
    """A key of a Secret: the value never appears in the LLMService or anything the operator
    writes."""
    config_map_key_ref: SecretKeyRef | None = None
    """A key of a ConfigMap."""
    field_ref: FieldRef | None = None
    """A field of the pod (downward API)."""

    @model_validator(mode="after")
    def _one(self) -> EnvVarSource:
        set_ = [
            f for f in ("secret_key_ref", "config_map_key_ref", "field_ref") if getattr(self, f)
        ]
        if len(set_) != 1:
            raise ValueError(
                "valueFrom: set exactly one of secretKeyRef, configMapKeyRef, fieldRef"
            )
        return self


class ObjectRef(Model):
    name: str = Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN)
    """Name of the Secret or ConfigMap, in the service's namespace."""
    optional: bool | None = None
    """Start the pod even if it is missing."""


class EnvFromSource(Model):
    """Every key of a Secret or ConfigMap as environment variables (`envFrom`)."""

    secret_ref: ObjectRef | None = None
    """A Secret."""
    config_map_ref: ObjectRef | None = None
    """A ConfigMap."""
    prefix: str | None = Field(None, max_length=253, pattern=r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
    """Prepended to every key."""

    @model_validator(mode="after")
    def _one(self) -> EnvFromSource:
        if (self.secret_ref is None) == (self.config_map_ref is None):
            raise ValueError("envFrom: set exactly one of secretRef, configMapRef")
        return self


class CacheAccessMode(StrEnum):
    READ_WRITE_MANY = "ReadWriteMany"
    """Pods on any node share the cache (NFS, CephFS, Filestore, EFS, ...)."""
    READ_WRITE_ONCE = "ReadWriteOnce"
    """One node only: every worker of the service must land on that node."""


class ModelCacheSpec(Model):
    """A shared read-many volume holding the weights: downloaded once, then read by every pod."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.claimName) || (!has(self.size)"
                    " && !has(self.storageClassName)"
                    " && (!has(self.accessMode) || self.accessMode == 'ReadWriteMany'))",
                    "message": "size, storageClassName, accessMode: settings of the claim the "
                    "operator creates; with claimName none is created: remove them",
                }
            ]
        }
    )

    claim_name: str | None = Field(None, max_length=253, pattern=DNS_SUBDOMAIN)
    """An existing PersistentVolumeClaim to use. Left out: the operator creates
    `<service>-model-cache` (owned by the service: deleted with it)."""
    size: Quantity | None = None
    """Size of the claim the operator creates (required without `claimName`, refused with it)."""
    storage_class_name: str | None = Field(None, max_length=253)
    """Storage class of the claim the operator creates (refused with `claimName`). Left out: the
    cluster's default."""
    access_mode: CacheAccessMode = CacheAccessMode.READ_WRITE_MANY
    """Access mode of the claim the operator creates (`ReadWriteOnce` refused with `claimName`:
    the given claim's own mode applies)."""
    mount_path: str = Field("/models", min_length=2, max_length=1024, pattern=r"^/[^:]*$")
    """Where the cache is mounted in the download Job and (read-only) in worker pods."""
    download_image: str | None = Field(None, min_length=1, max_length=1024, pattern=IMAGE)
    """Image of the download Job (needs Python with `huggingface_hub`). Left out: `engine.image`."""
    download_pod: PodSettings | None = None
    """Scheduling and pod settings of the download Job (e.g. tolerations, or a `nodeSelector`
    for a `ReadWriteOnce` claim). Left out: the cluster's defaults."""

    @model_validator(mode="after")
    def _size(self) -> ModelCacheSpec:
        if self.download_pod is not None and self.download_pod.resource_claims:
            raise ValueError(
                "model.cache.downloadPod.resourceClaims: the download needs no devices"
            )
        if self.claim_name is not None:
            given = [
                f"model.cache.{name}"
                for name, unused in (
                    ("size", self.size is not None),
                    ("storageClassName", self.storage_class_name is not None),
                    ("accessMode", self.access_mode is not CacheAccessMode.READ_WRITE_MANY),
                )
                if unused
            ]
            if given:
                raise ValueError(
                    f"{', '.join(given)}: settings of the claim the operator creates; with "
                    f"model.cache.claimName {self.claim_name!r} none is created: remove them"
                )
        if self.claim_name is None and self.size is None:
            raise ValueError("model.cache.size: required when the operator creates the claim")
        if self.size is not None and not re.match(QUANTITY, str(self.size)):
            raise ValueError(f"model.cache.size: {self.size!r} is not a quantity (e.g. 200Gi)")
        return self


class Toleration(Model):
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.operator) || self.operator != 'Exists'"
                    " || !has(self.value) || self.value == ''",
                    "message": "tolerations[].value: must be empty with operator Exists",
                },
                {
                    "rule": "(has(self.key) && self.key != '')"
                    " || (has(self.operator) && self.operator == 'Exists')",
                    "message": "tolerations[].key: required unless operator is Exists",
                },
                {
                    "rule": "!has(self.tolerationSeconds)"
                    " || (has(self.effect) && self.effect == 'NoExecute')",
                    "message": "tolerations[].effect: tolerationSeconds needs effect NoExecute",
                },
            ]
        }
    )

    key: str | None = Field(None, max_length=316)
    """Taint key (left out with `operator: Exists`: every taint)."""
    operator: Literal["Exists", "Equal"] | None = None
    """`Equal` (default) or `Exists`."""
    value: str | None = Field(None, max_length=63)
    """Taint value (with `Equal`)."""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    """Taint effect to tolerate (left out: all)."""
    toleration_seconds: int | None = Field(None, ge=0)
    """`NoExecute`: how long the pod stays after the taint appears."""

    @model_validator(mode="after")
    def _as_kubernetes(self) -> Toleration:
        # What the API server refuses in a pod: the Deployment would never get one.
        if self.operator == "Exists" and self.value:
            raise ValueError("tolerations[].value: must be empty with operator Exists")
        if not self.key and self.operator != "Exists":
            raise ValueError("tolerations[].key: required unless operator is Exists")
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise ValueError("tolerations[].effect: tolerationSeconds needs effect NoExecute")
        return self


class TopologySpread(Model):
    """A `topologySpreadConstraint`; its `labelSelector` is the pod's own group (or router)."""

    topology_key: str = Field(min_length=1, max_length=316)
    """Node label to spread over (`kubernetes.io/hostname`, `topology.kubernetes.io/zone`)."""
    max_skew: int = Field(1, ge=1, le=1000)
    """Most pods one domain may have above the least loaded one."""
    when_unsatisfiable: Literal["DoNotSchedule", "ScheduleAnyway"] = "ScheduleAnyway"
    """Hard or soft constraint."""


class ResourceClaimRef(Model):
    """A Dynamic Resource Allocation claim of the pod (`resourceClaims`), used by its container."""

    name: str = Field(min_length=1, max_length=63, pattern=DNS_LABEL)
    """Name inside the pod."""
    resource_claim_name: str | None = Field(None, max_length=253, pattern=DNS_SUBDOMAIN)
    """An existing ResourceClaim (shared by every pod)."""
    resource_claim_template_name: str | None = Field(None, max_length=253, pattern=DNS_SUBDOMAIN)
    """A ResourceClaimTemplate (one claim per pod)."""

    @model_validator(mode="after")
    def _one(self) -> ResourceClaimRef:
        if (self.resource_claim_name is None) == (self.resource_claim_template_name is None):
            raise ValueError(
                f"resourceClaims[{self.name}]: set one of resourceClaimName, "
                "resourceClaimTemplateName"
            )
        return self


class LabelSelectorRequirement(Model):
    key: str = Field(min_length=1, max_length=316)
    """Label key."""
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]
    """How `values` apply (`Gt` / `Lt`: node selectors only)."""
    values: list[str] = Field(default_factory=list, max_length=64)
    """Values for `In`, `NotIn`, `Gt`, `Lt`."""


class NodeSelectorTerm(Model):
    match_expressions: list[LabelSelectorRequirement] = Field(default_factory=list, max_length=16)
    """Node label requirements, all of which must hold."""


class PreferredNodeTerm(Model):
    weight: int = Field(ge=1, le=100)
    """Weight of this preference."""
    preference: NodeSelectorTerm
    """Nodes preferred."""


class NodeAffinity(Model):
    required: list[NodeSelectorTerm] = Field(default_factory=list, max_length=16)
    """`requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms` (any one must hold)."""
    preferred: list[PreferredNodeTerm] = Field(default_factory=list, max_length=16)
    """`preferredDuringSchedulingIgnoredDuringExecution`."""


class LabelSelector(Model):
    match_labels: dict[str, str] = Field(default_factory=dict)
    """Labels the pods must have."""
    match_expressions: list[LabelSelectorRequirement] = Field(default_factory=list, max_length=16)
    """Label requirements, all of which must hold."""


class PodAffinityTerm(Model):
    topology_key: str = Field(min_length=1, max_length=316)
    """Node label defining "together" (`kubernetes.io/hostname`: the same node)."""
    label_selector: LabelSelector | None = None
    """The other pods. Left out: the pods of the same worker group (or the router's pods)."""


class PreferredPodTerm(Model):
    weight: int = Field(ge=1, le=100)
    """Weight of this preference."""
    term: PodAffinityTerm
    """`podAffinityTerm`."""


class PodAffinity(Model):
    required: list[PodAffinityTerm] = Field(default_factory=list, max_length=16)
    """`requiredDuringSchedulingIgnoredDuringExecution`."""
    preferred: list[PreferredPodTerm] = Field(default_factory=list, max_length=16)
    """`preferredDuringSchedulingIgnoredDuringExecution`."""


class Affinity(Model):
    """Kubernetes pod affinity, with the long field names shortened (`required`, `preferred`)."""

    node_affinity: NodeAffinity | None = None
    """Nodes the pods must or should run on."""
    pod_affinity: PodAffinity | None = None
    """Pods these pods must or should run near (e.g. decode next to prefill for same-node RDMA)."""
    pod_anti_affinity: PodAffinity | None = None
    """Pods these pods must or should run away from (e.g. one worker per node)."""


class PvcVolume(Model):
    claim_name: str = Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN)
    """The PersistentVolumeClaim."""
    read_only: bool | None = None
    """Mount read-only."""


class HostPathVolume(Model):
    path: str = Field(min_length=1, max_length=4096, pattern=r"^/")
    """Path on the node."""
    type: Literal["", "Directory", "DirectoryOrCreate", "File", "FileOrCreate", "Socket"] | None = (
        None
    )
    """What must be at `path`."""


class EmptyDirVolume(Model):
    medium: Literal["", "Memory"] | None = None
    """`Memory` for tmpfs."""
    size_limit: Quantity | None = None
    """Most the volume may hold."""


class ObjectVolume(Model):
    name: str = Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN)
    """The Secret or ConfigMap."""
    optional: bool | None = None
    """Start the pod even if it is missing."""


class CsiVolume(Model):
    driver: str = Field(min_length=1, max_length=253)
    """CSI driver name."""
    read_only: bool | None = None
    """Mount read-only."""
    volume_attributes: dict[str, str] = Field(default_factory=dict)
    """Driver-specific attributes."""


class ImageVolume(Model):
    reference: str = Field(min_length=1, max_length=1024)
    """OCI image reference (Kubernetes 1.33+ image volumes)."""
    pull_policy: PullPolicy | None = None
    """Pull policy of the image."""


class NfsVolume(Model):
    server: str = Field(min_length=1, max_length=253)
    """NFS server."""
    path: str = Field(min_length=1, max_length=4096)
    """Exported path."""
    read_only: bool | None = None
    """Mount read-only."""


class Volume(Model):
    """An extra pod volume: exactly one source."""

    name: str = Field(min_length=1, max_length=63, pattern=DNS_LABEL)
    """Volume name (referred to by `volumeMounts`)."""
    persistent_volume_claim: PvcVolume | None = None
    """A PersistentVolumeClaim."""
    host_path: HostPathVolume | None = None
    """A node directory (needs a privileged-enough namespace)."""
    empty_dir: EmptyDirVolume | None = None
    """Scratch space for the pod's lifetime."""
    secret: ObjectVolume | None = None
    """A Secret's keys as files."""
    config_map: ObjectVolume | None = None
    """A ConfigMap's keys as files."""
    csi: CsiVolume | None = None
    """An inline CSI volume."""
    image: ImageVolume | None = None
    """An OCI image's files."""
    nfs: NfsVolume | None = None
    """An NFS export."""

    def source(self) -> tuple[str, dict[str, Any]]:
        """(Kubernetes field name, body) of the one source."""
        wire = self.wire()
        wire.pop("name")
        ((key, body),) = wire.items()
        if key in ("secret", "configMap"):
            body = {"secretName" if key == "secret" else "name": body.pop("name"), **body}
        return key, body

    @model_validator(mode="after")
    def _one(self) -> Volume:
        sources = [k for k in self.wire() if k != "name"]
        if len(sources) != 1:
            raise ValueError(
                f"pod.volumes[{self.name}]: set exactly one source (persistentVolumeClaim, "
                "hostPath, emptyDir, secret, configMap, csi, image, nfs)"
            )
        return self


class VolumeMount(Model):
    name: str = Field(min_length=1, max_length=63, pattern=DNS_LABEL)
    """One of `pod.volumes`."""
    mount_path: str = Field(min_length=1, max_length=4096, pattern=r"^/[^:]*$")
    """Where it appears in the container."""
    sub_path: str | None = Field(None, max_length=4096)
    """A path inside the volume to mount instead of its root."""
    read_only: bool | None = None
    """Mount read-only."""


RESERVED_VOLUMES: Final = frozenset({"dshm", "model", "model-cache", "config", "tmp"})
"""Volume names the operator uses itself."""


class PodSettings(Model):
    """Scheduling and pod-level settings, passed to the pod template as Kubernetes defines them."""

    annotations: dict[str, str] = Field(default_factory=dict)
    """Extra pod annotations (e.g. `k8s.v1.cni.cncf.io/networks` for an RDMA secondary network)."""
    labels: dict[str, str] = Field(default_factory=dict)
    """Extra pod labels (never the operator's own `splitserve.io/` labels)."""
    node_selector: dict[str, str] = Field(default_factory=dict)
    """Node labels the pods must run on."""
    tolerations: list[Toleration] = Field(default_factory=list, max_length=32)
    """Taints the pods tolerate (GPU nodes are usually tainted `nvidia.com/gpu:NoSchedule`)."""
    affinity: Affinity | None = None
    """Node affinity, pod affinity and anti-affinity."""
    topology_spread: list[TopologySpread] = Field(default_factory=list, max_length=8)
    """Spread the pods over nodes or zones."""
    priority_class_name: str | None = Field(None, max_length=253, pattern=DNS_SUBDOMAIN)
    """PriorityClass of the pods."""
    runtime_class_name: str | None = Field(None, max_length=253, pattern=DNS_SUBDOMAIN)
    """RuntimeClass of the pods (e.g. `nvidia` where the NVIDIA runtime is not the default)."""
    service_account_name: str | None = Field(None, max_length=253, pattern=DNS_SUBDOMAIN)
    """Workers only: the pods' ServiceAccount (e.g. for workload identity to a model store)."""
    image_pull_secrets: list[str] = Field(default_factory=list, max_length=16)
    """Secrets to pull private images with."""
    volumes: list[Volume] = Field(default_factory=list, max_length=32)
    """Extra pod volumes."""
    volume_mounts: list[VolumeMount] = Field(default_factory=list, max_length=32)
    """Extra mounts in the main container."""
    resource_claims: list[ResourceClaimRef] = Field(default_factory=list, max_length=16)
    """Dynamic Resource Allocation claims (clusters that allocate GPUs or NICs through DRA);
    the main container uses every one."""

    @model_validator(mode="after")
    def _check(self) -> PodSettings:
        bad = [k for k in self.labels if k.startswith((f"{GROUP}/", "app.kubernetes.io/"))]
        if bad:
            raise ValueError(f"pod.labels: {bad[0]!r} is set by the operator")
        names = [v.name for v in self.volumes]
        if len(set(names)) != len(names):
            raise ValueError("pod.volumes: names must be unique")
        for v in self.volumes:
            if v.name in RESERVED_VOLUMES:
                raise ValueError(f"pod.volumes[{v.name}]: the name is used by the operator")
        for m in self.volume_mounts:
            if m.name not in names:
                raise ValueError(f"pod.volumeMounts: no volume {m.name!r} in pod.volumes")
        claims = [c.name for c in self.resource_claims]
        if len(set(claims)) != len(claims):
            raise ValueError("pod.resourceClaims: names must be unique")
        return self


class KvTransport(StrEnum):
    RDMA = "rdma"
    """InfiniBand / RoCE verbs (UCX `rc`): needs an RDMA device in the pod and `IPC_LOCK`."""
    TCP = "tcp"
    """Plain TCP over the pod network (works everywhere; slowest)."""
    NVLINK = "nvlink"
    """CUDA IPC over NVLink (UCX `cuda_ipc`): only between processes that share an IPC
    namespace, so in practice only inside one pod; between pods on one node use RDMA."""


class NixlBackend(StrEnum):
    UCX = "UCX"
    """Unified Communication X (NIXL's default): RDMA, TCP, shared memory, CUDA IPC."""
    LIBFABRIC = "LIBFABRIC"
    """OFI libfabric (e.g. AWS EFA)."""


class KvTransferSpec(Model):
    """How vLLM workers move KV caches (NIXL). Applies to `engine.kind: vllm` only."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.backend) || self.backend == 'UCX'"
                    " || !has(self.transports) || size(self.transports) == 0",
                    "message": "transports: UCX transports need backend UCX",
                },
                {
                    "rule": "!has(self.backend) || self.backend == 'UCX' || !has(self.netDevices)",
                    "message": "netDevices: UCX_NET_DEVICES needs backend UCX (LIBFABRIC never "
                    "reads it)",
                },
                {
                    "rule": "!has(self.rdmaCount) || self.rdmaCount == 1 || has(self.rdmaResource)",
                    "message": "rdmaCount: counts rdmaResource devices; set rdmaResource too",
                },
            ]
        }
    )

    backend: NixlBackend = NixlBackend.UCX
    """NIXL transfer backend."""
    transports: list[KvTransport] = Field(default_factory=list, max_length=3)
    """UCX transports to allow (`UCX_TLS`), besides shared memory and CUDA staging copies.
    Empty: UCX picks among everything it finds."""
    net_devices: str | None = Field(None, max_length=1024, pattern=r"^[-_.:,A-Za-z0-9]+$")
    """`UCX_NET_DEVICES`: the NICs to use (e.g. `mlx5_0:1,mlx5_1:1`). Left out: all. Backend UCX
    only."""
    rdma_resource: str | None = Field(None, max_length=253)
    """Extended resource of the RDMA device plugin each worker requests
    (e.g. `rdma/rdma_shared_device_a`, `rdma/ib`, `vpc.amazonaws.com/efa`)."""
    rdma_count: int = Field(1, ge=1, le=64)
    """How many `rdmaResource` devices each worker requests (refused other than 1 without
    `rdmaResource`)."""
    ipc_lock: bool | None = None
    """Add the `IPC_LOCK` capability (RDMA pins memory). Left out: when `transports` has `rdma`
    or `rdmaResource` is set."""
    side_channel_port: int = Field(5600, ge=1, le=65535)
    """Port where decode workers fetch a prefill worker's NIXL metadata; the host is always the
    pod IP."""
    env: list[EnvVar] = Field(default_factory=list, max_length=32)
    """More UCX / NIXL / NCCL settings (`UCX_IB_GID_INDEX`, `UCX_RNDV_THRESH`, ...)."""

    @model_validator(mode="after")
    def _check(self) -> KvTransferSpec:
        if len(set(self.transports)) != len(self.transports):
            raise ValueError("kvTransfer.transports: entries must be distinct")
        if self.backend is NixlBackend.LIBFABRIC and self.transports:
            raise ValueError("kvTransfer.transports: UCX transports need backend UCX")
        if self.backend is NixlBackend.LIBFABRIC and self.net_devices is not None:
            raise ValueError(
                "kvTransfer.netDevices: UCX_NET_DEVICES needs backend UCX (LIBFABRIC never "
                "reads it)"
            )
        if self.rdma_count != 1 and self.rdma_resource is None:
            raise ValueError(
                f"kvTransfer.rdmaCount: {self.rdma_count} counts rdmaResource devices; set "
                "rdmaResource too (no device is requested without it)"
            )
        return self

    @property
    def wants_ipc_lock(self) -> bool:
        if self.ipc_lock is not None:
            return self.ipc_lock
        return KvTransport.RDMA in self.transports or self.rdma_resource is not None


class ArtifactPhase(StrEnum):
    PENDING = "Pending"
    DOWNLOADING = "Downloading"
    READY = "Ready"
    FAILED = "Failed"
    PER_POD = "PerPod"
    """No cache: every worker pod downloads the model when it starts."""


class ArtifactStatus(Model):
    """Where the model's weights are, and whether the workers can load them."""

    source: str
    """`model.source` as given."""
    phase: ArtifactPhase
    """Pending, Downloading, Ready, Failed or PerPod."""
    path: str | None = None
    """The directory the workers load from."""
    job: str | None = None
    """The download Job, when there is one."""
    message: str = Field("", max_length=1024)
    """What is going on, with what to do about it."""


class ModelSpec(Model):
    name: str = Field(min_length=1, max_length=253)
    """The model name clients send in OpenAI requests (`model` field)."""
    source: str = Field(min_length=1, max_length=1024)
    """Where the weights come from: `hf://org/name[@revision]`, `pvc://claim/dir`,
    `oci://registry/repository:tag` (an image volume) or `file:///path` in the pod. Without a
    scheme: a Hugging Face repository id, or an absolute path."""
    revision: str | None = Field(None, max_length=253)
    """Revision (branch, tag or commit) of `source`; every worker of the service must share it.
    vLLM only: refused with `engine.kind: sim` (as an `@revision` in `source` is)."""
    tokenizer: str | None = Field(None, max_length=1024)
    """Tokenizer repository id or path, when it differs from `source`. With `engine.kind: sim`
    the router tokenizes with it and the workers draw their tokens from its vocabulary and end
    answers with its end-of-text token (without it: the local default tokenizer)."""
    auth_secret: SecretKeyRef | None = None
    """Secret key holding the Hugging Face token (`HF_TOKEN` in the download Job, the workers and
    the router). With `engine.kind: sim` the router and the workers read it only to fetch a
    Hugging Face `tokenizer`: refused without one."""
    cache: ModelCacheSpec | None = None
    """Download an `hf://` model once into a shared volume; workers then load it without network."""

    def parsed_source(self) -> ModelSource:
        return parse_model_source(self.source)

    @model_validator(mode="after")
    def _source(self) -> ModelSpec:
        src = self.parsed_source()
        if src.revision and self.revision and src.revision != self.revision:
            raise ValueError(
                f"model.revision: {self.revision!r} differs from the source's @{src.revision}"
            )
        if self.cache is not None and src.kind is not SourceKind.HF:
            raise ValueError(
                f"model.cache: a {src.kind.value}:// source is read in place; the cache holds "
                "hf:// downloads only"
            )
        return self


class EnvVar(Model):
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!(has(self.value) && has(self.valueFrom))",
                    "message": "set value or valueFrom, not both",
                }
            ]
        }
    )

    name: str = Field(min_length=1, max_length=253, pattern=r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
    """Environment variable name."""
    value: str | None = Field(None, max_length=32768)
    """A literal value. Never a credential: use `valueFrom.secretKeyRef`."""
    value_from: EnvVarSource | None = None
    """Where the value comes from (a Secret or ConfigMap key, or a pod field)."""

    @model_validator(mode="after")
    def _source(self) -> EnvVar:
        if self.value is not None and self.value_from is not None:
            raise ValueError(f"env[{self.name}]: set value or valueFrom, not both")
        if self.value and SECRETISH_ENV.search(self.name.upper()):
            raise ValueError(
                f"env[{self.name}].value: looks like a credential; a literal value would be "
                "readable by anyone who can read the LLMService: use valueFrom.secretKeyRef"
            )
        return self


class BatchingPolicyName(StrEnum):
    """Every registered `policy.batching` step policy (a test keeps this list equal to the
    registry, so the CRD refuses an unknown name)."""

    ACCELGEN = "accelgen"
    ALISE = "alise"
    BROS = "bros"
    FCFS = "fcfs"
    PASTFUTURE = "pastfuture"
    SARATHI = "sarathi"
    TETRIINFER_DECODE = "tetriinfer-decode"
    TETRIINFER_PREFILL = "tetriinfer-prefill"


class EngineSpec(Model):
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "(has(self.grpcPort) ? self.grpcPort : 50051)"
                    " != (has(self.metricsPort) ? self.metricsPort : 9090)",
                    "message": "engine.grpcPort and engine.metricsPort are the same port: the "
                    "worker serves each on its own",
                }
            ]
        }
    )

    kind: EngineKind = EngineKind.VLLM
    """Which engine the workers run."""
    image: str = Field(min_length=1, max_length=1024, pattern=IMAGE)
    """Worker container image (holds splitserve and the engine)."""
    image_pull_policy: PullPolicy = PullPolicy.IF_NOT_PRESENT
    """Kubernetes image pull policy of the worker containers."""
    args: list[str] = Field(default_factory=list, max_length=128)
    """Extra engine arguments, appended to every worker's command line (after `--`). vLLM
    only: refused with `kind: sim`."""
    env: list[EnvVar] = Field(default_factory=list, max_length=64)
    """Extra environment variables for every worker container."""
    env_from: list[EnvFromSource] = Field(default_factory=list, max_length=16)
    """Secrets and ConfigMaps whose every key becomes an environment variable of the workers."""
    grpc_port: int = Field(50051, ge=1, le=65535)
    """Port of the worker's gRPC service (Prefill, Decode, Drain, SetRole, ...)."""
    metrics_port: int = Field(9090, ge=1, le=65535)
    """Port of the worker's Prometheus `/metrics` endpoint."""
    batching: BatchingPolicyName = BatchingPolicyName.FCFS
    """The engine's step policy; SLO-aware ones (`accelgen`, `bros`, `pastfuture`) act on each
    request's class, priority and deadline, which the router sends with every call."""
    batching_params: str = Field("{}", max_length=65536)
    """Parameters of that step policy: a JSON object of its documented params."""

    @model_validator(mode="after")
    def _ports(self) -> EngineSpec:
        if self.grpc_port == self.metrics_port:
            raise ValueError(
                f"engine.grpcPort and engine.metricsPort are the same port ({self.grpc_port}): "
                "the worker serves each on its own"
            )
        return self

    @field_validator("batching_params")
    @classmethod
    def _json_object(cls, value: str) -> str:
        try:
            parsed = json.loads(value)
        except ValueError as err:
            raise ValueError(f"engine.batchingParams: not JSON: {err}") from err
        if not isinstance(parsed, dict):
            raise ValueError("engine.batchingParams: must be a JSON object")
        return value


class ResourceRequirements(Model):
    requests: dict[str, Quantity] = Field(default_factory=dict)
    """Minimum resources per pod, as in a container's `resources.requests`."""
    limits: dict[str, Quantity] = Field(default_factory=dict)
    """Maximum resources per pod, as in a container's `resources.limits`."""


class WorkerGroup(Model):
    """One Deployment of identical worker pods. Roles are assigned per pod, at run time."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.nodes) || self.nodes == 1",
                    "message": "nodes: multi-node workers (LeaderWorkerSet) are not supported yet",
                },
                {
                    "rule": "!has(self.gpus) || self.gpus == 0 || !has(self.tensorParallel)"
                    " || self.tensorParallel <= self.gpus",
                    "message": "tensorParallel: needs at least as many gpus per pod",
                },
                {
                    "rule": "!has(self.gpuResource) || self.gpuResource == 'nvidia.com/gpu'"
                    " || (has(self.gpus) && self.gpus > 0)",
                    "message": "gpuResource: names what gpus requests; set gpus too",
                },
            ]
        }
    )

    name: str = Field(min_length=1, max_length=40, pattern=DNS_LABEL)
    """Group name; the Deployment is called `<service>-<name>`."""
    roles: list[Role] = Field(min_length=1, max_length=3)
    """Roles the group's pods may take. The operator moves pods between these roles only."""
    replicas: int | None = Field(None, ge=0, le=10000)
    """Fixed pod count. Left out: the operator sizes the group from the pools it serves."""
    gpus: int = Field(0, ge=0, le=64)
    """Accelerators per pod (requested as `gpuResource`)."""
    gpu_resource: str = Field("nvidia.com/gpu", min_length=1, max_length=253)
    """Extended resource name of the accelerator (another than the default needs `gpus`)."""
    tensor_parallel: int = Field(1, ge=1, le=64)
    """Tensor-parallel degree of the engine in each pod."""
    resources: ResourceRequirements = Field(default_factory=ResourceRequirements)
    """CPU and memory of each worker pod (accelerators come from `gpus`)."""
    node_selector: dict[str, str] = Field(default_factory=dict)
    """Node labels the group's pods must run on."""
    engine_args: list[str] = Field(default_factory=list, max_length=128)
    """Engine arguments for this group only, after `engine.args` (vLLM only: refused with
    `engine.kind: sim`)."""
    shm_size: Quantity | None = None
    """Size of the `/dev/shm` memory volume (NCCL, vLLM's workers). Left out: 2Gi per
    tensor-parallel rank for groups with accelerators, none otherwise; `0`: none. Counts
    against the pod's memory limit."""
    nodes: int = Field(1, ge=1, le=64)
    """Nodes per worker. Multi-node workers (tensor x pipeline parallel beyond one node, through
    LeaderWorkerSet) are not supported yet: 1."""
    pod: PodSettings = Field(default_factory=PodSettings)
    """Scheduling and pod settings of the group's pods."""

    @model_validator(mode="after")
    def _distinct_roles(self) -> WorkerGroup:
        if len(set(self.roles)) != len(self.roles):
            raise ValueError(f"workerGroups[{self.name}].roles: roles must be distinct")
        if self.nodes != 1:
            raise ValueError(
                f"workerGroups[{self.name}].nodes: multi-node workers (LeaderWorkerSet) are not "
                "supported yet; keep tensorParallel within one node's GPUs (nodes: 1)"
            )
        if self.gpu_resource != "nvidia.com/gpu" and not self.gpus:
            raise ValueError(
                f"workerGroups[{self.name}].gpuResource: {self.gpu_resource!r} names what gpus "
                "requests, and gpus is 0 (nothing is requested): set gpus too"
            )
        if self.node_selector and self.pod.node_selector:
            raise ValueError(
                f"workerGroups[{self.name}]: set nodeSelector or pod.nodeSelector, not both"
            )
        if self.shm_size is not None and not re.match(QUANTITY, str(self.shm_size)):
            raise ValueError(
                f"workerGroups[{self.name}].shmSize: {self.shm_size!r} is not a quantity"
            )
        if self.gpus and self.tensor_parallel > self.gpus:
            raise ValueError(
                f"workerGroups[{self.name}].tensorParallel: {self.tensor_parallel} ranks need "
                f"at least as many gpus per pod (gpus: {self.gpus})"
            )
        return self


_MIN_OVER_MAX: Final = "(has(self.maxReplicas) && self.minReplicas > self.maxReplicas)"
_NEGATIVE: Final = "self.replicas < 0 || self.minReplicas < 0"
_MIN_MAX_RULE: Final[JsonValue] = {
    "rule": "!has(self.maxReplicas) || self.minReplicas <= self.maxReplicas",
    "message": "minReplicas must be <= maxReplicas",
    "messageExpression": "'minReplicas (' + string(self.minReplicas) + ') must be <= maxReplicas ('"
    " + string(self.maxReplicas) + ')'",
}
# One message per mistake: the range rules stay quiet when min > max (reported above) or a value
# is negative (the schema's `minimum` reports it).
_POOL_CEL: Final[list[JsonValue]] = [
    _MIN_MAX_RULE,
    {
        "rule": f"{_MIN_OVER_MAX} || {_NEGATIVE} || self.replicas >= self.minReplicas",
        "message": "replicas must be >= minReplicas",
        "messageExpression": "'replicas (' + string(self.replicas) + ') must be >= minReplicas ('"
        " + string(self.minReplicas) + ')'",
    },
    {
        "rule": f"!has(self.maxReplicas) || {_MIN_OVER_MAX} || {_NEGATIVE}"
        " || self.replicas <= self.maxReplicas",
        "message": "replicas must be <= maxReplicas",
        "messageExpression": "'replicas (' + string(self.replicas) + ') must be <= maxReplicas ('"
        " + string(self.maxReplicas) + ')'",
    },
]


def _check_bounds(replicas: int | None, min_replicas: int, max_replicas: int | None) -> None:
    """The CEL rules above, for the operator and `splitserve.operator.validate`."""
    if max_replicas is not None and min_replicas > max_replicas:
        raise ValueError(f"minReplicas ({min_replicas}) must be <= maxReplicas ({max_replicas})")
    if replicas is None:
        return
    if replicas < min_replicas:
        raise ValueError(f"replicas ({replicas}) must be >= minReplicas ({min_replicas})")
    if max_replicas is not None and replicas > max_replicas:
        raise ValueError(f"replicas ({replicas}) must be <= maxReplicas ({max_replicas})")


class PoolSpec(Model):
    """The size of one role's pool (the `LLMPool` the operator creates from it)."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": _POOL_CEL})

    replicas: int = Field(1, ge=0, le=10000)
    """Initial (Manual, External) or operator-owned (Managed) number of workers in the role."""
    min_replicas: int = Field(0, ge=0, le=10000)
    """The autoscaler never goes below this."""
    max_replicas: int | None = Field(None, ge=0, le=10000)
    """The autoscaler never goes above this. Left out: no upper bound."""

    @model_validator(mode="after")
    def _bounds(self) -> PoolSpec:
        _check_bounds(self.replicas, self.min_replicas, self.max_replicas)
        return self


class Pools(Model):
    """One pool per role. At least one must be set."""

    model_config = ConfigDict(json_schema_extra={"minProperties": 1})

    prefill: PoolSpec | None = None
    """Workers that run prompts and hand the KV cache to decode workers."""
    decode: PoolSpec | None = None
    """Workers that pull KV caches and generate tokens."""
    mixed: PoolSpec | None = None
    """Workers that serve whole requests (aggregated), and either half when needed."""

    def items(self) -> list[tuple[Role, PoolSpec]]:
        """The pools that are set, in role order (prefill, decode, mixed)."""
        pairs = [(Role.PREFILL, self.prefill), (Role.DECODE, self.decode), (Role.MIXED, self.mixed)]
        return [(role, p) for role, p in pairs if p is not None]

    @model_validator(mode="after")
    def _some_pool(self) -> Pools:
        if not self.items():
            raise ValueError("pools: set at least one of prefill, decode, mixed")
        return self


RESERVED_CLASS_MESSAGE: Final = (
    "the class name 'other' is reserved: the router's metrics count requests that name an "
    "undeclared class under it"
)


class SloClassSpec(Model):
    """A class of requests with latency targets (online) or a completion deadline (offline)."""

    model_config = ConfigDict(
        allow_inf_nan=False,  # `ttftMs: .inf` passed gt=0, then failed in the router's start
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "(has(self.ttftMs) && has(self.tpotMs))"
                    " || has(self.jobCompletionSeconds)",
                    "message": "set ttftMs and tpotMs, or jobCompletionSeconds",
                },
                {
                    "rule": "!(has(self.allowOverrides) && self.allowOverrides)"
                    " || has(self.ttftMs) || has(self.tpotMs)",
                    "message": "allowOverrides needs ttftMs or tpotMs (an offline class has no"
                    " latency target to override)",
                },
                {"rule": "self.name != 'other'", "message": RESERVED_CLASS_MESSAGE},
            ]
        },
    )

    name: str = Field(min_length=1, max_length=63, pattern=CLASS_NAME)
    """Class name; clients pick it with the `x-slo-class` header."""
    ttft_ms: float | None = Field(None, gt=0)
    """Time-to-first-token target at `percentile`, in milliseconds."""
    tpot_ms: float | None = Field(None, gt=0)
    """Time-per-output-token target at `percentile`, in milliseconds."""
    percentile: float = Field(0.9, gt=0, le=1)
    """Quantile at which the latency targets must hold (0.9 = p90)."""
    attainment: float = Field(0.9, gt=0, le=1)
    """Fraction of the class's requests that must meet both targets."""
    job_completion_seconds: float | None = Field(None, gt=0)
    """Offline classes: each request must finish within this many seconds of arrival."""
    priority: int = Field(0, ge=-1000, le=1000)
    """Higher runs first when the router has to queue."""
    sheddable: bool = False
    """Requests that cannot meet their SLO are refused (HTTP 429) instead of queued."""
    allow_overrides: bool = False
    """Clients may set their own targets with `x-slo-ttft-ms` / `x-slo-tpot-ms`, within 1/4x to
    4x of this class's targets. False: those headers are a 400 for this class."""

    @field_validator(
        "ttft_ms",
        "tpot_ms",
        "percentile",
        "attainment",
        "job_completion_seconds",
        "priority",
        mode="before",
    )
    @classmethod
    def _a_number(cls, value: Any) -> Any:
        return not_a_bool(value)

    @field_validator("name")
    @classmethod
    def _not_reserved(cls, value: str) -> str:
        if value == "other":
            raise ValueError(RESERVED_CLASS_MESSAGE)
        return value

    @model_validator(mode="after")
    def _targets(self) -> SloClassSpec:
        online = self.ttft_ms is not None and self.tpot_ms is not None
        if not online and self.job_completion_seconds is None:
            raise ValueError(
                f"sloClasses[{self.name}]: set ttftMs and tpotMs, or jobCompletionSeconds"
            )
        if self.allow_overrides and self.ttft_ms is None and self.tpot_ms is None:
            raise ValueError(
                f"sloClasses[{self.name}]: allowOverrides needs ttftMs or tpotMs (an offline "
                "class has no latency target to override)"
            )
        return self


class ServiceType(StrEnum):
    CLUSTER_IP = "ClusterIP"
    NODE_PORT = "NodePort"
    LOAD_BALANCER = "LoadBalancer"


class Disaggregation(StrEnum):
    AUTO = "Auto"
    """Per request: split prefill and decode unless the prompt is short or no prefill fits."""
    ALWAYS = "Always"
    """Always split (fall back to aggregated only on failure)."""
    NEVER = "Never"
    """Aggregated serving only (decode and mixed workers)."""


class PlacementProfile(StrEnum):
    DEFAULT = "default"
    """Least-loaded + KV headroom + SLO headroom (TTFT on prefill, TPOT on decode)."""
    LEAST_LOADED = "least-loaded"
    """Least-loaded and KV headroom only (no SLO headroom)."""
    TETRIINFER = "tetriinfer"
    """TetriInfer: decode by power-of-two choices over the heavy:light decode mix."""
    SPLITWISE = "splitwise"
    """Splitwise: prompt, token and mixed pools with join-the-shortest-queue."""
    ALADDIN = "aladdin"
    """Aladdin: best-fit bin packing against TPOT and KV constraints."""
    PAST_FUTURE = "past-future"
    """Past-Future: the decode worker whose future peak KV use stays lowest."""


class LengthPredictor(StrEnum):
    PER_CLASS = "per-class"
    """Learns online from finished requests, per SLO class and prompt-length bucket."""
    BUCKETED = "bucketed"
    """Learns online per prompt-length bucket, one table for every class."""
    HISTORY = "history"
    """The last finished lengths (Past-Future's window), whatever the prompt."""


class WorkerLink(StrEnum):
    GRPC = "grpc"
    """The `Worker.Multiplex` gRPC stream on the workers' gRPC port."""
    STREAM = "stream"
    """The same messages length-prefixed over a plain TCP / TLS socket to each worker's link
    port (no `grpc.aio` per message; docs/operations.md "The router's link to its workers")."""


class RouterEdgeSpec(Model):
    """The router's client-facing limits (`RouterConfig.edge`, docs/reliability.md). Every field
    left out keeps the router's default."""

    max_body_bytes: int | None = Field(None, ge=1024, le=1 << 34)
    """Largest HTTP request body in bytes; a larger one gets 413 (router default 8 MiB)."""
    max_prompt_chars: int | None = Field(None, ge=1)
    """Longest prompt in characters (a chat's contents, 32 per message for its markup, and its
    tools), checked before tokenizing; a longer one gets 400 (router default: 32 x the model's
    context length)."""
    max_stop_strings: int | None = Field(None, ge=0, le=10_000)
    """Most stop strings per request (router default 16)."""
    max_stop_string_chars: int | None = Field(None, ge=1)
    """Longest stop string in characters (router default 1024)."""
    max_connections: int | None = Field(None, ge=1, le=1_000_000)
    """Open HTTP connections per router process; the next one gets 429 (router default 4096)."""
    header_timeout_seconds: float | None = Field(None, gt=0, le=3600)
    """A request's line and headers must arrive within this time, else 408 (router default 10)."""
    body_timeout_seconds: float | None = Field(None, gt=0, le=3600)
    """A request's body must arrive within this time after its headers, else 408 (router
    default 60)."""
    idle_timeout_seconds: float | None = Field(None, gt=0, le=86400)
    """An idle keep-alive connection is closed after this long (router default 30)."""
    inline_tokenize_max_chars: int | None = Field(None, ge=0)
    """Prompts up to this many characters are tokenized on the event loop, longer ones in a
    thread (router default 2048)."""
    tokenizer_threads: int | None = Field(None, ge=1, le=256)
    """Threads that tokenize long prompts (router default 2)."""
    drain_grace_seconds: float | None = Field(None, ge=0, le=3600)
    """On shutdown, how long in-flight requests may run on before they are cut (router default
    30). The router pods' termination grace period is set a little longer."""
    allow_unknown_fields: bool | None = None
    """Request bodies with fields the API does not know are refused with a 400 naming the field
    (router default). True: such fields are dropped instead, for clients that send vendor
    extras; known fields still act or are refused."""
    tool_call_parser: Literal["hermes", "llama3_json", "pythonic"] | None = None
    """How the router reads tool calls from the model's text, as vLLM's `--tool-call-parser`:
    `hermes` (`<tool_call>{json}</tool_call>`: Hermes 2 Pro, Qwen 2 / 2.5 / 3), `llama3_json`
    (JSON objects `{"name", "arguments"}` separated by `;`: Llama 3.x), `pythonic` (a Python
    list of calls `[f(x=1)]`: Llama 3.2 / 4). Unset: chat
    requests with `tools` and `tool_choice` `auto` (the default) get a 400
    (docs/openai-api.md)."""

    def settings_fields(self) -> dict[str, Any]:
        """The fields that are set, by their `EdgeSettings` names (`*_seconds` -> `*_s`)."""
        return {
            name.removesuffix("_seconds") + "_s" if name.endswith("_seconds") else name: value
            for name, value in self.model_dump(by_alias=False, exclude_none=True).items()
        }


class StockBackendSpec(Model):
    """One stock `vllm serve` OpenAI server (docs/engines.md)."""

    url: str = Field(min_length=1, max_length=2048, pattern=r"^https?://[^/?#\s]+/?$")
    """Base URL of its OpenAI API, e.g. `http://vllm-0.vllm:8000` (no path)."""
    role: Role = Role.MIXED
    """What the router places there: `prefill`, `decode` or `mixed`. P/D needs the server
    started with vLLM's NIXL `--kv-transfer-config` (`kv_role: kv_both`)."""


class StockBackendDiscoverySpec(Model):
    """Stock `vllm serve` pods found by their labels, in the service's namespace: every pod
    that matches, has an IP and a role label is a backend at `scheme://podIP:httpPort`, fenced
    while not Ready or while its fenced label is `"true"`."""

    selector: str = Field(min_length=1, max_length=1024)
    """Label selector of the pods (`app=vllm,tier=serve`; `!=`, `in (...)`, ... too)."""
    role_label: str = Field(min_length=1, max_length=317)
    """Label holding a pod's role (`prefill`, `decode` or `mixed`); pods without it are not
    backends."""
    fenced_label: str = Field("splitserve.io/fenced", min_length=1, max_length=317)
    """Label that is `"true"` while a pod should get no new work."""
    http_port: int = Field(8000, ge=1, le=65535)
    """Port of every pod's OpenAI API (`vllm serve --port`)."""
    scheme: Literal["http", "https"] = "http"
    """URL scheme of the servers."""


class RouterSpec(Model):
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.serviceType) || self.serviceType == 'ClusterIP'"
                    " || has(self.apiKeySecret)"
                    " || (has(self.exposeWithoutKeys) && self.exposeWithoutKeys)",
                    "message": "serviceType NodePort or LoadBalancer exposes the router outside "
                    "the cluster: set apiKeySecret (or exposeWithoutKeys: true)",
                },
                {
                    "rule": "!has(self.exposeWithoutKeys) || !self.exposeWithoutKeys || "
                    "(has(self.serviceType) && self.serviceType != 'ClusterIP'"
                    " && !has(self.apiKeySecret))",
                    "message": "exposeWithoutKeys: true acts only with serviceType NodePort or "
                    "LoadBalancer and no apiKeySecret (with keys the router still demands "
                    "them): remove it",
                },
                {
                    "rule": "(has(self.httpPort) ? self.httpPort : 8000)"
                    " != (has(self.grpcPort) ? self.grpcPort : 50050)",
                    "message": "router.httpPort and router.grpcPort are the same port: the "
                    "router serves each on its own (and its Service names each once)",
                },
            ]
        }
    )

    replicas: int = Field(1, ge=0, le=1000)
    """Router pods (the router is stateless; scale it freely)."""
    image: str | None = Field(None, min_length=1, max_length=1024, pattern=IMAGE)
    """Router image. Left out: the operator's `--router-image` (the chart's splitserve image)."""
    http_port: int = Field(8000, ge=1, le=65535)
    """Port of the OpenAI-compatible HTTP API on the Service."""
    grpc_port: int = Field(50050, ge=1, le=65535)
    """Port of the `splitserve.v1.Router` gRPC API on the Service."""
    service_type: ServiceType = ServiceType.CLUSTER_IP
    """Kubernetes Service type of the router's Service."""
    disaggregation: Disaggregation = Disaggregation.AUTO
    """When to split prefill and decode onto different workers."""
    placement_profile: PlacementProfile = PlacementProfile.DEFAULT
    """The placement profile (filters, scorers, picker) the router uses."""
    length_predictor: LengthPredictor = LengthPredictor.PER_CLASS
    """How the router predicts each request's output length (placement and admission)."""
    admission_queue_capacity: int = Field(1024, ge=0, le=1_000_000)
    """Requests the router holds in its earliest-deadline-first queue when workers are full;
    beyond it sheddable requests get 429 first, then non-sheddable ones."""
    unfitted_prefills_per_worker: int = Field(4, ge=0, le=1_000_000)
    """Before the router has fitted a prefill rate for every prefill-capable worker (its cold
    start, a worker just added), admission holds arrivals beyond this many requests in flight or
    reserved per such worker, in all (router.yaml `admission.unfittedPrefillsPerWorker`). 0: no
    cap then (every arrival is admitted until a rate is fitted: the gate before the cap)."""
    cold_start_wait_seconds: int | None = Field(None, ge=0, le=3600)
    """How long the router holds a request that finds no decode or mixed worker ready (the
    pools scaled to zero, the first worker still starting, all fenced or draining) for one to
    become ready, before a 503 (router.yaml `admission.coldStartWaitSeconds`; held requests
    count as waiting at the router, so the autoscaler sees them as demand). At most
    `admissionQueueCapacity` requests are held. Left out: 300 where the service can scale to
    zero (every decode and mixed pool at `minReplicas: 0`, `scaling.mode` Managed or
    External), else 0. 0: a 503 at once. docs/operations.md "Scale to zero"."""
    worker_link: WorkerLink = WorkerLink.STREAM
    """How the router's per-token traffic (`Multiplex`) reaches the workers: `grpc`, over the
    workers' gRPC port; `stream`, over their link port (the first free port from 50053, always
    open on worker pods; router.yaml `pool.link`). docs/operations.md "The router's link to its
    workers"."""
    resources: ResourceRequirements = Field(default_factory=ResourceRequirements)
    """CPU and memory of each router pod."""
    pod: PodSettings = Field(default_factory=PodSettings)
    """Scheduling and pod settings of the router's pods."""
    edge: RouterEdgeSpec = Field(default_factory=RouterEdgeSpec)
    """Limits on what one client may send and how long it may take (body size, prompt length,
    stop strings, connections, timeouts, shutdown drain)."""
    api_key_secret: str | None = Field(None, min_length=1, max_length=253)
    """Secret holding the router's API keys and tenants (key `keys.yaml`, docs/security.md),
    mounted into the router pods and re-read when it changes. Left out: the router answers every
    client (it logs a warning)."""
    expose_without_keys: bool = False
    """Allow `serviceType` NodePort or LoadBalancer without `apiKeySecret` (an open router
    reachable from outside the cluster); refused otherwise. `true` is refused where it would do
    nothing: with `serviceType` ClusterIP, or next to an `apiKeySecret` (the keys still apply)."""
    backends: list[StockBackendSpec] = Field(default_factory=list, max_length=256)
    """Stock `vllm serve` servers the router also places requests on, P/D included (rendered
    as `backends:` in router.yaml; docs/engines.md, "Stock vllm serve servers as workers")."""
    backend_discovery: StockBackendDiscoverySpec | None = None
    """Stock `vllm serve` pods in the service's namespace the router finds by their labels
    (rendered as `backend_discovery:` in router.yaml; the router's Role already reads pods
    there)."""

    @model_validator(mode="after")
    def _exposed_needs_keys(self) -> RouterSpec:
        if self.http_port == self.grpc_port:
            raise ValueError(
                f"router.httpPort and router.grpcPort are the same port ({self.http_port}): the "
                "router serves each on its own (and its Service names each once)"
            )
        if (
            self.service_type is not ServiceType.CLUSTER_IP
            and not self.api_key_secret
            and not self.expose_without_keys
        ):
            raise ValueError(
                f"router.serviceType {self.service_type.value} exposes the router outside the "
                "cluster: set router.apiKeySecret (or router.exposeWithoutKeys: true)"
            )
        if self.expose_without_keys and (
            self.service_type is ServiceType.CLUSTER_IP or self.api_key_secret
        ):
            raise ValueError(
                "router.exposeWithoutKeys: true acts only with serviceType NodePort or "
                "LoadBalancer and no apiKeySecret ("
                + (
                    "serviceType is ClusterIP"
                    if self.service_type is ServiceType.CLUSTER_IP
                    else "with apiKeySecret the router still demands keys"
                )
                + "): remove it"
            )
        return self


class ScalingMode(StrEnum):
    MANAGED = "Managed"
    """The operator owns every pool's `replicas` (its autoscaler writes them)."""
    EXTERNAL = "External"
    """Another autoscaler (HPA, KEDA) owns `replicas` via `/scale`; the operator never writes it."""
    MANUAL = "Manual"
    """People own `replicas` (`kubectl scale llmpool/...`); the operator never writes it."""


class MetricsSource(StrEnum):
    ROUTER = "Router"
    """Scrape `/metrics` of every ready router pod directly."""
    PROMETHEUS = "Prometheus"
    """Query Prometheus (`scaling.prometheusUrl`) for the routers' series."""


class ScalingSpec(Model):
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.metricsSource) || self.metricsSource != 'Prometheus'"
                    " || has(self.prometheusUrl)",
                    "message": "metricsSource Prometheus needs prometheusUrl",
                },
                {
                    "rule": "!has(self.prometheusUrl) || "
                    "(has(self.metricsSource) && self.metricsSource == 'Prometheus')",
                    "message": "prometheusUrl is read only with metricsSource Prometheus "
                    "(the routers' /metrics are scraped directly otherwise): remove it or set "
                    "metricsSource: Prometheus",
                },
                {
                    "rule": "!has(self.prometheusUrl) || !self.prometheusUrl.contains('/api/v1')",
                    "message": "prometheusUrl is Prometheus' base URL "
                    "(http://prometheus.monitoring:9090): the operator adds /api/v1/query",
                },
            ]
        }
    )

    mode: ScalingMode = ScalingMode.MANAGED
    """Who owns each pool's `replicas`."""
    interval_seconds: float = Field(30.0, gt=0, le=3600)
    """How often the autoscaler's control loop runs, in every mode (Managed: it sizes the pools;
    External, Manual: it writes each LLMPool's `status.recommendedReplicas`)."""
    scale_down_stabilization_seconds: float = Field(300.0, ge=0, le=86400)
    """The autoscaler scales down only after the lower size was wanted this long."""
    window_seconds: float = Field(60.0, gt=0, le=3600)
    """The window the autoscaler's rates, percentiles and attainment are computed over."""
    metrics_source: MetricsSource = MetricsSource.ROUTER
    """Where the autoscaler reads the routers' SLO metrics."""
    prometheus_url: str | None = Field(None, max_length=1024, pattern=r"^https?://[^\s?#]+$")
    """Prometheus base URL (`http://prometheus.monitoring:9090`) for `metricsSource: Prometheus`."""
    burst_weight: float = Field(1.0, ge=0, le=1)
    """Burst headroom: the pools are sized for `mean + burstWeight × (busiest − mean)` of the
    window's arrival rate, where *busiest* is its busiest sub-window (10 s, or the spacing of
    the router counter's samples when coarser: one tick with direct scrapes). 0: the mean
    alone; 1: the busiest sub-window (a load step sized in full on the first tick after it)."""

    @model_validator(mode="after")
    def _prometheus(self) -> ScalingSpec:
        if self.metrics_source is MetricsSource.PROMETHEUS and not self.prometheus_url:
            raise ValueError("scaling: metricsSource Prometheus needs prometheusUrl")
        if self.prometheus_url is not None and "/api/v1" in self.prometheus_url:
            raise ValueError(
                "scaling: prometheusUrl is Prometheus' base URL "
                "(http://prometheus.monitoring:9090): the operator adds /api/v1/query"
            )
        if self.prometheus_url is not None and self.metrics_source is not MetricsSource.PROMETHEUS:
            raise ValueError(
                "scaling: prometheusUrl is read only with metricsSource Prometheus (the routers' "
                "/metrics are scraped directly otherwise): remove it or set metricsSource: "
                "Prometheus"
            )
        return self


class FlippingSpec(Model):
    enabled: bool = True
    """Move workers between roles (fence, drain, SetRole, relabel, unfence) to keep pool sizes."""
    max_concurrent: int = Field(1, ge=1, le=100)
    """At most this many workers of the service are being flipped at once. Read only while
    `enabled` is true (with flipping off no flip starts; the schema's default fills the field
    either way, so a value set with `enabled: false` cannot be told apart and is not refused)."""
    drain_timeout_seconds: float = Field(120.0, gt=0, le=3600)
    """How long a flip waits for in-flight work; then it switches anyway (work in flight finishes
    under the old role). A flip whose worker does not answer (drain, SetRole or resume failing)
    for this long after its fence is abandoned: the worker keeps the role on its label and is
    unfenced (a `FlipAbandoned` Event)."""


class PlannerMode(StrEnum):
    OFF = "Off"
    ADVISE = "Advise"
    """Compute the recommended pool sizes (P:D split) for the observed workload and report them
    (`status.decisions`, an Event) only."""
    APPLY = "Apply"
    """Compute the recommended pool sizes and write them to the pools (`scaling.mode: Manual`
    only: in Managed mode the autoscaler owns the sizes, in External an HPA / KEDA does)."""


class PlannerSpec(Model):
    mode: PlannerMode = PlannerMode.OFF
    """Whether the slow planner (P:D ratio, group shapes) runs, and whether it acts."""
    interval_seconds: float = Field(600.0, gt=0, le=86400)
    """How often the planner runs. Read only when `mode` is Advise or Apply (with Off the planner
    does not run; the schema's default fills the field either way, so a value set with `mode:
    Off` cannot be told apart and is not refused)."""


def _pool_has_group(role: Role) -> JsonValue:
    return {
        "rule": f"!has(self.pools.{role.value}) || "
        f"self.workerGroups.exists(g, '{role.value}' in g.roles)",
        "message": f"pools.{role.value}: no worker group may take role {role.value!r}",
    }


_SERVICE_CEL: Final[list[JsonValue]] = [
    *[_pool_has_group(r) for r in Role],
    {
        "rule": "self.workerGroups.all(g, g.name != 'router')",
        "message": "workerGroups: `router` is reserved (the router's Deployment)",
    },
    {
        "rule": "!has(self.defaultSloClass) || ((has(self.sloClasses) && "
        "size(self.sloClasses) > 0) ? self.sloClasses.exists(c, c.name == self.defaultSloClass)"
        " : self.defaultSloClass == 'default')",
        "message": "defaultSloClass must name one of sloClasses (without classes: `default`)",
    },
    {
        "rule": "!has(self.engine.kind) || self.engine.kind != 'sim' || ("
        "(!has(self.engine.args) || size(self.engine.args) == 0) && "
        "self.workerGroups.all(g, !has(g.engineArgs) || size(g.engineArgs) == 0))",
        "message": "engine.args, workerGroups[].engineArgs: engine arguments apply to "
        "engine.kind vllm only; the sim engine takes none",
    },
    {
        "rule": "!has(self.engine.kind) || self.engine.kind != 'sim' || ("
        "!has(self.model.revision) && !(self.model.source.contains('@') && "
        "(self.model.source.startsWith('hf://') || (!self.model.source.contains('://')"
        " && !self.model.source.startsWith('/')))))",
        "message": "model.revision: the sim engine loads no weights and its router the local "
        "tokenizer, so a revision (model.revision, or @revision in model.source) is read by "
        "nothing (engine.kind vllm)",
    },
    {
        "rule": "!has(self.engine.kind) || self.engine.kind != 'sim' || !has(self.model.authSecret)"
        " || (has(self.model.tokenizer) && self.model.tokenizer != ''"
        " && !self.model.tokenizer.startsWith('/'))",
        "message": "model.authSecret: the sim engine downloads no weights; its router and "
        "workers read HF_TOKEN only to fetch a Hugging Face model.tokenizer (none is given): "
        "remove it, or name the tokenizer's repository",
    },
    {
        "rule": "!has(self.planner) || !has(self.planner.mode) || self.planner.mode != 'Apply'"
        " || (has(self.scaling) && has(self.scaling.mode) && self.scaling.mode == 'Manual')",
        "message": "planner.mode Apply needs scaling.mode Manual (Managed: the autoscaler sizes "
        "the pools every interval; External: an HPA / KEDA does); use Advise otherwise",
    },
]


class IpBlock(Model):
    cidr: str = Field(min_length=1, max_length=64)
    """An IP range (`10.0.0.0/8`)."""


class NetworkPeer(Model):
    """Where traffic may come from (a Kubernetes NetworkPolicy peer; all given fields must
    match)."""

    pod_selector: LabelSelector | None = None
    """Pods with these labels (in this namespace unless `namespaceSelector` is given)."""
    namespace_selector: LabelSelector | None = None
    """Pods in namespaces with these labels (`{}`: every namespace)."""
    ip_block: IpBlock | None = None
    """Addresses in this range."""


OPERATOR_LABELS: Final = {
    "app.kubernetes.io/name": "splitserve",
    "app.kubernetes.io/component": "operator",
}
"""The chart's operator pod labels: `networkPolicy.operatorLabels`' default."""

# With `enabled: false` nothing reads the peers: refused unless left out (or the default).
_NETWORK_POLICY_OFF: Final = (
    "!has(self.enabled) || self.enabled || ("
    "(!has(self.routerFrom) || size(self.routerFrom) == 0)"
    " && (!has(self.metricsFrom) || size(self.metricsFrom) == 0)"
    " && (!has(self.operatorLabels) || (size(self.operatorLabels) == 2"
    + "".join(f" && '{k}' in self.operatorLabels" for k in OPERATOR_LABELS)
    + "".join(f" && self.operatorLabels['{k}'] == '{v}'" for k, v in OPERATOR_LABELS.items())
    + ")))"
)


class NetworkPolicySpec(Model):
    """The NetworkPolicies the operator renders for the service (docs/security.md)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": _NETWORK_POLICY_OFF,
                    "message": "routerFrom, metricsFrom, operatorLabels: read only with enabled "
                    "true (with false no NetworkPolicy is rendered): remove them or set enabled: "
                    "true",
                }
            ]
        }
    )

    enabled: bool = True
    """Render them; false for clusters without a NetworkPolicy controller (they would be
    ignored there anyway) or where you manage your own. With false, `routerFrom`, `metricsFrom`
    and a non-default `operatorLabels` are refused (nothing reads them)."""
    router_from: list[NetworkPeer] = Field(default_factory=list, max_length=32)
    """Who may reach the router's HTTP and gRPC ports; empty: anyone (the router authenticates
    clients with API keys, `router.apiKeySecret`). The operator's pods (`operatorLabels`) may
    reach the HTTP port either way: its control loop scrapes the routers' `/metrics`. A
    Prometheus that scrapes the routers (port `http`) must be listed here too."""
    operator_labels: dict[str, str] = Field(default_factory=lambda: dict(OPERATOR_LABELS))
    """Labels of the operator's pods (any namespace): they may reach the workers' gRPC port."""
    metrics_from: list[NetworkPeer] = Field(default_factory=list, max_length=32)
    """Who may scrape the workers' metrics port; empty: anyone (metrics carry no prompt or
    user data). Not the router's: it serves `/metrics` on its HTTP port, its API port, so with
    a `routerFrom` a Prometheus that scrapes the routers must be listed in `routerFrom`."""

    @model_validator(mode="after")
    def _read_only_when_enabled(self) -> NetworkPolicySpec:
        if self.enabled:
            return self
        given = [
            f"networkPolicy.{name}"
            for name, unused in (
                ("routerFrom", bool(self.router_from)),
                ("metricsFrom", bool(self.metrics_from)),
                ("operatorLabels", self.operator_labels != OPERATOR_LABELS),
            )
            if unused
        ]
        if given:
            raise ValueError(
                f"{', '.join(given)}: read only with networkPolicy.enabled true (with false no "
                "NetworkPolicy is rendered): remove them or set enabled: true"
            )
        return self


class TracingSpec(Model):
    """OpenTelemetry traces of the router and the workers (docs/observability.md): rendered
    into their pods as the standard `OTEL_*` variables."""

    endpoint: str = Field(min_length=1, max_length=2048, pattern=r"^https?://")
    """OTLP/HTTP collector base URL, e.g. `http://otel-collector.monitoring:4318` (spans go to
    `<endpoint>/v1/traces`): `OTEL_EXPORTER_OTLP_ENDPOINT`."""
    sampler_ratio: float = Field(1.0, ge=0, le=1)
    """Share of requests traced (a client's sampled `traceparent` is followed either way):
    `OTEL_TRACES_SAMPLER=parentbased_traceidratio`, `OTEL_TRACES_SAMPLER_ARG`."""


class ObservabilitySpec(Model):
    """What the router and the workers export beyond their `/metrics`."""

    tracing: TracingSpec | None = None
    """Traces; left out: off (no cost)."""


TRACING_ENV: Final = (
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_TRACES_SAMPLER",
    "OTEL_TRACES_SAMPLER_ARG",
)
"""The variables `observability.tracing` sets (`engine.env` may not set them too)."""


class LLMServiceSpec(Model):
    """A model served disaggregated: workers, pools per role, SLO classes and the router."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": _SERVICE_CEL})

    model: ModelSpec
    """The model to serve."""
    engine: EngineSpec
    """The engine every worker runs."""
    worker_groups: list[WorkerGroup] = Field(min_length=1, max_length=16)
    """Deployments of worker pods. Role labels are set per pod and are never in a selector."""
    pools: Pools
    """Desired workers per role; each becomes an `LLMPool` named `<service>-<role>`."""
    slo_classes: list[SloClassSpec] = Field(default_factory=list, max_length=16)
    """Request classes with their SLOs. Empty: one class `default` (TTFT 2 s, TPOT 200 ms)."""
    default_slo_class: str | None = Field(None, max_length=63)
    """Class of requests that name none. Left out: the first class."""
    router: RouterSpec = Field(default_factory=RouterSpec)
    """The router Deployment and Service."""
    scaling: ScalingSpec = Field(default_factory=ScalingSpec)
    """Who sizes the pools."""
    flipping: FlippingSpec = Field(default_factory=FlippingSpec)
    """Role changes of running workers."""
    planner: PlannerSpec = Field(default_factory=PlannerSpec)
    """The slow capacity planner."""
    kv_transfer: KvTransferSpec | None = None
    """KV-cache transport between prefill and decode workers (vLLM: NIXL backend, UCX
    transports, RDMA devices). Left out: NIXL over UCX with UCX's own choice of transport."""
    network_policy: NetworkPolicySpec = Field(default_factory=NetworkPolicySpec)
    """NetworkPolicies: worker ports only from this service's router and workers and the
    operator; the router from `routerFrom`."""
    observability: ObservabilitySpec = Field(default_factory=ObservabilitySpec)
    """Traces of the router and the workers (`observability.tracing`)."""

    @model_validator(mode="after")
    def _tracing_env(self) -> LLMServiceSpec:
        if self.observability.tracing is not None:
            both = sorted({e.name for e in self.engine.env} & set(TRACING_ENV))
            if both:
                raise ValueError(
                    f"engine.env sets {', '.join(both)}, which observability.tracing sets: "
                    "set it in one place"
                )
        return self

    @model_validator(mode="after")
    def _cluster(self) -> LLMServiceSpec:
        if self.engine.kind is EngineKind.SIM:
            if self.kv_transfer is not None:
                raise ValueError("kvTransfer: the sim engine moves no KV caches (engine.kind vllm)")
            if self.model.cache is not None:
                raise ValueError("model.cache: the sim engine loads no weights (engine.kind vllm)")
            source = self.model.parsed_source()
            if self.model.revision is not None or source.revision is not None:
                raise ValueError(
                    "model.revision: the sim engine loads no weights and its router the local "
                    "tokenizer, so a revision (model.revision, or @revision in model.source) is "
                    "read by nothing (engine.kind vllm)"
                )
            tokenizer = self.model.tokenizer
            if self.model.auth_secret is not None and (not tokenizer or tokenizer[0] == "/"):
                raise ValueError(
                    "model.authSecret: the sim engine downloads no weights; its router and "
                    "workers read HF_TOKEN only to fetch a Hugging Face model.tokenizer (none "
                    "is given): remove it, or name the tokenizer's repository"
                )
            # Its workers refuse arguments after `--` (`worker serve`); they were ignored.
            given = ["engine.args"] if self.engine.args else []
            given += [
                f"workerGroups[{g.name}].engineArgs" for g in self.worker_groups if g.engine_args
            ]
            if given:
                raise ValueError(
                    f"{', '.join(given)}: engine arguments apply to engine.kind vllm only; the "
                    "sim engine takes none"
                )
        elif self.model.tokenizer is None and self.model.parsed_source().kind is SourceKind.FILE:
            raise ValueError(
                "model.tokenizer: required with a file:// source (the router cannot read the "
                "worker image): give a Hugging Face id or a path in the router image"
            )
        if self.router.pod.service_account_name is not None:
            raise ValueError("router.pod.serviceAccountName: the router uses its own account")
        return self

    @model_validator(mode="after")
    def _consistent(self) -> LLMServiceSpec:
        names = [g.name for g in self.worker_groups]
        if len(set(names)) != len(names):
            raise ValueError("workerGroups: group names must be unique")
        if "router" in names:
            raise ValueError("workerGroups: `router` is reserved (the router's Deployment)")
        classes = [c.name for c in self.slo_classes]
        if len(set(classes)) != len(classes):
            raise ValueError("sloClasses: class names must be unique")
        if self.default_slo_class is not None and self.default_slo_class not in (
            classes or ["default"]  # no classes: the one class `default`
        ):
            raise ValueError(
                f"defaultSloClass: {self.default_slo_class!r} is not one of sloClasses"
            )
        if self.planner.mode is PlannerMode.APPLY and self.scaling.mode is not ScalingMode.MANUAL:
            raise ValueError(
                f"planner.mode Apply needs scaling.mode Manual, not {self.scaling.mode.value} "
                "(Managed: the autoscaler sizes the pools every interval; External: an HPA / "
                "KEDA does); use Advise otherwise"
            )
        for role, _ in self.pools.items():
            if not any(role in g.roles for g in self.worker_groups):
                raise ValueError(
                    f"pools.{role.value}: no worker group may take role {role.value!r}"
                )
        return self


# ---------------------------------------------------------------------------------------------
# Status (written by the operator through the status subresource)


class ConditionStatus(StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class Condition(Model):
    """A Kubernetes-style condition: a named fact, its truth, and why."""

    type: str = Field(max_length=63)
    """Ready, Degraded, NotRoutable, SLOAtRisk, ..."""
    status: ConditionStatus
    """True, False or Unknown."""
    reason: str = Field(max_length=128)
    """One CamelCase word for machines."""
    message: str = Field("", max_length=4096)
    """What is going on, for people, with what to do about it."""
    last_transition_time: str | None = None
    """When `status` last changed (RFC 3339)."""
    observed_generation: int | None = None
    """The `metadata.generation` the condition was computed from."""


class PoolStatus(Model):
    role: Role
    """The pool's role."""
    desired: int = 0
    """Workers the pool should have (its `LLMPool` `spec.replicas`)."""
    current: int = 0
    """Pods labelled with the role."""
    ready: int = 0
    """Pods labelled with the role, ready and not fenced: what the router can use."""
    flipping: int = 0
    """Pods being moved into or out of the role."""
    spec_replicas: int | None = None
    """The `spec.pools.<role>.replicas` the pool was sized from, or last had as its size
    (Manual, External: an edit of it since, while the pool's size differs, is not applied and is
    said: `SpecApplied=False`, `PoolReplicasDecide`). Managed: the spec's value."""


class RoleSummary(Model):
    """`ready/desired` per role, for `kubectl get` columns."""

    prefill: str = "-"
    """Prefill pool: ready/desired."""
    decode: str = "-"
    """Decode pool: ready/desired."""
    mixed: str = "-"
    """Mixed pool: ready/desired."""


class SloClassStatus(Model):
    name: str
    """The class."""
    attainment: float | None = None
    """Observed fraction of the class's requests meeting their SLO (recent window)."""
    ttft_ms: float | None = None
    """Observed TTFT at the class's percentile, in milliseconds."""
    tpot_ms: float | None = None
    """Observed TPOT at the class's percentile, in milliseconds."""
    goodput: float | None = None
    """Requests per second of the class that met their SLO (recent window)."""
    requests: int | None = None
    """Requests of the class that finished in the window."""


class Decision(Model):
    time: str
    """When it was made (RFC 3339)."""
    kind: str
    """scale, flip, plan, ..."""
    message: str = Field(max_length=1024)
    """What was decided and why."""
    reason: str | None = Field(None, max_length=128)
    """One CamelCase word for machines (Load, SLOPressure, Stabilized, Bounds, SignalsMissing)."""
    inputs: dict[str, str] | None = Field(None, max_length=32)
    """The observed inputs the decision was made from (rate, lengths, attainment, ...)."""


class LLMServiceStatus(Model):
    """What the operator observed and did: pools, conditions, decisions (written by it only)."""

    observed_generation: int | None = None
    """The `metadata.generation` this status describes."""
    pools: list[PoolStatus] = Field(default_factory=list)
    """Desired, current, ready and flipping workers per role."""
    summary: RoleSummary = Field(default_factory=RoleSummary)
    """Ready/desired per role, as text (printer columns)."""
    slo_attainment: str | None = None
    """Lowest observed attainment over the SLO classes, as text (printer column)."""
    slo_classes: list[SloClassStatus] = Field(default_factory=list)
    """Observed latency and attainment per SLO class."""
    decisions: list[Decision] = Field(default_factory=list, max_length=20)
    """The last scaling, flipping and planning decisions, newest last."""
    router_endpoint: str | None = None
    """In-cluster address of the OpenAI-compatible API."""
    conditions: list[Condition] = Field(default_factory=list)
    """Ready, Degraded, NotRoutable, ..."""
    model_artifact: ArtifactStatus | None = None
    """Where the weights are and whether the workers can load them (download progress)."""
    scaling_mode: ScalingMode | None = None
    """The `spec.scaling.mode` of the last reconcile (entering Managed starts at live sizes)."""


# ---------------------------------------------------------------------------------------------
# LLMPool


def _immutable(field: str) -> JsonValue:
    """A CEL transition rule: the API server refuses a change of `field` (pydantic sees one
    object only; the operator never changes these, it names the pool after them)."""
    return {
        "rule": "self == oldSelf",
        "message": f"{field} cannot change: the operator creates each LLMPool for one "
        "LLMService and role (`<service>-<role>`); edit the LLMService's spec.pools instead",
    }


class LLMPoolSpec(Model):
    """The size of one role of one `LLMService`. Scale it with `kubectl scale llmpool/...`."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [_MIN_MAX_RULE]})

    service: str = Field(
        min_length=1,
        max_length=63,
        pattern=DNS_LABEL,
        json_schema_extra={"x-kubernetes-validations": [_immutable("service")]},
    )
    """The `LLMService` this pool belongs to (same namespace). Set by the operator; a change is
    refused."""
    role: Role = Field(json_schema_extra={"x-kubernetes-validations": [_immutable("role")]})
    """The role of the pool's workers. Set by the operator; a change is refused."""
    replicas: int = Field(0, ge=0, le=10000)
    """Desired workers in the role (the `/scale` subresource's `spec.replicas`)."""
    min_replicas: int = Field(0, ge=0, le=10000)
    """The operator's autoscaler never goes below this."""
    max_replicas: int | None = Field(None, ge=0, le=10000)
    """The operator's autoscaler never goes above this."""

    @model_validator(mode="after")
    def _bounds(self) -> LLMPoolSpec:
        # `replicas` is whoever scaled it last (kubectl, an HPA); only the bounds must agree.
        _check_bounds(None, self.min_replicas, self.max_replicas)
        return self


class LLMPoolStatus(Model):
    """The pool's pods as the operator counted them (written by it only)."""

    replicas: int = 0
    """Pods labelled with the role (the `/scale` subresource's `status.replicas`)."""
    ready_replicas: int = 0
    """Of those, ready and not fenced."""
    flipping: int = 0
    """Pods being moved into or out of the role."""
    selector: str = ""
    """Label selector of the role's pods (the `/scale` subresource's `status.selector`)."""
    recommended_replicas: int | None = None
    """What the operator's autoscaler would choose (External and Manual modes: advice only)."""
    observed_generation: int | None = None
    """The `metadata.generation` this status describes."""
    conditions: list[Condition] = Field(default_factory=list)
    """Ready, NotRoutable, ..."""


# ---------------------------------------------------------------------------------------------
# Names shared by the operator, the router's discovery and the chart.

LABEL_PREFIX: Final = GROUP
LABEL_SERVICE: Final = f"{GROUP}/service"
"""On every object the operator creates: the owning `LLMService`'s name."""
LABEL_COMPONENT: Final = f"{GROUP}/component"
"""`worker` or `router`."""
LABEL_GROUP: Final = f"{GROUP}/worker-group"
"""On worker pods: the worker group (part of the Deployment selector)."""
LABEL_ROLE: Final = f"{GROUP}/role"
"""On worker pods: the pod's current role. Never part of a selector."""
LABEL_FENCED: Final = f"{GROUP}/fenced"
"""On worker pods, `"true"` while a flip fences it: the router sends it no new work."""
ANNOTATION_FLIP: Final = f"{GROUP}/flip"
"""On worker pods: the flip in progress (`<step>:<from>:<to>`), so it resumes after a restart."""
ANNOTATION_FLIP_SINCE: Final = f"{GROUP}/flip-since"
"""On worker pods: when the flip in progress fenced the worker (RFC 3339)."""
