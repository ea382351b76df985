"""The control loop inside `splitserve operator run`: one `Controller` per process, its metrics
registry, and the `/metrics` + `/healthz` server. The per-service kopf daemon that ticks it is
`operator.handlers.autoscale_loop`."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer

from prometheus_client import CollectorRegistry

from splitserve.obs.metrics import OperatorMetrics
from splitserve.operator.control import server
from splitserve.operator.control.loop import Controller, LoadProbe, http_get
from splitserve.operator.kube import Kube


@dataclass
class ControlConfig:
    get: Callable[[str], str] = http_get
    """HTTP GET of a router's /metrics or a Prometheus query (tests pass a fake)."""
    loads: LoadProbe | None = None
    """Worker load reports (None: gRPC WatchLoad)."""
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)


@dataclass
class _Runtime:
    config: ControlConfig = field(default_factory=ControlConfig)
    controller: Controller | None = None
    guard: threading.Lock = field(default_factory=threading.Lock)
    metrics: OperatorMetrics | None = None
    startup: server.Startup = field(default_factory=server.Startup)


_rt = _Runtime()


def configure(config: ControlConfig) -> None:
    """Set the loop's I/O (before the operator starts)."""
    global _rt
    _rt = _Runtime(config=config)


def metrics() -> OperatorMetrics:
    """The operator's metrics (one set per process, on the registry `/metrics` serves)."""
    with _rt.guard:
        _rt.metrics = _rt.metrics or OperatorMetrics(_rt.config.registry)
        return _rt.metrics


def startup() -> server.Startup:
    """The operator's start-up state, as `/healthz` reports it (kopf's start-up handler records
    into it; `operator run` calls `begin()` before kopf starts)."""
    return _rt.startup


def observe_api(verb: str, code: str, seconds: float) -> None:
    """A `kube.ApiObserver` into the current metrics (the operator's `RestKube` reports here)."""
    metrics().observe_api(verb, code, seconds)


def controller(kube: Callable[[], Kube]) -> Controller:
    with _rt.guard:
        if _rt.controller is None:
            _rt.metrics = _rt.metrics or OperatorMetrics(_rt.config.registry)
            _rt.controller = Controller(
                kube(), _rt.metrics, get=_rt.config.get, loads=_rt.config.loads
            )
        return _rt.controller


def forget(namespace: str, name: str) -> None:
    """A service was deleted: the loop drops its state and metric series (`Controller.forget`).
    Its daemon is stopped by then, so no later tick would."""
    with _rt.guard:
        ctl = _rt.controller
    if ctl is not None:
        ctl.forget(namespace, name)


def serve(host: str, port: int) -> ThreadingHTTPServer:
    """Serve `/metrics` and `/healthz` for the loop."""
    with _rt.guard:
        _rt.metrics = _rt.metrics or OperatorMetrics(_rt.config.registry)

    def ticks() -> dict[str, tuple[float, float]]:
        return _rt.controller.last_ticks() if _rt.controller is not None else {}

    return server.serve(
        _rt.config.registry,
        server.health_of(ticks, time.monotonic, lambda: _rt.startup.verdict()),
        host=host,
        port=port,
    )
