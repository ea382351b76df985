"""kopf handlers: thin, module-level, all ending in `reconcile.reconcile` for one service.

- `LLMService` create / update / resume, and a daemon every `interval_s`: reconcile;
- `LLMService` delete: delete what it owns (garbage collection would too; this also covers API
  servers without it);
- `LLMPool` `spec.replicas` changes (`kubectl scale`, HPA): reconcile the owning service now
  rather than at the next tick, and again when the coalescing window closes;
- every kind the operator reads: watch events feed a `kube.Store`, so an idle reconcile reads
  from memory and sends no request (the watch streams are per namespace and kind, not per
  service).

Reconciles of one service never overlap (a lock per service). A reconcile that fails on
something a retry cannot fix (an invalid spec; 400, 403, 422 from the API server) is reported
in status and as an Event by `reconcile`, logged here in one line, and retried with an
exponential back-off (up to `MAX_BACKOFF_S`) until the service changes. `configure()` is called
by the CLI (`splitserve operator run`) or a test before kopf starts.
"""

from __future__ import annotations

import datetime
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

import kopf

from splitserve.api import v1alpha1 as v1
from splitserve.core.errors import ConfigError
from splitserve.operator import reconcile as rc
from splitserve.operator.control import runtime as control
from splitserve.operator.events import Recorder
from splitserve.operator.kube import (
    OWNED_KINDS,
    PLURALS,
    CachedKube,
    Kube,
    KubeError,
    RestKube,
    Store,
    load_configuration,
)
from splitserve.operator.render import ServiceRef
from splitserve.operator.workers import GrpcWorkerClient, WorkerClient

Logger = logging.Logger | logging.LoggerAdapter[Any]

SERVICES = "llmservices"
POOLS = "llmpools"
MAX_BACKOFF_S: Final = 300.0
"""The longest a permanently failing service waits between attempts (a change retries now)."""
MAX_SETTLE_ROUNDS: Final = 10

CACHED_KINDS: Final = ((v1.API_VERSION, "LLMService"), *OWNED_KINDS, ("v1", "Pod"))
"""Kinds read through the watch-fed store (each is watched once per namespace)."""


def _ours(obj: Any) -> bool:
    """What the store keeps: services, and objects labelled with their service."""
    if obj.get("kind") == "LLMService":
        return True
    return v1.LABEL_SERVICE in ((obj.get("metadata") or {}).get("labels") or {})


@dataclass
class OperatorConfig:
    settings: rc.Settings = field(default_factory=rc.Settings)
    interval_s: float = 5.0
    """How often each service is reconciled even when nothing changed (flips, pod readiness)."""
    kubeconfig: str | None = None
    """Out-of-cluster: the kubeconfig file. It governs kopf's own client too (`login`)."""
    kube_factory: Callable[[], Kube] | None = None
    workers: WorkerClient | None = None
    cache: bool = True
    """Serve reads from the watch-fed store (False: every read is a request)."""


@dataclass
class _Failure:
    message: str
    attempts: int
    retry_at: float
    """`time.monotonic()` before which the daemon does not try again."""


@dataclass
class _State:
    config: OperatorConfig = field(default_factory=OperatorConfig)
    kube: Kube | None = None
    locks: dict[tuple[str, str], threading.Lock] = field(default_factory=dict)
    guard: threading.Lock = field(default_factory=threading.Lock)
    pool_replicas: dict[tuple[str, str], Any] = field(default_factory=dict)
    store: Store = field(default_factory=lambda: Store(CACHED_KINDS, _ours))
    events: Recorder = field(default_factory=Recorder)
    coalescer: rc.Coalescer | None = None
    failures: dict[tuple[str, str], _Failure] = field(default_factory=dict)


_state = _State()


def configure(config: OperatorConfig) -> None:
    """Set the operator's configuration (before kopf starts)."""
    global _state
    _state = _State(config=config, coalescer=rc.Coalescer(config.settings.coalesce_s))


def _kube() -> Kube:
    if _state.kube is None:
        factory = _state.config.kube_factory
        if factory is not None:
            _state.kube = factory()
        else:
            import kubernetes

            cfg = load_configuration(_state.config.kubeconfig)
            rest = RestKube(kubernetes.client.ApiClient(cfg))
            _state.kube = CachedKube(rest, _state.store) if _state.config.cache else rest
    return _state.kube


def _workers() -> WorkerClient:
    if _state.config.workers is None:
        _state.config.workers = GrpcWorkerClient()
    return _state.config.workers


def _lock(namespace: str, name: str) -> threading.Lock:
    with _state.guard:
        return _state.locks.setdefault((namespace, name), threading.Lock())


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _failed(key: tuple[str, str], message: str, permanent: bool, logger: Logger) -> None:
    """Remember a failure; log it once per distinct message, without a traceback."""
    old = _state.failures.get(key)
    attempts = old.attempts + 1 if old is not None and old.message == message else 1
    interval = max(_state.config.interval_s, 1.0)
    delay = min(interval * 2**attempts, MAX_BACKOFF_S) if permanent else interval
    _state.failures[key] = _Failure(message, attempts, time.monotonic() + delay)
    if attempts == 1:
        kind = "permanent" if permanent else "temporary"
        retry = (
            f"retrying in {delay:.0f}s, backing off to {MAX_BACKOFF_S:.0f}s" if permanent else ""
        )
        logger.warning("reconcile failed (%s%s): %s", kind, f"; {retry}" if retry else "", message)
    else:
        logger.debug("reconcile failed again (attempt %d): %s", attempts, message)


