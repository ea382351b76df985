"""kopf handlers: thin, module-level, all ending in `reconcile.reconcile` for one service.

- `LLMService` create / update / resume, and a daemon every `interval_s`: reconcile;
- `LLMService` delete: delete what it owns (garbage collection would too; this also covers API
  servers without it);
- `LLMPool` `spec.replicas` changes (`kubectl scale`, HPA): reconcile the owning service now
  rather than at the next tick.

Reconciles of one service never overlap (a lock per service). `configure()` is called by the
CLI (`splitserve operator run`) or a test before kopf starts.
"""

from __future__ import annotations

import datetime
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import kopf

from splitserve.api import v1alpha1 as v1
from splitserve.core.errors import ConfigError
from splitserve.operator import reconcile as rc
from splitserve.operator.control import runtime as control
from splitserve.operator.kube import Kube, KubeError, RestKube
from splitserve.operator.render import ServiceRef
from splitserve.operator.workers import GrpcWorkerClient, WorkerClient

Logger = logging.Logger | logging.LoggerAdapter[Any]

SERVICES = "llmservices"
POOLS = "llmpools"


@dataclass
class OperatorConfig:
    settings: rc.Settings = field(default_factory=rc.Settings)
    interval_s: float = 5.0
    """How often each service is reconciled even when nothing changed (flips, pod readiness)."""
    kubeconfig: str | None = None
    """Out-of-cluster: the kubeconfig file (in-cluster config is tried first)."""
    kube_factory: Callable[[], Kube] | None = None
    workers: WorkerClient | None = None


@dataclass
class _State:
    config: OperatorConfig = field(default_factory=OperatorConfig)
    kube: Kube | None = None
    locks: dict[tuple[str, str], threading.Lock] = field(default_factory=dict)
    guard: threading.Lock = field(default_factory=threading.Lock)
    pool_replicas: dict[tuple[str, str], Any] = field(default_factory=dict)


_state = _State()


def configure(config: OperatorConfig) -> None:
    """Set the operator's configuration (before kopf starts)."""
    global _state
    _state = _State(config=config)


def _kube() -> Kube:
    if _state.kube is None:
        factory = _state.config.kube_factory
        if factory is None:
            _load_kube_config(_state.config.kubeconfig)
            factory = RestKube
        _state.kube = factory()
    return _state.kube


def _load_kube_config(path: str | None) -> None:
    import kubernetes

    try:
        kubernetes.config.load_incluster_config()  # type: ignore[no-untyped-call]
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config(config_file=path)  # type: ignore[no-untyped-call]


def _workers() -> WorkerClient:
    if _state.config.workers is None:
        _state.config.workers = GrpcWorkerClient()
    return _state.config.workers


def _lock(namespace: str, name: str) -> threading.Lock:
    with _state.guard:
        return _state.locks.setdefault((namespace, name), threading.Lock())


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _reconcile(namespace: str | None, name: str, logger: Logger) -> None:
    if namespace is None:
        raise kopf.PermanentError("splitserve objects are namespaced")
    with _lock(namespace, name):
        try:
            outcome = rc.reconcile(
                _kube(), _workers(), namespace, name, _state.config.settings, _now()
            )
        except ConfigError as err:
            raise kopf.PermanentError(str(err)) from err
        except KubeError as err:
            if err.status in (404, 409, 422, 429) or err.status >= 500:
                raise kopf.TemporaryError(str(err), delay=2) from err
            raise
    for action in outcome.actions:
        logger.info(action)


def startup(settings: kopf.OperatorSettings, logger: Logger, **_: Any) -> None:
    settings.persistence.finalizer = f"{v1.GROUP}/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=v1.GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=v1.GROUP, key="last-handled-configuration"
    )
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 300
    settings.networking.request_timeout = 60
    _kube()
    logger.info("splitserve operator started (reconcile every %.1fs)", _state.config.interval_s)


def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """In-cluster service account, else the kubeconfig (`$KUBECONFIG` read now, not at import)."""
    return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)


def reconcile_service(name: str, namespace: str | None, logger: Logger, **_: Any) -> None:
    _reconcile(namespace, name, logger)


def control_loop(
    name: str, namespace: str | None, stopped: kopf.DaemonStopped, logger: Logger, **_: Any
) -> None:
    while not stopped.wait(_state.config.interval_s):
        try:
            _reconcile(namespace, name, logger)
        except (kopf.PermanentError, kopf.TemporaryError) as err:
            logger.warning("reconcile: %s", err)
        except Exception:
            logger.exception("reconcile failed; retrying in %.1fs", _state.config.interval_s)


def autoscale_loop(
    name: str, namespace: str | None, stopped: kopf.DaemonStopped, logger: Logger, **_: Any
) -> None:
    """The closed control loop (`operator.control`), every `scaling.intervalSeconds`."""
    if namespace is not None:
        control.daemon(_kube, _lock(namespace, name), namespace, name, stopped, logger)


def delete_service(name: str, namespace: str | None, uid: str, logger: Logger, **_: Any) -> None:
    if namespace is None:
        return
    with _lock(namespace, name):
        for action in rc.delete_owned(_kube(), ServiceRef(name, namespace, uid)):
            logger.info(action)


def replicas_changed(
    event: kopf.RawEvent, body: kopf.Body, namespace: str | None, **_: Any
) -> bool:
    """Whether an `LLMPool` event changed `spec.replicas` since the last one seen.

    The first sighting of a pool only records it (its service's own reconcile covers it);
    status writes, which are most of the events, do not pass.
    """
    if namespace is None:
        return False
    key = (namespace, str(body["metadata"]["name"]))
    if event.get("type") == "DELETED":
        _state.pool_replicas.pop(key, None)
        return False
    spec = body.get("spec") or {}
    seen = key in _state.pool_replicas
    previous = _state.pool_replicas.get(key)
    _state.pool_replicas[key] = spec.get("replicas")
    return seen and previous != spec.get("replicas") and bool(spec.get("service"))


def pool_changed(body: kopf.Body, namespace: str | None, logger: Logger, **_: Any) -> None:
    """`kubectl scale llmpool/...` or an HPA: act now instead of at the next tick."""
    service = str(body["spec"]["service"])
    logger.info("replicas -> %s: reconciling %s", body["spec"].get("replicas"), service)
    try:
        _reconcile(namespace, service, logger)
    except (kopf.PermanentError, kopf.TemporaryError) as err:
        logger.warning("reconcile: %s", err)


# Registration, apart from the definitions: the functions keep their own signatures (tests call
# them with only the kwargs they use), and the whole wiring reads in one place.
kopf.on.login()(login)
kopf.on.startup()(startup)
kopf.on.resume(v1.GROUP, v1.VERSION, SERVICES)(reconcile_service)
kopf.on.create(v1.GROUP, v1.VERSION, SERVICES)(reconcile_service)
kopf.on.update(v1.GROUP, v1.VERSION, SERVICES)(reconcile_service)
kopf.on.delete(v1.GROUP, v1.VERSION, SERVICES)(delete_service)
kopf.daemon(v1.GROUP, v1.VERSION, SERVICES, cancellation_backoff=1.0, cancellation_timeout=10.0)(
    control_loop
)
kopf.on.event(v1.GROUP, v1.VERSION, POOLS, when=replicas_changed)(pool_changed)
kopf.daemon(v1.GROUP, v1.VERSION, SERVICES, cancellation_timeout=10.0)(autoscale_loop)
