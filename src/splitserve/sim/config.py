"""Scenario configuration: a typed description of one simulation, and its translation to specs.

Owns: the pydantic models a scenario file (YAML) validates against, and the pure functions that
turn them into a `ClusterSpec`, a workload and SLO classes. Reading files is the runner's job:
`build_workload` takes trace lines, not a path.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal, TypeVar

import numpy as np
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)

from splitserve.core.errors import ConfigError
from splitserve.core.ids import PoolName, SloClassName
from splitserve.core.perf import (
    HARDWARE,
    MODELS,
    LatencyModel,
    LinkedModel,
    OverheadModel,
    RooflineModel,
    TimeScaledModel,
    build_latency_model,
    kv_link,
    parse_profile_csv,
)
from splitserve.core.request import SloClass
from splitserve.core.roles import Role, parse_role
from splitserve.policy.batching.builtin import checked_batching_policy, make_batching_policy
from splitserve.policy.planner.tp import tp_refusal
from splitserve.sim.cluster import ClusterSpec, KvOverlap
from splitserve.sim.entities import PoolSpec, WorkerTemplate
from splitserve.sim.workload import (
    PRESETS,
    ArrivalProcess,
    Fixed,
    Gamma,
    LengthDist,
    LogNormal,
    Poisson,
    Uniform,
    WorkItem,
    parse_azure_trace,
    scale_to_rate,
    synthetic,
)

_T = TypeVar("_T")
_STRICT = ConfigDict(
    frozen=True, extra="forbid", use_attribute_docstrings=True, allow_inf_nan=False
)
"""No field means anything by nan or inf (`rate_per_s: .inf` ran with every arrival at 0)."""

MAX_REQUESTS = 1_000_000
"""A workload's `num_requests` / `trace.max_requests` at most: one run simulates about 5,000
requests per second of CPU, so this is minutes (a goodput search runs it several times);
without a bound `num_requests: 1000000000` ran for ever."""

MAX_REPLICAS = 10_000
"""A pool's `replicas` at most (the router scores every worker for every request)."""


class PoolConfig(BaseModel):
    model_config = _STRICT
    name: str
    role: str
    """prefill | decode | mixed"""
    replicas: int = Field(1, ge=0, le=MAX_REPLICAS)
    tp: int = Field(1, ge=1)
    """GPUs per worker (tensor parallel)."""
    policy: str = "fcfs"
    """A registered step policy (`policy.batching.builtin`)."""
    policy_params: dict[str, Any] = Field(default_factory=dict)

    @field_validator("role")
    @classmethod
    def _a_role(cls, value: str) -> str:
        # was exit 1 "unknown role 'bogus'" from building the cluster, naming no file or key
        return parse_role(value).value


def _applicable_only(
    model: BaseModel, keys: frozenset[str], handler: SerializerFunctionWrapHandler
) -> dict[str, Any]:
    """`model`'s dump without the keys that do not act for it (their defaults): a dumped
    scenario (`config.yaml`) shows what the run used and loads again (a key that does not act
    is refused when written)."""
    dumped: dict[str, Any] = handler(model)
    return {k: v for k, v in dumped.items() if k in keys}


_LENGTH_KEYS: dict[str, frozenset[str]] = {
    "fixed": frozenset({"kind", "tokens"}),
    "uniform": frozenset({"kind", "low_tokens", "high_tokens"}),
    "lognormal": frozenset({"kind", "median_tokens", "sigma", "min_tokens", "max_tokens"}),
}
"""The keys each length `kind` reads; any other key written beside it is refused (a fixed
length's `median_tokens`, `sigma` or `low_tokens` was silently ignored)."""


class LengthConfig(BaseModel):
    model_config = _STRICT
    kind: Literal["fixed", "uniform", "lognormal"]
    tokens: int | None = None
    """fixed"""
    low_tokens: int | None = None
    """uniform"""
    high_tokens: int | None = None
    """uniform"""
    median_tokens: float | None = None
    """lognormal"""
    sigma: float = 1.0
    """lognormal"""
    min_tokens: int = 1
    """lognormal"""
    max_tokens: int = 1 << 20
    """lognormal"""

    @field_validator(
        "tokens",
        "low_tokens",
        "high_tokens",
        "median_tokens",
        "sigma",
        "min_tokens",
        "max_tokens",
    )
    @classmethod
    def _read_by_the_kind(cls, value: _T, info: ValidationInfo) -> _T:
        # Runs only on keys the file writes (not on defaults); `kind` is validated first.
        kind = info.data.get("kind")
        name = info.field_name
        if value is not None and kind in _LENGTH_KEYS and name not in _LENGTH_KEYS[kind]:
            reads = ", ".join(sorted(_LENGTH_KEYS[kind] - {"kind"}))
            raise ValueError(f"{name} does not apply to a {kind} length (it reads {reads})")
        return value

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return _applicable_only(self, _LENGTH_KEYS[self.kind], handler)


