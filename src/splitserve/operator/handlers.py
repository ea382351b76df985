"""kopf handlers: thin, all ending in `reconcile.reconcile` for one service.

- `LLMService` create / update / resume, and a timer every `interval_s`: reconcile;
- `LLMService` delete: delete what it owns (garbage collection would too; this also covers API
  servers without it);
- `LLMPool` `spec.replicas` changes (`kubectl scale`, HPA): reconcile the owning service now
  rather than at the next tick, and again when the coalescing window closes;
- every kind the operator reads: watch events feed a `kube.Store`, so an idle reconcile reads
  from memory and sends no request (the watch streams are per namespace and kind, not per
  service).

State travels in kopf's `memo`, as kopf intends: `memo.operator` is the operator-wide
`Operator` (configuration, clients, store, Event recorder, coalescer, each service's lock and
back-off), put there by `kopf.operator(memo=memo(config))` or, where kopf's CLI starts the
operator (`kopf.testing.KopfRunner`), by the startup handler. kopf copies the memo per object
(shallowly, so `memo.operator` is shared) and keeps that copy for the object's lifetime: an
`LLMPool`'s last seen `spec.replicas` and a service's last unexpected error live there.
A service's lock and back-off are operator-wide because its pools' handlers reconcile it too.
`registry(config)` wires every handler; there is no module-level registration.

Reconciles of one service never overlap (a lock per service). A reconcile that fails on
something a retry cannot fix (an invalid spec; 400, 403, 422 from the API server) is reported
in status and as an Event by `reconcile`, logged here in one line, and retried with an
exponential back-off (up to `MAX_BACKOFF_S`) until the service changes.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import threading
import time
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any, Final

import kopf

from splitserve.api import v1alpha1 as v1
from splitserve.core.errors import ConfigError
from splitserve.operator import certs
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
Memo = MutableMapping[str, Any]
"""kopf's memo (`kopf.Memo`, a dict with attribute access), read here by key."""

SERVICES = "llmservices"
POOLS = "llmpools"
SERVICE_KIND: Final = (v1.API_VERSION, "LLMService")
POOL_KIND: Final = (v1.API_VERSION, "LLMPool")
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
    internal_tls_namespace: str | None = None
    """Issue internal TLS certificates from the CA Secret in this namespace (`operator.certs`;
    the operator's own namespace); None: internal RPCs stay plaintext."""
    cert_manager_issuer: certs.IssuerRef | None = None
    """With `internal_tls_namespace`: render cert-manager Certificates from this issuer instead
    of issuing from the operator's CA (the operator's own identity is then `--tls-dir`'s)."""


@dataclass
class _Failure:
    message: str
    attempts: int
    retry_at: float
    """`time.monotonic()` before which the timer does not try again."""
    reason: str = "Unexpected"
    """One CamelCase word (`KubeError.reason`, `InvalidSpec`): the error metric's label."""


@dataclass
class ServiceState:
    """What every handler of one service shares: its pools' handlers reconcile it too."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    failure: _Failure | None = None


class Operator:
    """The operator-wide state, `memo.operator` in every handler."""

    def __init__(self, config: OperatorConfig) -> None:
        self.config = config
        self.store = Store(CACHED_KINDS, _ours)
        self.events = Recorder()
        self.coalescer = rc.Coalescer(config.settings.coalesce_s)
        self._kube: Kube | None = None
        self._pki: certs.Issuer | None = None
        self._services: dict[tuple[str, str], ServiceState] = {}
        self._guard = threading.Lock()

    def kube(self) -> Kube:
        with self._guard:
            if self._kube is None:
                factory = self.config.kube_factory
                if factory is not None:
                    self._kube = factory()
                else:
                    import kubernetes

                    cfg = load_configuration(self.config.kubeconfig)
                    rest = RestKube(kubernetes.client.ApiClient(cfg), control.observe_api)
                    self._kube = CachedKube(rest, self.store) if self.config.cache else rest
            return self._kube

    def pki(self) -> certs.Issuer | None:
        """The internal CA and the operator's identity (loaded or created on first use, then
        `security.tls` is configured with it), or cert-manager (checked to be installed); None
        when internal TLS is off.

        Raises:
            CertManagerMissingError: cert-manager mode without cert-manager's CRDs.
        """
        namespace = self.config.internal_tls_namespace
        if namespace is None:
            return None
        kube = self.kube()
        with self._guard:
            issuer = self.config.cert_manager_issuer
            if self._pki is None and issuer is not None:
                self._pki = certs.CertManagerIssuer.start(kube, namespace, issuer)
            if self._pki is None:
                import datetime
                import tempfile
                from pathlib import Path

                from splitserve.security import tls

                directory = Path(tempfile.mkdtemp(prefix="splitserve-operator-tls-"))
                now = datetime.datetime.now(datetime.UTC)
                self._pki = certs.Pki.load_or_create(kube, namespace, directory, now)
                tls.configure(directory)
            return self._pki

    def workers(self) -> WorkerClient:
        if self.config.workers is None:
            self.config.workers = GrpcWorkerClient()
        return self.config.workers

    def service(self, namespace: str, name: str) -> ServiceState:
        with self._guard:
            return self._services.setdefault((namespace, name), ServiceState())

    def forget(self, namespace: str, name: str) -> None:
        """A deleted service: its lock, back-off, coalescing window, the Events it remembers,
        and the control loop's state and metric series."""
        with self._guard:
            self._services.pop((namespace, name), None)
        self.coalescer.forget((namespace, name))
        self.events.forget(namespace, name)
        control.forget(namespace, name)


