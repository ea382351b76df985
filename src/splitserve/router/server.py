"""The router process: HTTP (uvicorn) and gRPC (grpc.aio) faces over one pool, one event loop.

With `config.discovery` set, a `KubernetesDiscovery` keeps the pool in step with the worker pods
(on top of the static `worker_addresses`).

`serve(config)` is what `splitserve router serve` runs. `RouterServer` is the same thing in
pieces, for tests and in-process stacks: `start()` binds (port 0 picks a free port), `stop()`
shuts down in order (stop taking requests, cancel what is pending, close worker channels).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterator
from wsgiref.simple_server import WSGIServer

import uvicorn
from grpc import aio
from prometheus_client import CollectorRegistry

from splitserve._gen.v1 import router_pb2_grpc
from splitserve.aio import stop_task
from splitserve.api.router import RouterConfig
from splitserve.core.clock import Clock, SystemClock
from splitserve.obs.metrics import PoolLoadCollector, RouterMetrics
from splitserve.router.auth import (
    OPEN_PATHS,
    AuthApp,
    KeyStore,
    RouterAuthInterceptor,
    warn_if_open,
)
from splitserve.router.discovery import FileDiscovery, KubernetesDiscovery, PodSource
from splitserve.router.dispatch import Dispatcher, default_decider
from splitserve.router.gc_tuning import settle as settle_gc_now
from splitserve.router.generation import Generator
from splitserve.router.grpc_service import RouterService
from splitserve.router.http_backend import HttpWorker
from splitserve.router.http_backend.discovery import BackendDiscovery
from splitserve.router.http_edge import ConnectionCount, bind_tcp_socket, edge_protocol
from splitserve.router.http_front import front_for
from splitserve.router.kv_warm import KvPairWarmer
from splitserve.router.loop_lag import LoopLagMonitor
from splitserve.router.openai_api import create_app
from splitserve.router.pool_view import PoolView
from splitserve.router.request_log import RequestLog
from splitserve.router.tokenizer import TextTokenizer

log = logging.getLogger(__name__)

_SHUTDOWN_GRACE_S = 2.0
_CUT_S = 3.0
"""After the drain grace: time for cut streams to send their error events and close."""


class _UvicornServer(uvicorn.Server):
    """uvicorn without its own SIGINT / SIGTERM handling: the process's signal handler calls
    `RouterServer.stop()`, which drains (uvicorn's would start its own shutdown first)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class RouterServer:
    """A router bound to its ports. Not restartable: build a new one."""

    def __init__(
        self,
        config: RouterConfig,
        *,
        clock: Clock | None = None,
        tokenizer: TextTokenizer | None = None,
        registry: CollectorRegistry | None = None,
        pod_source: PodSource | None = None,
        reuse_port: bool = False,
        settle_gc: bool = False,
    ) -> None:
        """`pod_source` replaces the Kubernetes API for discovery (tests). `reuse_port`: bind
        both ports with `SO_REUSEPORT`, so several router processes share them (the kernel
        spreads new connections across the processes). `settle_gc`: once started, set the
        process's garbage collector for a long-running server (`gc_tuning.settle`; a process
        setting, so `router serve` asks for it and in-process users such as tests do not)."""
        self.config = config
        self.reuse_port = reuse_port
        self.settle_gc = settle_gc
        self.clock: Clock = clock or SystemClock()
        self.registry = registry or CollectorRegistry()
        self.metrics = RouterMetrics(self.registry)
        self._tokenizer = tokenizer
        self.pool = PoolView(
            config.worker_addresses, clock=self.clock, settings=config.pool, metrics=self.metrics
        )
        self.registry.register(PoolLoadCollector(self.pool.load_rows))
        self.dispatcher = Dispatcher(
            self.pool,
            clock=self.clock,
            metrics=self.metrics,
            settings=config.dispatch,
            decider=default_decider(config.placement, self.pool.ledger),
            slo=config.slo,
            placement=config.placement,
        )
        self.loop_lag = LoopLagMonitor(self.metrics, self.clock)
        self.discovery: KubernetesDiscovery | None = None
        if config.discovery is not None:
            self.discovery = KubernetesDiscovery(self.pool, config.discovery, pod_source)
        self.backend_discovery: BackendDiscovery | None = None
        if config.backend_discovery is not None:  # stock `vllm serve` pods (docs/engines.md)
            self.backend_discovery = BackendDiscovery(
                self.pool, config.backend_discovery, pod_source
            )
        self.file_discovery: FileDiscovery | None = None
        if config.workers_file is not None:
            self.file_discovery = FileDiscovery(self.pool, config.workers_file)
        self.http_port: int | None = None
        self.grpc_port: int | None = None
        self._http: uvicorn.Server | None = None
        self._http_task: asyncio.Task[None] | None = None
        self._grpc: aio.Server | None = None
        self._kv_warm: asyncio.Task[None] | None = None
        self.connections = ConnectionCount()
        self._generator: Generator | None = None
        self.draining = False
        self.keys: KeyStore | None = None
        if config.auth.enabled:
            self.keys = KeyStore(config.auth, self.clock, slo_classes=config.slo.class_names)
        self.metrics_port: int | None = None
        self._metrics_server: WSGIServer | None = None

    async def start(self) -> None:
        """Load the tokenizer, watch the workers, open both ports. Returns once they listen.
        A start that fails part way (a busy HTTP or metrics port) stops what it had started
        before raising: the gRPC server left listening was noise from its finalizer at exit
        ("Error in sys.excepthook")."""
        try:
            await self._start()
        except BaseException:
            await self.stop(grace_s=0)
            raise

    async def _start(self) -> None:
        tokenizer = self._tokenizer
        if tokenizer is None:
            tokenizer = await asyncio.to_thread(
                TextTokenizer.from_dir, self.config.tokenizer_dir, self.config.tokenizer_revision
            )
        generator = Generator(
            self.dispatcher,
            tokenizer,
            clock=self.clock,
            max_model_len=self.config.max_model_len,
            default_max_tokens=self.config.default_max_tokens,
            request_log=RequestLog.from_env(),  # SPLITSERVE_REQUEST_LOG=<path>: per-request log
            edge=self.config.edge,
        )
        self._generator = generator
        await self.pool.start()
        for backend in self.config.backends:  # stock `vllm serve` servers (docs/engines.md)
            self.pool.add_stub(backend.url, (worker := HttpWorker(backend)), worker)
        self.loop_lag.start()
        self._kv_warm = asyncio.create_task(KvPairWarmer(self.pool).run(), name="warm-kv")
        if self.discovery is not None:
            await self.discovery.start()
        if self.file_discovery is not None:
            await self.file_discovery.start()
        if self.backend_discovery is not None:
            await self.backend_discovery.start()
        if self.config.grpc_port is not None:
            interceptors = []
            if self.keys is not None:
                interceptors.append(
                    RouterAuthInterceptor(
                        self.keys,
                        model_name=self.config.model_name,
                        default_max_tokens=self._charged_max_tokens(),
                    )
                )
            self._grpc = aio.server(
                options=[("grpc.so_reuseport", int(self.reuse_port))], interceptors=interceptors
            )
            router_pb2_grpc.add_RouterServicer_to_server(RouterService(generator), self._grpc)
            address = f"{self.config.grpc_host}:{self.config.grpc_port}"
            self.grpc_port = self._grpc.add_insecure_port(address)
            await self._grpc.start()
        app = create_app(
            generator,
            self.pool,
            model_name=self.config.model_name,
            registry=self.registry,
            unix_time=time.time,
            model_root=self.config.tokenizer_dir,
        )
        await self._start_http(self._secured(app))
        if self.settle_gc:
            settle_gc_now()
        log.info(
            "router serving %s: http %s:%s grpc %s, %d static workers%s",
            self.config.model_name,
            self.config.http_host,
            self.http_port,
            self.grpc_port,
            len(self.config.worker_addresses),
            _discovery_note(self.config),
        )
        if self.config.dispatch.early_decode:
            log.info(
                "early decode on (--early-decode): P/D Decodes go to the decode worker at "
                "placement with kv_follows; a worker that refuses them gets ordinary Decodes "
                "until its link reconnects (splitserve_router_fallbacks_total"
                '{reason="early_decode_refused"})'
            )

    def _charged_max_tokens(self) -> int:
        """What a tenant's token limit charges a request that names no `max_tokens`: the
        service-level cap, else the context limit (such a request may run that far)."""
        return self.config.default_max_tokens or self.config.max_model_len

    def _secured(self, app: object) -> object:
        """The app behind API keys (when configured); `/metrics` on its own port if asked."""
        warn_if_open(self.config.auth)
        open_paths = OPEN_PATHS
        if self.config.metrics_port is not None:
            from prometheus_client import start_http_server

            server, _ = start_http_server(
                self.config.metrics_port, self.config.http_host, self.registry
            )
            self._metrics_server = server
            self.metrics_port = int(server.server_port)
            open_paths = OPEN_PATHS - {"/metrics"}
        if self.keys is None:
            return app
        return AuthApp(
            app,
            self.keys,
            model_name=self.config.model_name,
            default_max_tokens=self._charged_max_tokens(),
            max_body_bytes=self.config.edge.max_body_bytes,
            open_paths=open_paths,
        )

    async def _start_http(self, app: object) -> None:
        cfg = uvicorn.Config(
            app,  # type: ignore[arg-type]
            host=self.config.http_host,
            port=self.config.http_port,
            log_config=None,
            lifespan="off",
            access_log=False,
            http="httptools",
            timeout_keep_alive=max(1, round(self.config.edge.idle_timeout_s)),
            # A backstop: our own drain cuts streams at the grace period and waits _CUT_S more.
            timeout_graceful_shutdown=round(self.config.edge.drain_grace_s + 2 * _CUT_S),
        )
        cfg.load()
        cfg.http_protocol_class = front_for(
            cfg, edge_protocol(cfg.http_protocol_class, self.config.edge, self.connections)
        )
        sock = bind_tcp_socket(
            self.config.http_host, self.config.http_port, reuse_port=self.reuse_port
        )
        self.http_port = int(sock.getsockname()[1])
        self._http = _UvicornServer(cfg)
        self._http_task = asyncio.create_task(self._http.serve(sockets=[sock]), name="uvicorn")
        while not self._http.started:  # uvicorn offers no event for "listening"
            if self._http_task.done():
                await self._http_task  # re-raise why it stopped
                raise RuntimeError("the HTTP server stopped during start-up")
            await asyncio.sleep(0.01)

    async def wait(self) -> None:
        """Until the HTTP server exits (after `stop()`, or on a fatal error)."""
        if self._http_task is not None:
            await asyncio.shield(self._http_task)

    async def stop(self, grace_s: float | None = None) -> None:
        """Drain, then shut down: stop accepting (both ports), let in-flight requests finish for
        `grace_s` (default `edge.drain_grace_s`), cut the rest (a streamed answer ends with an
        error event, a whole one is a 503, a gRPC call UNAVAILABLE), close worker channels."""
        grace = self.config.edge.drain_grace_s if grace_s is None else grace_s
        self.draining = True
        # Requests held for a cold start would wait out the grace for a worker this router
        # will not use: answered now (503), so that their clients retry elsewhere.
        if held := self.dispatcher.close_holds():
            log.info("shutting down: answered %d requests held for a cold start", held)
        if self._http is not None:
            self._http.should_exit = True  # closes the listener, then waits for connections
        grpc_stop = None
        if self._grpc is not None:
            grpc_stop = asyncio.create_task(self._grpc.stop(grace + _CUT_S))
        generator = self._generator
        if generator is not None and generator.num_running:
            log.info("draining: %d requests in flight, grace %g s", generator.num_running, grace)
            if not await generator.wait_idle(grace):
                num_cut = generator.cut_all()
                log.warning("cut %d requests still running after the %g s grace", num_cut, grace)
        if self._http is not None and self._http_task is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(asyncio.shield(self._http_task), _CUT_S)
            if not self._http_task.done():
                self._http_task.cancel()
        if grpc_stop is not None:
            await grpc_stop
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.dispatcher.drain_background(), _SHUTDOWN_GRACE_S)
        if self.discovery is not None:
            await self.discovery.stop()
        if self.file_discovery is not None:
            await self.file_discovery.stop()
        if self.backend_discovery is not None:
            await self.backend_discovery.stop()
        if self._kv_warm is not None:
            await stop_task(self._kv_warm)
        await self.dispatcher.close()
        await self.pool.close()
        await self.loop_lag.stop()
        if self._metrics_server is not None:
            await asyncio.to_thread(self._metrics_server.shutdown)
            self._metrics_server.server_close()
        if self._generator is not None:
            self._generator.close()
        log.info("router stopped")


def _discovery_note(config: RouterConfig) -> str:
    d = config.discovery
    return "" if d is None else f", watching pods {d.selector!r} in namespace {d.namespace}"


async def serve(config: RouterConfig, ready: asyncio.Event | None = None) -> None:
    """Run the router until cancelled (then drain and stop) or until the HTTP server exits.

    Args:
        config: the router's configuration.
        ready: set once both ports listen.
    """
    server = RouterServer(config)
    await server.start()
    try:
        if ready is not None:
            ready.set()
        await server.wait()
    finally:
        await server.stop()