class TraceConfig(BaseModel):
    model_config = _STRICT
    path: str
    """Azure LLM 2023 CSV (TIMESTAMP, ContextTokens, GeneratedTokens)."""
    time_scale: float = Field(1.0, gt=0)
    """Multiplies arrival offsets (0.5 replays twice as fast); refused beside the workload's
    `rate_per_s`, which sets the pace instead."""
    max_requests: int | None = Field(None, ge=1, le=MAX_REQUESTS)
    """Replay only the trace's first this many rows; unset: every row."""


_SYNTHETIC_KEYS = frozenset(
    {"arrival", "rate_per_s", "num_requests", "preset", "prompt", "output", "seed", "slo_class"}
)
_ARRIVAL_KEYS: dict[str, frozenset[str]] = {
    "poisson": _SYNTHETIC_KEYS,
    "gamma": _SYNTHETIC_KEYS | {"cv"},
    "trace": frozenset({"arrival", "rate_per_s", "trace", "slo_class"}),
}
"""The workload keys each `arrival` reads; any other key written beside it is refused (they
were silently ignored: a poisson workload's `cv` or `trace`, a trace's `preset`, `seed`, `cv`,
and `num_requests`, which cut the trace to its 500 default)."""

_WHY_NOT: dict[str, str] = {
    "cv": "cv shapes gamma arrivals only",
    "trace": "trace is replayed only with `arrival: trace`",
    "num_requests": "a trace replays every row; cap it with `trace.max_requests`",
    "seed": "a trace replay draws nothing at random",
    "preset": "a trace gives every request's lengths",
    "prompt": "a trace gives every request's lengths",
    "output": "a trace gives every request's lengths",
}


class WorkloadConfig(BaseModel):
    model_config = _STRICT
    arrival: Literal["poisson", "gamma", "trace"] = "poisson"
    rate_per_s: float | None = Field(None, gt=0)
    """Arrival rate; for a trace, rescales its timestamps to this mean rate."""
    cv: float = Field(1.0, gt=0)
    """Gamma arrivals' coefficient of variation (gamma only)."""
    num_requests: int = Field(500, ge=1, le=MAX_REQUESTS)
    """Requests drawn (poisson, gamma); a trace replays its rows (`trace.max_requests`)."""
    preset: str | None = None
    """sharegpt | humaneval | longbench (lengths; see `sim.workload.PRESETS`); or `prompt` and
    `output`, not both."""
    prompt: LengthConfig | None = None
    output: LengthConfig | None = None
    trace: TraceConfig | None = None
    """`arrival: trace` only."""
    seed: int = Field(0, ge=0)
    """Seeds the draws of arrivals and lengths (poisson, gamma)."""
    slo_class: str = "default"

    @field_validator(
        "rate_per_s", "cv", "num_requests", "preset", "prompt", "output", "trace", "seed"
    )
    @classmethod
    def _read_by_the_arrival(cls, value: _T, info: ValidationInfo) -> _T:
        # Runs only on keys the file writes (not on defaults), in field order: `arrival`,
        # `rate_per_s` and `preset` are validated before the keys checked against them.
        if value is None:
            return value
        arrival = info.data.get("arrival")
        name = info.field_name or ""
        if arrival in _ARRIVAL_KEYS and name not in _ARRIVAL_KEYS[arrival]:
            raise ValueError(f"{name} does not apply to {arrival} arrivals ({_WHY_NOT[name]})")
        if name in ("prompt", "output") and info.data.get("preset") is not None:
            raise ValueError(
                f"set either `preset` or `prompt` and `output`, not both (preset "
                f"{info.data['preset']!r} gives the lengths, so {name} would be ignored)"
            )
        if (
            name == "trace"
            and isinstance(value, TraceConfig)
            and "time_scale" in value.model_fields_set
            and info.data.get("rate_per_s") is not None
        ):
            raise ValueError(
                "trace.time_scale does not apply beside rate_per_s (the rate rescales the "
                "trace's timestamps to its mean, whatever their scale): set one of them"
            )
        return value

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        keys = _ARRIVAL_KEYS[self.arrival]
        if self.preset is not None:
            keys -= {"prompt", "output"}
        dumped = _applicable_only(self, keys, handler)
        if self.rate_per_s is not None and isinstance(dumped.get("trace"), dict):
            dumped["trace"] = {k: v for k, v in dumped["trace"].items() if k != "time_scale"}
        return dumped


