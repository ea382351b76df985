"""The router's configuration: one typed model per concern (C5).

Pure data. Building a `RouterConfig` has no side effects; the CLI reads flags, environment
variables (`SPLITSERVE_*`) and the operator's ConfigMap (`router.yaml`, see `RouterFile`) and
passes the values in.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from splitserve.api import v1alpha1 as v1
from splitserve.api.auth import AuthSettings, FileModel
from splitserve.api.backends import BackendDiscoverySettings, HttpBackend, PodWatchSettings
from splitserve.api.router_edge import EdgeSettings


class PlacementSettings(BaseModel):
    """How the router places requests on prefill and decode workers."""

    model_config = ConfigDict(
        frozen=True, extra="forbid", use_attribute_docstrings=True, allow_inf_nan=False
    )

    min_prompt_tokens_for_pd: int = Field(1, ge=0)
    """Prompts shorter than this run aggregated on one decode (or mixed) worker (`Auto`)."""
    profile: v1.PlacementProfile = v1.PlacementProfile.DEFAULT
    """The placement profile (`router.placementProfile`)."""
    disaggregation: v1.Disaggregation = v1.Disaggregation.AUTO
    """When to split prefill and decode (`router.disaggregation`)."""


class SloSettings(BaseModel):
    """SLO classes and admission (the service's `sloClasses`, `defaultSloClass`)."""

    model_config = ConfigDict(
        frozen=True, extra="forbid", use_attribute_docstrings=True, allow_inf_nan=False
    )

    classes: tuple[v1.SloClassSpec, ...] = ()
    """The classes; empty: one class `default` (TTFT 2 s, TPOT 200 ms, not sheddable)."""
    default_class: str | None = None
    """Class of requests without `x-slo-class`; None: the first class."""
    length_predictor: v1.LengthPredictor = v1.LengthPredictor.PER_CLASS
    """The output-length predictor."""
    queue_capacity: int = Field(1024, ge=0)
    """Requests the admission queue holds at most."""
    admission: bool = True
    """False: every request is dispatched at once (the wave-1 router; benchmarks compare)."""
    max_backlog_fraction: float = Field(0.25, gt=0)
    """Room for one more request: the best worker's predicted prefill backlog is at most this
    fraction of the tightest TTFT target of any class (once the latency model has data)."""
    max_outstanding_per_worker: int | None = Field(None, ge=1)
    """Also a cap on requests in flight or reserved per decode-capable worker; None: no cap."""
    unfitted_prefills_per_worker: int | None = Field(4, ge=1)
    """While the latency model has no prefill rate for some prefill-side worker (cold start, a
    worker just added), so no backlog estimate: room means the prefill-side workers have, in
    all, more free places than requests admitted but not yet placed, a worker having this many
    places less its requests in flight or reserved; None: always room then (every arrival is
    admitted until a rate is fitted)."""

    @field_validator(
        "queue_capacity",
        "max_outstanding_per_worker",
        "unfitted_prefills_per_worker",
        "max_backlog_fraction",
        mode="before",
    )
    @classmethod
    def _a_number(cls, value: Any) -> Any:
        return v1.not_a_bool(value)

    @model_validator(mode="after")
    def _check_classes(self) -> SloSettings:
        names = [c.name for c in self.classes]
        if twice := sorted({n for n in names if names.count(n) > 1}):
            raise ValueError(
                f"SLO class {', '.join(map(repr, twice))} declared twice (names must be unique)"
            )
        if self.default_class is not None and self.default_class not in (names or ["default"]):
            raise ValueError(
                f"default SLO class {self.default_class!r} is not one of {names or ['default']}"
            )
        return self

    @property
    def class_names(self) -> tuple[str, ...]:
        """The service's classes by name (`default` when it declares none)."""
        return tuple(c.name for c in self.classes) or ("default",)


class PoolSettings(BaseModel):
    """How the router watches its workers."""

    model_config = ConfigDict(
        frozen=True, extra="forbid", use_attribute_docstrings=True, allow_inf_nan=False
    )

    load_interval_s: float = Field(0.1, ge=0.01, le=3600)
    """Interval the router asks workers to push load reports at (workers refuse less than
    0.01 s: a shorter one would pin a core)."""
    stale_after_s: float = Field(2.0, gt=0)
    """An endpoint whose last load report is older than this counts as not ready."""
    reconnect_min_s: float = Field(0.05, gt=0)
    """First back-off delay after a load stream breaks."""
    reconnect_max_s: float = Field(2.0, gt=0)
    """Longest back-off delay between reconnection attempts."""
    link_window_bytes: int = Field(2048, ge=0, le=1 << 30)
    """HTTP/2 receive window of each worker's `Multiplex` stream, fixed (0: gRPC's default, a
    window its bandwidth-delay probe grows). Small, the worker joins a request's tokens into
    fewer messages while the router reads behind (issue 17, docs/benchmarks.md "Eleventh
    pass"); it also caps what one worker stream has in flight per round trip (2 KiB: ~10 MB/s
    at a 0.2 ms round trip), so raise it for a router far from its workers."""

    link: Literal["grpc", "stream"] = "stream"
    """How the router's `Multiplex` traffic reaches a worker: `stream` (default), its messages
    length-prefixed over a plain TCP / TLS socket to the port the worker advertises
    (`LoadReport.link_port`; `splitserve worker serve --link-port`), without `grpc.aio`'s
    per-message machinery, the load and step feeds on the same socket (docs/benchmarks.md
    "Twelfth pass", "Thirteenth pass"); `grpc`, the `Worker.Multiplex` gRPC stream. Workers that
    advertise no port are reached over gRPC either way. `link_window_bytes` applies to the gRPC
    link only (the stream link coalesces on the router's side, per socket read)."""

    @model_validator(mode="after")
    def _check_backoff(self) -> PoolSettings:
        if self.reconnect_max_s < self.reconnect_min_s:
            raise ValueError("reconnect_max_s must be >= reconnect_min_s")
        return self


class DispatchSettings(BaseModel):
    """Timeouts of the P/D flow."""

    model_config = ConfigDict(
        frozen=True, extra="forbid", use_attribute_docstrings=True, allow_inf_nan=False
    )

    request_timeout_s: float = Field(600.0, gt=0)
    """Longest a request may run end to end before the router gives up and cancels it."""
    cancel_timeout_s: float = Field(1.0, gt=0)
    """How long a best-effort `Cancel` to a worker may take."""
    token_stall_timeout_s: float = Field(30.0, gt=0)
    """Longest a worker may go without producing the request's next token (the first token of a
    prefill included) before the router treats it as dead and moves the request to another
    worker: a frozen (SIGSTOP) or wedged worker keeps its connection open and would otherwise hold
    the request until `request_timeout_s`."""
    early_decode: bool = Field(False, strict=True)
    """P/D: send the Decode to the chosen decode worker when the pair is placed, before the
    prefill answers, so that only its first token and KV handle are on the way between token 1
    and the decode (`DecodeRequest.kv_follows`, Multiplex links only; a worker without a link
    gets the ordinary Decode). Opt-in: every decode worker must understand `kv_follows`. An older
    one refuses the early Decode with INVALID_ARGUMENT; if that answer comes before the prefill's,
    the router sends the ordinary Decode, but if it comes after, the request fails as refused.
    Set by `router serve --early-decode`; not in `router.yaml` or the LLMService CRD."""
    cold_start_wait_s: float = Field(0.0, ge=0, le=86400)
    """Longest a request that finds no decode-capable worker ready (none at all; only workers
    starting, not ready, fenced or draining; only prefill workers) is held for one to become
    ready, within `request_timeout_s` (`router.cold_start`). 0: refused at once (503), as
    before. `router serve --cold-start-wait-s`, router.yaml `admission.coldStartWaitSeconds`
    (the LLMService's `router.coldStartWaitSeconds`)."""
    cold_start_max_held: int = Field(1024, ge=0, le=1_000_000)
    """Requests held so at most; beyond it a request is refused at once (503 naming the bound).
    `router serve --cold-start-max-held`, router.yaml `admission.coldStartMaxHeld`."""


class DiscoverySettings(PodWatchSettings):
    """Where the router finds its workers in Kubernetes (the `discovery` block of `router.yaml`).

    Keys are camelCase in the file (`roleLabel`); snake_case names are accepted too.
    """

    kind: Literal["kubernetes"] = "kubernetes"
    """The only discovery there is: watch worker pods."""
    namespace: str = Field(min_length=1, max_length=253)
    """Namespace of the worker pods."""
    selector: str = Field(min_length=1)
    """Label selector (`k=v,k2=v2`, also `!=`, `in (...)`, `notin (...)`, `k`, `!k`)."""
    role_label: str = Field(min_length=1)
    """Label holding the pod's role; pods without it are not endpoints."""
    fenced_label: str = Field(min_length=1)
    """Label that is `"true"` while the operator fences the pod (no new work)."""
    grpc_port: int = Field(ge=1, le=65535)
    """Port of every worker's gRPC service; an endpoint is `podIP:grpcPort`."""
    owner_deployments: tuple[str, ...] = ()
    """Accept only pods whose controller is a ReplicaSet of one of these Deployments
    (`<deployment>-<pod-template-hash>`); the operator lists the service's worker Deployments.
    Empty: every pod matching the selector."""


class RouterConfig(BaseModel):
    """Everything `splitserve router serve` needs."""

    model_config = ConfigDict(
        frozen=True, extra="forbid", use_attribute_docstrings=True, allow_inf_nan=False
    )

    model_name: str = Field(min_length=1)
    """The served model name; requests naming another model get 404."""
    tokenizer_dir: str = Field(min_length=1)
    """Directory holding the Hugging Face tokenizer files of the model (or a hub id)."""
    tokenizer_revision: str | None = Field(None, min_length=1)
    """The hub revision to load `tokenizer_dir` at, when it is a hub id: the one the workers
    load the model at (`model.revision` / `hf://org/repo@rev`). None: the hub's default."""
    worker_addresses: tuple[str, ...] = ()
    """gRPC addresses (host:port) of the workers; more can be added at run time."""
    http_host: str = "0.0.0.0"
    """Interface the OpenAI-compatible HTTP API listens on."""
    http_port: int = Field(8000, ge=0, le=65535)
    """Port of the HTTP API (0 picks a free one)."""
    grpc_host: str = "0.0.0.0"
    """Interface the `splitserve.v1.Router` gRPC service listens on."""
    grpc_port: int | None = Field(50050, ge=0, le=65535)
    """Port of the gRPC service (0 picks a free one, None disables it)."""
    max_model_len: int = Field(4096, ge=2)
    """Longest prompt plus completion, in tokens."""
    default_max_tokens: int | None = Field(None, ge=1)
    """Completion length when a request names none. None (vLLM's behaviour): until end of text
    or the context limit (`max_model_len`); a number caps such requests (service-level cap)."""
    placement: PlacementSettings = PlacementSettings()
    """Placement settings."""
    pool: PoolSettings = PoolSettings()
    """Worker pool watching."""
    dispatch: DispatchSettings = DispatchSettings()
    """Dispatch timeouts."""
    slo: SloSettings = SloSettings()
    """SLO classes and admission."""
    discovery: DiscoverySettings | None = None
    """Watch worker pods in Kubernetes (on top of `worker_addresses`); None: static list only."""
    workers_file: str | None = None
    """A JSON file of worker endpoints re-read at run time (`splitserve up --autoscale` writes
    it; `router.discovery.FileDiscovery`), on top of `worker_addresses`."""
    edge: EdgeSettings = EdgeSettings()
    """Client-facing limits and timeouts (body size, prompt length, connections, drain)."""
    auth: AuthSettings = AuthSettings()
    """API keys and tenants (docs/security.md); none configured: every client is answered."""
    metrics_port: int | None = Field(None, ge=0, le=65535)
    """Serve `/metrics` on this port of `http_host` instead (0 picks a free one); the HTTP
    API's `/metrics` then needs a key like every other route. None: on the HTTP port, open."""
    backends: tuple[HttpBackend, ...] = ()
    """Stock `vllm serve` servers, reached over vLLM's OpenAI HTTP API (`--backend`,
    `router.http_backend`), on top of the gRPC workers."""
    backend_discovery: BackendDiscoverySettings | None = None
    """Find stock `vllm serve` pods by their labels (on top of `backends`); None: static only."""


def port_clash(http_port: int, grpc_port: int | None, metrics_port: int | None) -> str | None:
    """Each fixed port of the router once (0 and None pick or need none): a second listener on
    one port failed at start with "address already in use" (under `up`, after every worker had
    started)."""
    names = {
        "http": "the HTTP port (--port, listen.httpPort)",
        "grpc": "the gRPC port (--grpc-port, listen.grpcPort)",
        "metrics": "the metrics port (--metrics-port)",
    }
    seen: dict[int, str] = {}
    for kind, port in (("http", http_port), ("grpc", grpc_port), ("metrics", metrics_port)):
        if port and port in seen:
            return f"{names[seen[port]]} and {names[kind]} are both {port}: one port each"
        if port:
            seen[port] = kind
    return None


# ---------------------------------------------------------------------------------------------
# router.yaml: the ConfigMap the operator renders (operator/render.py `router_config`)


class ListenFile(FileModel):
    """`listen`: the router's own interface and ports."""

    host: str = "127.0.0.1"
    """Interface of both ports (the operator renders `0.0.0.0` for a pod); loopback unless the
    file or `--host` says otherwise."""
    http_port: int = Field(8000, ge=0, le=65535)
    """Port of the OpenAI-compatible HTTP API."""
    grpc_port: int = Field(50050, ge=0, le=65535)
    """Port of the `splitserve.v1.Router` gRPC service."""


class AuthFile(FileModel):
    """`auth`: where the router finds its API keys (the Secret the operator mounts)."""

    key_file: str | None = None
    """The key file (docs/security.md); re-read when it changes."""
    reload_interval_seconds: float = Field(2.0, gt=0, le=3600)
    """`AuthSettings.reload_interval_s`: how often the key file's modification time is checked."""


class PlacementFile(FileModel):
    """`placement`: the service's `router.placementProfile`, `disaggregation`, predictor."""

    profile: v1.PlacementProfile = v1.PlacementProfile.DEFAULT
    """Placement profile name."""
    disaggregation: v1.Disaggregation = v1.Disaggregation.AUTO
    """When to split prefill and decode."""
    length_predictor: v1.LengthPredictor = v1.LengthPredictor.PER_CLASS
    """The output-length predictor."""


class AdmissionFile(FileModel):
    """`admission`: the router's EDF queue."""

    queue_capacity: int = Field(1024, ge=0)
    """Requests the queue holds at most."""
    unfitted_prefills_per_worker: int | None = Field(4, ge=1)
    """`SloSettings.unfitted_prefills_per_worker`: the cap per prefill-capable worker before a
    prefill rate is fitted; null: no cap."""
    cold_start_wait_seconds: float = Field(0.0, ge=0, le=86400)
    """`DispatchSettings.cold_start_wait_s`: how long a request is held for a decode-capable
    worker to become ready (0: a 503 at once)."""
    cold_start_max_held: int = Field(1024, ge=0, le=1_000_000)
    """`DispatchSettings.cold_start_max_held`: the requests held so at most."""

    @field_validator(
        "queue_capacity",
        "unfitted_prefills_per_worker",
        "cold_start_wait_seconds",
        "cold_start_max_held",
        mode="before",
    )
    @classmethod
    def _a_number(cls, value: Any) -> Any:
        return v1.not_a_bool(value)


class PoolFile(FileModel):
    """`pool`: how the router reaches its workers (the service's `router.workerLink`)."""

    link: v1.WorkerLink = v1.WorkerLink.STREAM
    """`PoolSettings.link`: `stream` (default, as `PoolSettings`) or `grpc`."""


class EngineFile(FileModel):
    """The engine the workers run (it decides the default tokenizer)."""

    kind: v1.EngineKind = v1.EngineKind.VLLM
    """`vllm`: the tokenizer is the model's; `sim`: the local byte-level BPE unless given. Any
    other value is refused (was taken as `vllm`)."""


class RouterFile(FileModel):
    """The whole `router.yaml`. Build with `RouterFile.from_configmap`, turn into a `RouterConfig`
    with `router_config()`.
    """

    service: str = ""
    """The owning `LLMService` (informational: logs)."""
    model: v1.ModelSpec
    """The served model; `name` is what clients send, `tokenizer` (else `source`) is loaded."""
    engine: EngineFile = EngineFile()
    """The workers' engine."""
    listen: ListenFile = ListenFile()
    """The router's interface and ports."""
    auth: AuthFile = AuthFile()
    """API keys."""
    discovery: DiscoverySettings | None = None
    """Worker discovery; None: static addresses only."""
    placement: PlacementFile = PlacementFile()
    """Placement profile, disaggregation, length predictor."""
    admission: AdmissionFile = AdmissionFile()
    """The admission queue."""
    pool: PoolFile = PoolFile()
    """The link to the workers."""
    slo_classes: tuple[v1.SloClassSpec, ...] = ()
    """SLO classes (targets, priority, sheddable)."""
    default_slo_class: str | None = None
    """Class of requests without `x-slo-class`."""
    edge: v1.RouterEdgeSpec = v1.RouterEdgeSpec()
    """The client-facing limits (the service's `router.edge`); unset fields: the defaults."""
    backends: tuple[HttpBackend, ...] = ()
    """Stock `vllm serve` servers as workers (url, role); docs/engines.md."""
    backend_discovery: BackendDiscoverySettings | None = None
    """Stock `vllm serve` pods found by their labels; docs/engines.md."""

    @classmethod
    def from_configmap(cls, data: Mapping[str, Any]) -> tuple[RouterFile, tuple[str, ...]]:
        """Parse `router.yaml` (already YAML-decoded).

        Keys this router does not know (a newer operator's) are dropped, not fatal; their dotted
        paths come back as the second element so the caller can log them.

        Raises:
            pydantic.ValidationError: a known key has a bad value.
        """
        clean, ignored = _strip_unknown(cls, data, "")
        return cls.model_validate(clean), tuple(ignored)

    @property
    def needs_default_tokenizer(self) -> bool:
        """Simulated engines run no model: without an explicit tokenizer, use the local BPE."""
        return self.engine.kind == "sim" and not self.model.tokenizer

    def tokenizer_dir(self) -> str:
        return self.model.tokenizer or self.model.source

    def tokenizer_revision(self) -> str | None:
        """The revision the workers load, when the tokenizer is the `hf://` source's repository
        (as the operator renders it: vLLM then loads that tokenizer at the model's revision
        too). None for an explicit `model.tokenizer` other than the source's repository."""
        src = self.model.parsed_source()
        if src.kind is not v1.SourceKind.HF or self.tokenizer_dir() != src.location:
            return None
        return src.revision or self.model.revision

    def router_config(self, **overrides: Any) -> RouterConfig:
        """The `RouterConfig` this file describes; `overrides` (RouterConfig fields) win."""
        values: dict[str, Any] = {
            "model_name": self.model.name,
            "tokenizer_dir": self.tokenizer_dir(),
            "tokenizer_revision": self.tokenizer_revision(),
            "http_host": self.listen.host,
            "grpc_host": self.listen.host,
            "http_port": self.listen.http_port,
            "grpc_port": self.listen.grpc_port,
            "auth": AuthSettings(
                key_file=self.auth.key_file, reload_interval_s=self.auth.reload_interval_seconds
            ),
            "discovery": self.discovery,
            "placement": PlacementSettings(
                profile=self.placement.profile, disaggregation=self.placement.disaggregation
            ),
            "slo": SloSettings(
                classes=self.slo_classes,
                default_class=self.default_slo_class,
                length_predictor=self.placement.length_predictor,
                queue_capacity=self.admission.queue_capacity,
                unfitted_prefills_per_worker=self.admission.unfitted_prefills_per_worker,
            ),
            "pool": PoolSettings(link=self.pool.link.value),
            "dispatch": DispatchSettings(
                cold_start_wait_s=self.admission.cold_start_wait_seconds,
                cold_start_max_held=self.admission.cold_start_max_held,
            ),
            "edge": EdgeSettings(**self.edge.settings_fields()),
            "backends": self.backends,
            "backend_discovery": self.backend_discovery,
        }
        for section in ("dispatch", "placement", "edge"):
            if section in overrides:  # flags override single fields, the file the rest
                flags = overrides.pop(section)
                flags = (
                    flags.model_dump(exclude_unset=True)  # only the fields the flags set
                    if isinstance(flags, BaseModel)
                    else dict(flags)
                )
                values[section] = values[section].model_copy(update=flags)
        values.update(overrides)
        return RouterConfig(**values)


def _nested_model(annotation: Any) -> type[BaseModel] | None:
    """The model class inside `M`, `M | None` or `tuple[M, ...]`, else None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = _nested_model(arg)
        if found is not None:
            return found
    return None


def _strip_unknown(model: type[BaseModel], data: Any, path: str) -> tuple[Any, list[str]]:
    if not isinstance(data, Mapping):
        return data, []
    fields: dict[str, Any] = {}
    for name, field_info in model.model_fields.items():
        fields[name] = field_info
        if field_info.alias:
            fields[field_info.alias] = field_info
        elif model.model_config.get("alias_generator") is to_camel:
            fields[to_camel(name)] = field_info
    clean: dict[str, Any] = {}
    ignored: list[str] = []
    for key, value in data.items():
        info = fields.get(key)
        where = f"{path}.{key}" if path else str(key)
        if info is None:
            ignored.append(where)
            continue
        nested = _nested_model(info.annotation)
        if nested is not None and isinstance(value, list | tuple):
            items = []
            for i, item in enumerate(value):
                c, ign = _strip_unknown(nested, item, f"{where}[{i}]")
                items.append(c)
                ignored += ign
            clean[key] = items
        elif nested is not None:
            clean[key], ign = _strip_unknown(nested, value, where)
            ignored += ign
        else:
            clean[key] = value
    return clean, ignored