def memo(config: OperatorConfig) -> kopf.Memo:
    """The memo to start kopf with (`kopf.operator(memo=...)`)."""
    return kopf.Memo(operator=Operator(config))


def _operator(memo: Memo) -> Operator:
    op = memo.get("operator")
    if not isinstance(op, Operator):
        raise RuntimeError("kopf's memo has no splitserve Operator: start kopf with `registry()`")
    return op


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _failed(
    op: Operator,
    state: ServiceState,
    message: str,
    permanent: bool,
    logger: Logger,
    reason: str = "Unexpected",
) -> None:
    """Remember a failure; log it once per distinct message, without a traceback."""
    old = state.failure
    attempts = old.attempts + 1 if old is not None and old.message == message else 1
    interval = max(op.config.interval_s, 1.0)
    delay = min(interval * 2**attempts, MAX_BACKOFF_S) if permanent else interval
    state.failure = _Failure(message, attempts, time.monotonic() + delay, reason)
    if attempts == 1:
        kind = "permanent" if permanent else "temporary"
        retry = (
            f"retrying in {delay:.0f}s, backing off to {MAX_BACKOFF_S:.0f}s" if permanent else ""
        )
        logger.warning("reconcile failed (%s%s): %s", kind, f"; {retry}" if retry else "", message)
    else:
        logger.debug("reconcile failed again (attempt %d): %s", attempts, message)


def _reconcile(
    op: Operator,
    namespace: str | None,
    name: str,
    logger: Logger,
    *,
    force: bool = True,
    resource: str = "LLMService",
) -> rc.Outcome | None:
    """One reconcile; None when skipped (backing off). `force`: ignore the back-off (the
    service or one of its pools changed). `resource`: the kind whose handler asked (metrics).

    Raises `kopf.TemporaryError` for what a retry may fix; permanent failures are reported
    (status, Event, one log line) and not raised: the back-off retries them.
    """
    if namespace is None:
        raise kopf.PermanentError("splitserve objects are namespaced")
    state = op.service(namespace, name)
    failure = state.failure
    metrics = control.metrics()
    if failure is not None and not force and time.monotonic() < failure.retry_at:
        metrics.reconciles.labels(resource, "backoff").inc()
        return None
    started = time.monotonic()
    result, reason = "error", "Unexpected"
    try:
        outcome = _reconcile_locked(op, state, namespace, name, logger)
        if outcome is not None:
            result = "success"
        else:
            reason = state.failure.reason if state.failure is not None else reason
        return outcome
    except kopf.TemporaryError:
        reason = state.failure.reason if state.failure is not None else reason
        raise
    finally:
        metrics.reconcile_duration.labels(resource).observe(time.monotonic() - started)
        metrics.reconciles.labels(resource, result).inc()
        if result == "error":
            metrics.reconcile_errors.labels(resource, reason).inc()