class SloConfig(BaseModel):
    model_config = _STRICT
    name: str = "default"
    ttft_ms: float = Field(gt=0)
    tpot_ms: float = Field(gt=0)
    percentile: float = Field(0.9, gt=0, le=1)
    """Attainment target: fraction of requests that must meet both targets."""


class GoodputConfig(BaseModel):
    model_config = _STRICT
    low_rate: float = Field(gt=0)
    high_rate: float = Field(gt=0)
    tolerance: float = Field(0.05, gt=0)

    @model_validator(mode="after")
    def _rates_in_order(self) -> GoodputConfig:
        # was exit 1 'need 0 < low_rate < high_rate' after the scenario's own run, naming no key
        if self.low_rate >= self.high_rate:
            raise ValueError(
                f"low_rate ({self.low_rate:g}) must be below high_rate ({self.high_rate:g}): "
                "the search starts between them"
            )
        return self


class ClusterConfig(BaseModel):
    """The cluster half of a scenario: model, hardware, latency pricing and pools (what
    `splitserve sim validate` replays a recorded run on)."""

    model_config = _STRICT
    name: str = "scenario"
    model: str = "opt-13b"
    hardware: str = "a100-80g"
    time_scale: float = Field(1.0, gt=0)
    memory_utilization: float = Field(0.9, gt=0, le=1)
    block_size: int = Field(16, ge=1)
    kv_overlap: KvOverlap = KvOverlap.NONE
    load_report_interval_s: float = Field(0.0, ge=0)
    """0: the router sees exact worker state; > 0: load reports this often (live: 0.1 s)."""
    pools: list[PoolConfig]
    latency_model: str = "roofline"
    """How steps are priced (`core.perf.catalog`): `roofline`, or a model built from published
    GPU measurements: `distserve-a100`, `distserve-vllm-a100` (OPT-13B/66B), `vidur-a100`,
    `vidur-h100` (Llama family). A GPU model needs `hardware` set to the GPU it was measured on."""
    kv_link: str | None = None
    """Price KV transfers with a measured link (`core.perf.kvlink.KV_LINKS`: `nvlink-a100`,
    `infiniband-h100`, `nixl-loopback-cpu`, ...) instead of the latency model's default."""
    step_overhead_s: float = Field(0.0, ge=0)
    """Added to every step's price: a live engine's cost beyond the model (scheduling, RPC,
    event-loop delay), calibrated from a recorded run (`sim validate`). 0: none."""
    latency_profile: str | None = None
    """A profiled step-time table (CSV `component,x,seconds`, see `core.perf.table`) used
    instead of the roofline; relative paths are resolved against the scenario file."""

    @model_validator(mode="after")
    def _pool_names_once(self) -> ClusterConfig:
        """Workers, their records and the summary's rows go by pool name: two pools of one name
        were accepted, their workers sharing ids (as repeated `slo_classes` names are refused)."""
        names = [p.name for p in self.pools]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"pools: pool name {repeated[0]!r} is used more than once")
        return self


class ScenarioConfig(ClusterConfig):
    model_config = _STRICT
    workload: WorkloadConfig
    slo_classes: list[SloConfig] = Field(
        default_factory=lambda: [SloConfig(ttft_ms=200.0, tpot_ms=100.0)]
    )
    goodput: GoodputConfig | None = None
    """When set, also search the highest rate meeting the attainment target (`percentile`) of
    the workload's class."""

    @model_validator(mode="after")
    def _workload_class_declared(self) -> ScenarioConfig:
        """Every request is scored against its class: the workload's class must be declared,
        once. (An undeclared one scored nothing: an empty class table and, with `goodput`,
        attainment 0 at every rate; `slo_classes: []` with `goodput` was a StopIteration
        traceback; a repeated name silently replaced the earlier class.)"""
        names = [s.name for s in self.slo_classes]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"slo_classes: class {repeated[0]!r} is declared more than once")
        if self.workload.slo_class not in names:
            raise ValueError(
                f"workload.slo_class {self.workload.slo_class!r} is not among slo_classes "
                f"({', '.join(names) or 'none declared'}): its requests would be scored "
                "against no target"
            )
        return self


def _pick(table: Mapping[str, Any], name: str, what: str) -> Any:
    try:
        return table[name]
    except KeyError:
        raise ConfigError(f"unknown {what} {name!r}; valid: {', '.join(sorted(table))}") from None


