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

import re
from enum import StrEnum
from typing import Annotated, Any, Final

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    WithJsonSchema,
    model_validator,
)
from pydantic.alias_generators import to_camel

from splitserve.core.roles import Role

GROUP: Final = "splitserve.io"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"

DNS_LABEL: Final = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
"""RFC 1035 label: what Kubernetes accepts in names that become Service and Deployment names."""
CLASS_NAME: Final = r"^[A-Za-z0-9]([-_.A-Za-z0-9]*[A-Za-z0-9])?$"

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


class ModelSpec(Model):
    name: str = Field(min_length=1, max_length=253)
    """The model name clients send in OpenAI requests (`model` field)."""
    source: str = Field(min_length=1, max_length=1024)
    """Where the weights come from: a Hugging Face repository id or a path inside the pod."""
    revision: str | None = Field(None, max_length=253)
    """Revision (branch, tag or commit) of `source`; every worker of the service must share it."""
    tokenizer: str | None = Field(None, max_length=1024)
    """Tokenizer repository id or path, when it differs from `source`."""


class EnvVar(Model):
    name: str = Field(min_length=1, max_length=253, pattern=r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
    """Environment variable name."""
    value: str = Field("", max_length=32768)
    """Its value."""


class EngineSpec(Model):
    kind: EngineKind = EngineKind.VLLM
    """Which engine the workers run."""
    image: str = Field(min_length=1, max_length=1024)
    """Worker container image (holds splitserve and the engine)."""
    image_pull_policy: PullPolicy = PullPolicy.IF_NOT_PRESENT
    """Kubernetes image pull policy of the worker containers."""
    args: list[str] = Field(default_factory=list, max_length=128)
    """Extra engine arguments, appended to every worker's command line."""
    env: list[EnvVar] = Field(default_factory=list, max_length=64)
    """Extra environment variables for every worker container."""
    grpc_port: int = Field(50051, ge=1, le=65535)
    """Port of the worker's gRPC service (Prefill, Decode, Drain, SetRole, ...)."""
    metrics_port: int = Field(9090, ge=1, le=65535)
    """Port of the worker's Prometheus `/metrics` endpoint."""


class ResourceRequirements(Model):
    requests: dict[str, Quantity] = Field(default_factory=dict)
    """Minimum resources per pod, as in a container's `resources.requests`."""
    limits: dict[str, Quantity] = Field(default_factory=dict)
    """Maximum resources per pod, as in a container's `resources.limits`."""


class WorkerGroup(Model):
    """One Deployment of identical worker pods. Roles are assigned per pod, at run time."""

    name: str = Field(min_length=1, max_length=40, pattern=DNS_LABEL)
    """Group name; the Deployment is called `<service>-<name>`."""
    roles: list[Role] = Field(min_length=1, max_length=3)
    """Roles the group's pods may take. The operator moves pods between these roles only."""
    replicas: int | None = Field(None, ge=0, le=10000)
    """Fixed pod count. Left out: the operator sizes the group from the pools it serves."""
    gpus: int = Field(0, ge=0, le=64)
    """Accelerators per pod (requested as `gpuResource`)."""
    gpu_resource: str = Field("nvidia.com/gpu", min_length=1, max_length=253)
    """Extended resource name of the accelerator."""
    tensor_parallel: int = Field(1, ge=1, le=64)
    """Tensor-parallel degree of the engine in each pod."""
    resources: ResourceRequirements = Field(default_factory=ResourceRequirements)
    """CPU and memory of each worker pod (accelerators come from `gpus`)."""
    node_selector: dict[str, str] = Field(default_factory=dict)
    """Node labels the group's pods must run on."""
    engine_args: list[str] = Field(default_factory=list, max_length=128)
    """Engine arguments for this group only, after `engine.args`."""

    @model_validator(mode="after")
    def _distinct_roles(self) -> WorkerGroup:
        if len(set(self.roles)) != len(self.roles):
            raise ValueError(f"workerGroups[{self.name}].roles: roles must be distinct")
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


class SloClassSpec(Model):
    """A class of requests with latency targets (online) or a completion deadline (offline)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "(has(self.ttftMs) && has(self.tpotMs))"
                    " || has(self.jobCompletionSeconds)",
                    "message": "set ttftMs and tpotMs, or jobCompletionSeconds",
                }
            ]
        }
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

    @model_validator(mode="after")
    def _targets(self) -> SloClassSpec:
        online = self.ttft_ms is not None and self.tpot_ms is not None
        if not online and self.job_completion_seconds is None:
            raise ValueError(
                f"sloClasses[{self.name}]: set ttftMs and tpotMs, or jobCompletionSeconds"
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


class RouterSpec(Model):
    replicas: int = Field(1, ge=0, le=1000)
    """Router pods (the router is stateless; scale it freely)."""
    image: str | None = Field(None, max_length=1024)
    """Router image. Left out: the operator's `--router-image` (the chart's splitserve image)."""
    http_port: int = Field(8000, ge=1, le=65535)
    """Port of the OpenAI-compatible HTTP API on the Service."""
    grpc_port: int = Field(50050, ge=1, le=65535)
    """Port of the `splitserve.v1.Router` gRPC API on the Service."""
    service_type: ServiceType = ServiceType.CLUSTER_IP
    """Kubernetes Service type of the router's Service."""
    disaggregation: Disaggregation = Disaggregation.AUTO
    """When to split prefill and decode onto different workers."""
    placement_profile: str = Field("default", min_length=1, max_length=63)
    """Name of the placement profile (filters, scorers, picker) the router uses."""
    resources: ResourceRequirements = Field(default_factory=ResourceRequirements)
    """CPU and memory of each router pod."""