def _reconcile_locked(
    op: Operator, state: ServiceState, namespace: str, name: str, logger: Logger
) -> rc.Outcome | None:
    with state.lock:
        try:
            outcome = rc.reconcile(
                op.kube(),
                op.workers(),
                namespace,
                name,
                op.config.settings,
                _now(),
                events=op.events,
                coalescer=op.coalescer,
                pki=op.pki(),
            )
        except ConfigError as err:
            _failed(op, state, str(err), True, logger, "InvalidSpec")
            return None
        except KubeError as err:
            _failed(op, state, str(err), err.permanent, logger, err.reason)
            if err.permanent:
                return None
            raise kopf.TemporaryError(str(err), delay=2) from err
    if state.failure is not None:
        state.failure = None
        logger.info("reconcile succeeded again")
    for action in outcome.actions:
        logger.info(action)
    return outcome


class _QuietTimer(logging.Filter):
    """Drops kopf's "Timer 'tick' succeeded." (INFO, every tick of every service)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != "Timer 'tick' succeeded."


# How often kopf re-checks a timer or daemon that did not stop at once when its service was
# deleted. The finalizer (so `kubectl delete llmservice`) waits on that check; kopf's default
# is 60 s, and a `tick` caught mid-run (it runs in a thread) always misses the instant exit.
CANCELLATION_POLLING_S = 1.0


def configure(settings: kopf.OperatorSettings) -> None:
    """The kopf settings the operator runs with (set at startup)."""
    settings.persistence.finalizer = f"{v1.GROUP}/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=v1.GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=v1.GROUP, key="last-handled-configuration"
    )
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 300
    settings.networking.request_timeout = 60
    settings.background.cancellation_polling = CANCELLATION_POLLING_S


# Seconds between tries of a failed start-up (no kubeconfig, API server unreachable, RBAC):
# kopf retries the start-up handler after this back-off, for ever; `/healthz` says so meanwhile.
STARTUP_RETRY_S: Final = 60.0


def startup(settings: kopf.OperatorSettings, memo: Memo, logger: Logger, **_: Any) -> None:
    """Configure kopf, build the clients and the PKI. Each outcome is recorded for `/healthz`
    (`control.startup()`): a failure with its error and the next try, or success."""
    try:
        _startup(settings, memo, logger)
    except kopf.PermanentError as err:
        control.startup().failed(err, None)
        raise
    except Exception as err:
        control.startup().failed(err, STARTUP_RETRY_S)
        raise
    control.startup().succeeded()


def _startup(settings: kopf.OperatorSettings, memo: Memo, logger: Logger) -> None:
    objects = logging.getLogger("kopf.objects")
    if not any(isinstance(f, _QuietTimer) for f in objects.filters):
        objects.addFilter(_QuietTimer())
    configure(settings)
    op = _operator(memo)
    op.kube()
    try:
        op.pki()
    except certs.CertManagerMissingError as err:
        raise kopf.PermanentError(str(err)) from err
    logger.info("splitserve operator started (reconcile every %.1fs)", op.config.interval_s)


def login(settings: kopf.OperatorSettings, memo: Memo, **_: Any) -> kopf.ConnectionInfo:
    """kopf's credentials from the same configuration as the operator's own client:
    `--kubeconfig` when given, else in-cluster (the ServiceAccount), else the default kubeconfig.
    One identity for every call the operator makes."""
    kubeconfig = _operator(memo).config.kubeconfig
    return connection_info(load_configuration(kubeconfig), settings)


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


def reconcile_service(
    name: str, namespace: str | None, memo: Memo, logger: Logger, **_: Any
) -> None:
    _reconcile(_operator(memo), namespace, name, logger)


def tick(name: str, namespace: str | None, memo: Memo, logger: Logger, **_: Any) -> None:
    """The timer: one reconcile every `interval_s` (flips, pod readiness), unless backing off.

    Failures never reach kopf (its retries would bypass the back-off): `_reconcile` logs what
    it knows; anything else is a bug, logged with its traceback once per distinct message (the
    service's memo remembers the last one), then in one line per repeat.
    """
    try:
        _reconcile(_operator(memo), namespace, name, logger, force=False)
    except kopf.TemporaryError:
        pass  # logged once by _failed; the next tick retries
    except Exception as err:
        if str(err) != memo.get("last_unexpected"):
            logger.exception("reconcile failed; retrying at the next tick")
        else:
            logger.warning("reconcile failed again: %s", err)
        memo["last_unexpected"] = str(err)
    else:
        memo.pop("last_unexpected", None)


async def autoscale_loop(
    name: str,
    namespace: str | None,
    stopped: kopf.DaemonStopped,
    memo: Memo,
    logger: Logger,
    **_: Any,
) -> None:
    """The closed control loop (`operator.control`), every `scaling.intervalSeconds` (a daemon,
    not a timer: the interval is the service's own and changes with its spec).

    Asynchronous on purpose: a synchronous daemon holds one of kopf's executor threads for the
    service's lifetime, and with more services than threads (a handful) the other services'
    handlers never run. Here only each tick takes a thread, briefly.
    """
    if namespace is None:
        return
    op = _operator(memo)
    interval = 1.0  # the first tick soon: it takes the first snapshot
    while not stopped:
        await stopped.wait(interval)
        if stopped:
            return
        interval = await asyncio.to_thread(_control_tick, op, namespace, name, logger)


def _control_tick(op: Operator, namespace: str, name: str, logger: Logger) -> float:
    """One tick of the control loop; the seconds until the next."""
    try:
        with op.service(namespace, name).lock:
            result = control.controller(op.kube).tick(namespace, name)
    except Exception:
        logger.exception("control loop tick failed; retrying")
        return 5.0
    for line in result.wrote:
        logger.info("control loop: %s", line)
    return result.interval_s


def delete_service(
    name: str, namespace: str | None, uid: str, memo: Memo, logger: Logger, **_: Any
) -> None:
    if namespace is None:
        return
    op = _operator(memo)
    ref = ServiceRef(name, namespace, uid)
    with op.service(namespace, name).lock:
        actions = rc.delete_owned(op.kube(), ref)
        if op.config.internal_tls_namespace is not None and op.config.cert_manager_issuer:
            actions += certs.delete_cert_manager_secrets(op.kube(), ref)
        for action in actions:
            logger.info(action)
    op.forget(namespace, name)


def replicas_changed(event: kopf.RawEvent, body: kopf.Body, memo: Memo, **_: Any) -> bool:
    """Whether an `LLMPool` event changed `spec.replicas` since the last one seen.

    The pool's memo keeps the last value seen. The first sighting of a pool only records it
    (its service's own reconcile covers it); status writes, which are most of the events, do
    not pass.
    """
    if event.get("type") == "DELETED":
        return False
    replicas = (body.get("spec") or {}).get("replicas")
    seen = "replicas" in memo
    previous = memo.get("replicas")
    memo["replicas"] = replicas
    return seen and previous != replicas and bool((body.get("spec") or {}).get("service"))


def pool_changed(
    body: kopf.Body, namespace: str | None, memo: Memo, logger: Logger, **_: Any
) -> None:
    """`kubectl scale llmpool/...` or an HPA: act now instead of at the next tick, and again
    when the coalescing window closes (two `kubectl scale` in a row become one flip)."""
    op = _operator(memo)
    service = str(body["spec"]["service"])
    logger.info("replicas -> %s: reconciling %s", body["spec"].get("replicas"), service)
    try:
        for _round in range(MAX_SETTLE_ROUNDS):
            outcome = _reconcile(op, namespace, service, logger, resource="LLMPool")
            if outcome is None or outcome.settle_s <= 0:
                return
            time.sleep(outcome.settle_s + 0.05)
    except kopf.TemporaryError:
        pass  # logged once; the timer retries


NOT_MANAGED: Final = "NotManaged"


def unowned_pool(event: kopf.RawEvent, body: kopf.Body, **_: Any) -> bool:
    """`when` of `stray_pool`: an `LLMPool` no `LLMService` controls (the operator sets its
    controller reference on every pool it makes)."""
    if event.get("type") == "DELETED":
        return False
    refs = (body.get("metadata") or {}).get("ownerReferences") or []
    return not any(r.get("kind") == "LLMService" and r.get("controller") for r in refs)


def stray_pool(
    body: kopf.Body, namespace: str | None, memo: Memo, logger: Logger, **_: Any
) -> None:
    """An `LLMPool` made by hand is never read: the operator creates each service's pools
    itself. Say so on it (`Ready=False`, reason `NotManaged`) and with a Warning Event, once;
    a pool named `<service>-<role>` of a role the service has is left alone, since the
    service's reconcile adopts it (applied before its LLMService)."""
    if namespace is None:
        return
    op = _operator(memo)
    obj: dict[str, Any] = {"apiVersion": v1.API_VERSION, "kind": "LLMPool", **dict(body)}
    name = str(obj["metadata"]["name"])
    spec = obj.get("spec") or {}
    service, role = str(spec.get("service", "")), str(spec.get("role", ""))
    conditions = (obj.get("status") or {}).get("conditions") or []
    if any(c.get("reason") == NOT_MANAGED for c in conditions):
        return
    kube = op.kube()
    owner = kube.get(*SERVICE_KIND, namespace, service) if service else None
    pools = ((owner or {}).get("spec") or {}).get("pools") or {}
    if owner is not None and name == f"{service}-{role}" and role in pools:
        return
    message = (
        f"LLMPool {name} is not one the operator made: it creates each LLMService's pools "
        "itself (`<service>-<role>`, one per role in spec.pools, owned by the service) and "
        "reads only those, so this pool's spec.replicas sizes nothing. Delete it; for a "
        f"{role or '<role>'} pool, set spec.pools.{role or '<role>'} on LLMService "
        f"{service or '<service>'} and scale llmpool/{service or '<service>'}-{role or '<role>'}"
    )
    condition = {"type": "Ready", "status": "False", "reason": NOT_MANAGED, "message": message}
    try:
        kube.patch(*POOL_KIND, namespace, name, {"status": {"conditions": [condition]}}, "status")
    except KubeError as err:
        logger.warning("LLMPool %s: cannot say it is not managed: %s", name, err)
        return
    op.events.post(kube, obj, "Warning", NOT_MANAGED, message, _now())
    logger.warning(message)


def cache_feeder(api_version: str, kind: str) -> Callable[..., Any]:
    """A watch-event handler that keeps the store's copy of `kind` current."""

    async def feed(event: kopf.RawEvent, memo: Memo, **_: Any) -> None:
        obj: dict[str, Any] = dict(event["object"])
        obj.setdefault("apiVersion", api_version)
        obj.setdefault("kind", kind)
        _operator(memo).store.event(event.get("type"), obj)

    return feed


def registry(config: OperatorConfig) -> kopf.OperatorRegistry:
    """Every handler, registered in a registry of their own (`kopf.operator(registry=...)`,
    `KopfRunner(..., registry=...)`); the timer's interval is `config.interval_s`."""
    reg = kopf.OperatorRegistry()

    def start(settings: kopf.OperatorSettings, memo: Memo, logger: Logger, **_: Any) -> None:
        memo.setdefault("operator", Operator(config))  # kopf's CLI passes no memo
        startup(settings, memo, logger)

    kopf.on.startup(id="startup", backoff=STARTUP_RETRY_S, registry=reg)(start)
    kopf.on.login(id="login", registry=reg)(login)
    service = (v1.GROUP, v1.VERSION, SERVICES)
    kopf.on.resume(*service, registry=reg)(reconcile_service)
    kopf.on.create(*service, registry=reg)(reconcile_service)
    kopf.on.update(*service, registry=reg)(reconcile_service)
    kopf.on.delete(*service, registry=reg)(delete_service)
    kopf.timer(
        *service,
        interval=config.interval_s,
        initial_delay=config.interval_s,
        registry=reg,
    )(tick)
    # The store's feeders first: kopf runs an object's handlers in order, and `pool_changed`
    # waits out the coalescing window.
    for api_version, kind in CACHED_KINDS:
        plural = PLURALS[(api_version, kind)]
        labels = None if kind == "LLMService" else {v1.LABEL_SERVICE: kopf.PRESENT}
        kopf.on.event(api_version, plural, labels=labels, id=f"cache-{plural}", registry=reg)(
            cache_feeder(api_version, kind)
        )
    kopf.on.event(v1.GROUP, v1.VERSION, POOLS, when=replicas_changed, registry=reg)(pool_changed)
    kopf.on.event(v1.GROUP, v1.VERSION, POOLS, when=unowned_pool, registry=reg)(stray_pool)
    kopf.daemon(*service, cancellation_timeout=10.0, registry=reg)(autoscale_loop)
    return reg