def latency_model(cfg: ClusterConfig, tp: int) -> RooflineModel:
    shape = _pick(MODELS, cfg.model, "model")
    hw = _pick(HARDWARE, cfg.hardware, "hardware")
    return RooflineModel(shape, hw, tp=tp, time_scale=cfg.time_scale)


def named_latency_model(cfg: ClusterConfig, tp: int) -> LatencyModel:
    """The scenario's `latency_model` (and `kv_link`) for a worker of `tp` GPUs."""
    try:
        return build_latency_model(
            cfg.latency_model, cfg.model, cfg.hardware, tp, cfg.time_scale, cfg.kv_link
        )
    except ValueError as err:
        raise ConfigError(str(err)) from err


def worker_template(
    cfg: ClusterConfig, pool: PoolConfig, latency: LatencyModel | None = None
) -> WorkerTemplate:
    """A pool's worker: priced by `latency` when given (a profile), else by the scenario's
    named latency model; KV capacity always from the model shape on the hardware preset."""
    roofline = latency_model(cfg, pool.tp)
    blocks = roofline.kv_capacity_tokens(cfg.memory_utilization) // cfg.block_size
    if blocks < 1:
        raise ConfigError(f"{cfg.model} does not fit {cfg.hardware} x{pool.tp} with room for KV")
    priced = latency or named_latency_model(cfg, pool.tp)
    if cfg.step_overhead_s > 0:
        priced = OverheadModel(priced, cfg.step_overhead_s)
    return WorkerTemplate(
        latency=priced,
        num_blocks=blocks,
        kv_layout=roofline.shape.kv_layout,
        block_size=cfg.block_size,
        num_gpus=pool.tp,
        policy=pool.policy,
        policy_params=dict(pool.policy_params),
    )


def cluster_spec(cfg: ClusterConfig, profile_lines: Iterable[str] | None = None) -> ClusterSpec:
    """Pools of roofline-priced workers, or table-priced when profile lines are given (KV
    capacity still comes from the model shape and hardware)."""
    latency: LatencyModel | None = None
    if profile_lines is not None and cfg.latency_model != "roofline":
        raise ConfigError(
            "set either `latency_profile` or `latency_model`, not both "
            f"(latency_model={cfg.latency_model!r})"
        )
    if profile_lines is not None:
        try:
            latency = parse_profile_csv(profile_lines)
        except ValueError as err:
            raise ConfigError(f"bad latency profile: {err}") from err
        if cfg.kv_link is not None:
            try:
                latency = LinkedModel(latency, kv_link(cfg.kv_link))
            except ValueError as err:
                raise ConfigError(str(err)) from err
        if cfg.time_scale != 1:  # was ignored for a profile's steps (a named model takes it)
            latency = TimeScaledModel(latency, cfg.time_scale)
    for index, pool in enumerate(cfg.pools):
        _check_tp(cfg, index, pool)
        _check_policy(index, pool)
    _check_handoffs(cfg.pools)
    pools = tuple(
        PoolSpec(PoolName(p.name), parse_role(p.role), p.replicas, worker_template(cfg, p, latency))
        for p in cfg.pools
    )
    _check_can_finish(pools)
    return ClusterSpec(
        pools, kv_overlap=cfg.kv_overlap, load_report_interval_s=cfg.load_report_interval_s
    )


def _check_can_finish(pools: Iterable[PoolSpec]) -> None:
    """Every request ends on a decode-capable worker (decode or mixed; a decode worker also
    prefills locally, so a cluster without prefill workers runs): without one, no request can
    ever finish (the run printed 0 % attainment and exit 0), so the cluster is refused."""
    pools = tuple(pools)
    if any(p.role in (Role.DECODE, Role.MIXED) and p.replicas > 0 for p in pools):
        return
    have = ", ".join(f"{p.name} ({p.role.value} x{p.replicas})" for p in pools) or "no pool"
    raise ConfigError(
        "pools: no decode-capable worker (a pool with role decode or mixed and replicas >= 1), "
        f"so no request could ever finish; have: {have}"
    )


def _check_tp(cfg: ClusterConfig, index: int, pool: PoolConfig) -> None:
    """A TP degree vLLM refuses for the model's heads (`policy.planner.tp`, the check `plan`
    makes) is refused naming the pool (`tp: 3` on 32 heads simulated a worker vLLM never starts,
    `tp: 1024` one sharding each head over 32 GPUs)."""
    shape = _pick(MODELS, cfg.model, "model")
    why = tp_refusal(shape.num_heads, shape.num_kv_heads, pool.tp)
    if why is not None:
        raise ConfigError(
            f"pools[{index}] ({pool.name}).tp: {why} of {cfg.model} (vLLM would refuse it: "
            "heads % TP == 0, and KV heads % TP == 0 or TP % KV heads == 0)"
        )