def _reconcile(
    namespace: str | None, name: str, logger: Logger, *, force: bool = True
) -> rc.Outcome | None:
    """One reconcile; None when skipped (backing off). `force`: ignore the back-off (the
    service or one of its pools changed).

    Raises `kopf.TemporaryError` for what a retry may fix; permanent failures are reported
    (status, Event, one log line) and not raised: the back-off retries them.
    """
    if namespace is None:
        raise kopf.PermanentError("splitserve objects are namespaced")
    key = (namespace, name)
    failure = _state.failures.get(key)
    if failure is not None and not force and time.monotonic() < failure.retry_at:
        return None
    with _lock(namespace, name):
        try:
            outcome = rc.reconcile(
                _kube(),
                _workers(),
                namespace,
                name,
                _state.config.settings,
                _now(),
                events=_state.events,
                coalescer=_state.coalescer,
            )
        except ConfigError as err:
            _failed(key, str(err), True, logger)
            return None
        except KubeError as err:
            _failed(key, str(err), err.permanent, logger)
            if err.permanent:
                return None
            raise kopf.TemporaryError(str(err), delay=2) from err
    if _state.failures.pop(key, None) is not None:
        logger.info("reconcile succeeded again")
    for action in outcome.actions:
        logger.info(action)
    return outcome


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


def login(settings: kopf.OperatorSettings, **_: Any) -> kopf.ConnectionInfo:
    """kopf's credentials from the same configuration as the operator's own client:
    `--kubeconfig` when given, else in-cluster (the ServiceAccount), else the default kubeconfig.
    One identity for every call the operator makes."""
    return connection_info(load_configuration(_state.config.kubeconfig), settings)


def connection_info(cfg: Any, settings: kopf.OperatorSettings) -> kopf.ConnectionInfo:
    """A `kubernetes.client.Configuration` as kopf's `ConnectionInfo` (as kopf's own
    `login_via_client` reads it)."""
    header = cfg.get_api_key_with_prefix("BearerToken") or cfg.get_api_key_with_prefix(
        "authorization"
    )
    parts = header.split(" ", 1) if header else []
    scheme, token = (
        (None, None) if not parts else (None, parts[0]) if len(parts) == 1 else tuple(parts)
    )
    return kopf.ConnectionInfo(
        server=cfg.host,
        ca_path=cfg.ssl_ca_cert,
        insecure=not cfg.verify_ssl,
        username=cfg.username or None,
        password=cfg.password or None,
        scheme=scheme,
        token=token,
        certificate_path=cfg.cert_file,
        private_key_path=cfg.key_file,
        trust_env=settings.networking.trust_env,
    )


def reconcile_service(name: str, namespace: str | None, logger: Logger, **_: Any) -> None:
    _reconcile(namespace, name, logger)


def control_loop(
    name: str, namespace: str | None, stopped: kopf.DaemonStopped, logger: Logger, **_: Any
) -> None:
    last_unexpected = ""
    while not stopped.wait(_state.config.interval_s):
        try:
            _reconcile(namespace, name, logger, force=False)
        except kopf.TemporaryError:
            pass  # logged once by _failed
        except Exception as err:  # a bug: log its traceback once, then one line per repeat
            if str(err) != last_unexpected:
                logger.exception("reconcile failed; retrying in %.1fs", _state.config.interval_s)
            else:
                logger.warning("reconcile failed again: %s", err)
            last_unexpected = str(err)


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
    _state.failures.pop((namespace, name), None)
    if _state.coalescer is not None:
        _state.coalescer.forget((namespace, name))


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
    """`kubectl scale llmpool/...` or an HPA: act now instead of at the next tick, and again
    when the coalescing window closes (two `kubectl scale` in a row become one flip)."""
    service = str(body["spec"]["service"])
    logger.info("replicas -> %s: reconciling %s", body["spec"].get("replicas"), service)
    try:
        for _round in range(MAX_SETTLE_ROUNDS):
            outcome = _reconcile(namespace, service, logger)
            if outcome is None or outcome.settle_s <= 0:
                return
            time.sleep(outcome.settle_s + 0.05)
    except kopf.TemporaryError:
        pass  # logged once; the daemon retries


def cache_feeder(api_version: str, kind: str) -> Callable[..., Any]:
    """A watch-event handler that keeps the store's copy of `kind` current."""

    async def feed(event: kopf.RawEvent, **_: Any) -> None:
        obj: dict[str, Any] = dict(event["object"])
        obj.setdefault("apiVersion", api_version)
        obj.setdefault("kind", kind)
        _state.store.event(event.get("type"), obj)

    return feed


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
# The store's feeders first: kopf runs an object's handlers in order, and `pool_changed` waits
# out the coalescing window.
for _api_version, _kind in CACHED_KINDS:
    _plural = PLURALS[(_api_version, _kind)]
    _labels = None if _kind == "LLMService" else {v1.LABEL_SERVICE: kopf.PRESENT}
    kopf.on.event(_api_version, _plural, labels=_labels, id=f"cache-{_plural}")(
        cache_feeder(_api_version, _kind)
    )
kopf.on.event(v1.GROUP, v1.VERSION, POOLS, when=replicas_changed)(pool_changed)
kopf.daemon(v1.GROUP, v1.VERSION, SERVICES, cancellation_timeout=10.0)(autoscale_loop)