class ScalingMode(StrEnum):
    MANAGED = "Managed"
    """The operator owns every pool's `replicas` (its autoscaler writes them)."""
    EXTERNAL = "External"
    """Another autoscaler (HPA, KEDA) owns `replicas` via `/scale`; the operator never writes it."""
    MANUAL = "Manual"
    """People own `replicas` (`kubectl scale llmpool/...`); the operator never writes it."""


class ScalingSpec(Model):
    mode: ScalingMode = ScalingMode.MANAGED
    """Who owns each pool's `replicas`."""
    interval_seconds: float = Field(30.0, gt=0, le=3600)
    """How often the autoscaler runs (Managed mode)."""
    scale_down_stabilization_seconds: float = Field(300.0, ge=0, le=86400)
    """The autoscaler scales down only after the lower size was wanted this long."""


class FlippingSpec(Model):
    enabled: bool = True
    """Move workers between roles (fence, drain, SetRole, relabel, unfence) to keep pool sizes."""
    max_concurrent: int = Field(1, ge=1, le=100)
    """At most this many workers of the service are being flipped at once."""
    drain_timeout_seconds: float = Field(120.0, gt=0, le=3600)
    """How long a flip waits for in-flight work; then it switches anyway (work in flight finishes
    under the old role)."""


class PlannerMode(StrEnum):
    OFF = "Off"
    ADVISE = "Advise"
    """Compute the recommended shape and report it in status only."""
    APPLY = "Apply"
    """Compute the recommended shape and apply it to the pools."""


class PlannerSpec(Model):
    mode: PlannerMode = PlannerMode.OFF
    """Whether the slow planner (P:D ratio, group shapes) runs, and whether it acts."""
    interval_seconds: float = Field(600.0, gt=0, le=86400)
    """How often the planner runs."""


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
        "rule": "!has(self.defaultSloClass) || (has(self.sloClasses) && "
        "self.sloClasses.exists(c, c.name == self.defaultSloClass))",
        "message": "defaultSloClass must name one of sloClasses",
    },
]


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
        if self.default_slo_class is not None and self.default_slo_class not in classes:
            raise ValueError(
                f"defaultSloClass: {self.default_slo_class!r} is not one of sloClasses"
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


class Decision(Model):
    time: str
    """When it was made (RFC 3339)."""
    kind: str
    """scale, flip, plan, ..."""
    message: str = Field(max_length=1024)
    """What was decided and why."""


class LLMServiceStatus(Model):
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


# ---------------------------------------------------------------------------------------------
# LLMPool


class LLMPoolSpec(Model):
    """The size of one role of one `LLMService`. Scale it with `kubectl scale llmpool/...`."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [_MIN_MAX_RULE]})

    service: str = Field(min_length=1, max_length=63, pattern=DNS_LABEL)
    """The `LLMService` this pool belongs to (same namespace)."""
    role: Role
    """The role of the pool's workers."""
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