def _check_policy(index: int, pool: PoolConfig) -> None:
    """Build a pool's step policy once, so a parameter it does not take is a `ConfigError`
    naming the pool (it was a TypeError traceback from inside the run); an unknown policy name
    is the registry's own `ConfigError`."""
    try:
        checked_batching_policy(pool.policy, pool.policy_params)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"pools[{index}] ({pool.name}).policy_params: {err}") from err


def _check_handoffs(pools: list[PoolConfig]) -> None:
    """Behind a prefill pool, every decode-capable pool receives hand-offs (remote KV): one
    whose step policy never schedules them (`runs_handoffs = False`: `tetriinfer-prefill`)
    never finished a request (`finished 0 | in flight 200`, exit 0), so it is refused naming
    the pool's policy."""
    if not any(p.role == Role.PREFILL and p.replicas > 0 for p in pools):
        return
    for index, pool in enumerate(pools):
        if pool.role == Role.PREFILL or pool.replicas == 0:
            continue
        policy = make_batching_policy(pool.policy, **pool.policy_params)
        if not getattr(policy, "runs_handoffs", True):
            raise ConfigError(
                f"pools[{index}] ({pool.name}).policy: {pool.policy!r} never runs a decode "
                f"hand-off (remote KV), so this {pool.role} pool could never finish the prefill "
                "pool's requests; run it on a prefill pool, and a decode policy here (fcfs, "
                "tetriinfer-decode, ...)"
            )


def slo_classes(cfg: ScenarioConfig) -> dict[SloClassName, SloClass]:
    return {
        SloClassName(s.name): SloClass(SloClassName(s.name), s.ttft_ms, s.tpot_ms, s.percentile)
        for s in cfg.slo_classes
    }


def _length(c: LengthConfig) -> LengthDist:
    try:
        if c.kind == "fixed":
            return Fixed(_need(c.tokens, "tokens"))
        if c.kind == "uniform":
            return Uniform(_need(c.low_tokens, "low_tokens"), _need(c.high_tokens, "high_tokens"))
        return LogNormal(
            _need(c.median_tokens, "median_tokens"), c.sigma, c.min_tokens, c.max_tokens
        )
    except ValueError as err:
        raise ConfigError(f"bad {c.kind} length: {err}") from err


def _need(value: _T | None, name: str) -> _T:
    if value is None:
        raise ConfigError(f"length distribution needs {name!r}")
    return value


def build_workload(
    w: WorkloadConfig, trace_lines: Iterable[str] | None = None, rate_per_s: float | None = None
) -> tuple[WorkItem, ...]:
    """The scenario's requests; `rate_per_s` overrides the configured rate (goodput search)."""
    rate = rate_per_s or w.rate_per_s
    cls = SloClassName(w.slo_class)
    if w.arrival == "trace":
        if w.trace is None or trace_lines is None:
            raise ConfigError("a trace workload needs `trace.path`")
        try:
            items = parse_azure_trace(trace_lines, w.trace.time_scale, cls, w.trace.max_requests)
        except ValueError as err:  # was exit 1 with the parser's message, naming no file
            raise ConfigError(f"workload.trace.path {w.trace.path!r}: {err}") from err
        if not items:  # ran an empty simulation, exit 0
            raise ConfigError(
                f"workload.trace.path {w.trace.path!r}: no request in the trace (no row with "
                "ContextTokens and GeneratedTokens >= 1)"
            )
        if not rate:
            return items
        try:
            return scale_to_rate(items, rate)
        except ValueError as err:  # was returned unscaled: every rate ran the same requests
            key = "workload.rate_per_s" if rate_per_s is None else "goodput"
            raise ConfigError(f"{key}: workload.trace.path {w.trace.path!r}: {err}") from err
    if rate is None:
        raise ConfigError(f"{w.arrival} arrivals need `rate_per_s`")
    arrivals: ArrivalProcess = Poisson(rate) if w.arrival == "poisson" else Gamma(rate, w.cv)
    if w.preset is not None:
        preset = _pick(PRESETS, w.preset, "length preset")
        prompt, output = preset.prompt, preset.output
    elif w.prompt is not None and w.output is not None:
        prompt, output = _length(w.prompt), _length(w.output)
    else:
        raise ConfigError("set `preset` or both `prompt` and `output` lengths")
    return synthetic(arrivals, prompt, output, w.num_requests, np.random.default_rng(w.seed), cls)
