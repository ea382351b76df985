"""kopf handlers called directly with fake kwargs, over the in-memory API server."""

from __future__ import annotations

import copy
import logging
from typing import Any

import kopf
import pytest
from kopf._core.intents.handlers import TimerHandler

from splitserve.api import v1alpha1 as v1
from splitserve.operator import handlers, reconcile
from splitserve.operator.kube import PLURALS, KubeError
from tests.fakes.kube import FakeWorkers, MemoryKube, worker_pod

NS = "default"
LOG = logging.getLogger("test")


@pytest.fixture
def memo() -> kopf.Memo:
    return handlers.memo(handlers.OperatorConfig(workers=FakeWorkers(), interval_s=0))


@pytest.fixture
def kube(memo: kopf.Memo) -> MemoryKube:
    memory = MemoryKube()
    memo["operator"].config.kube_factory = lambda: memory
    return memory


def object_memo(memo: kopf.Memo) -> kopf.Memo:
    """What kopf gives each object's handlers: a shallow copy of the operator's memo."""
    return copy.copy(memo)


def create_service(kube: MemoryKube, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": {"name": "m", "source": "org/m"},
        "engine": {"kind": "sim", "image": "img:1"},
        "workerGroups": [{"name": "w", "roles": ["prefill", "decode"]}],
        "pools": {"prefill": {"replicas": 1}, "decode": {"replicas": 1}},
        "scaling": {"mode": "External"},
    }
    body.update(spec)
    return kube.create(
        {
            "apiVersion": v1.API_VERSION,
            "kind": "LLMService",
            "metadata": {"name": "tiny", "namespace": NS},
            "spec": body,
        }
    )


def test_reconcile_handler_creates_children(kube: MemoryKube, memo: kopf.Memo) -> None:
    create_service(kube)
    handlers.reconcile_service(name="tiny", namespace=NS, memo=memo, logger=LOG)
    assert kube.get("apps/v1", "Deployment", NS, "tiny-w") is not None
    assert kube.get(v1.API_VERSION, "LLMPool", NS, "tiny-decode") is not None


def test_invalid_spec_is_reported_and_backed_off(
    kube: MemoryKube, memo: kopf.Memo, caplog: pytest.LogCaptureFixture
) -> None:
    create_service(kube, pools={"mixed": {"replicas": 1}})
    with caplog.at_level(logging.DEBUG, logger="test"):
        handlers.reconcile_service(name="tiny", namespace=NS, memo=memo, logger=LOG)
    svc = kube.get(v1.API_VERSION, "LLMService", NS, "tiny")
    assert svc is not None
    ready = svc["status"]["conditions"][0]
    assert (ready["type"], ready["status"], ready["reason"]) == ("Ready", "False", "InvalidSpec")
    assert "spec.pools.mixed" in ready["message"]
    assert "errors.pydantic.dev" not in ready["message"]
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1
    assert warnings[0].exc_info is None  # one line, no traceback
    # The daemon's next ticks are inside the back-off: no request, no log line.
    writes = len(kube.writes)
    service_memo = object_memo(memo)
    for _ in range(3):
        handlers.tick(name="tiny", namespace=NS, memo=service_memo, logger=LOG)
    assert len(kube.writes) == writes
    assert len([r for r in caplog.records if r.levelno >= logging.WARNING]) == 1
    events = [o for k, o in kube.objects.items() if k[1] == "Event"]
    assert [(e["type"], e["reason"]) for e in events] == [("Warning", "InvalidSpec")]
    assert events[0]["involvedObject"]["name"] == "tiny"


def test_sim_service_with_engine_args_is_refused_naming_the_field(
    kube: MemoryKube, memo: kopf.Memo
) -> None:
    """Its workers would refuse the arguments (they were passed after `--` and ignored): the
    service reports InvalidSpec naming the field, and no worker Deployment is written."""
    create_service(kube, engine={"kind": "sim", "image": "img:1", "args": ["--enforce-eager"]})
    handlers.reconcile_service(name="tiny", namespace=NS, memo=memo, logger=LOG)
    svc = kube.get(v1.API_VERSION, "LLMService", NS, "tiny")
    assert svc is not None
    ready = svc["status"]["conditions"][0]
    assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec")
    assert "spec.engine.args: engine arguments apply to engine.kind vllm only" in ready["message"]
    assert kube.get("apps/v1", "Deployment", NS, "tiny-w") is None
    events = [o for k, o in kube.objects.items() if k[1] == "Event"]
    assert [e["reason"] for e in events] == ["InvalidSpec"]
    assert "spec.engine.args" in events[0]["message"]


def test_forbidden_is_permanent_reported_with_object_and_field(
    kube: MemoryKube, memo: kopf.Memo, monkeypatch: pytest.MonkeyPatch
) -> None:
    create_service(kube)
    real_create = kube.create

    def forbid_deployments(obj: dict[str, Any]) -> dict[str, Any]:
        if obj["kind"] == "Deployment":
            raise KubeError(403, 'deployments.apps is forbidden: User "sa" cannot create')
        return real_create(obj)

    monkeypatch.setattr(kube, "create", forbid_deployments)
    handlers.reconcile_service(name="tiny", namespace=NS, memo=memo, logger=LOG)  # does not raise
    svc = kube.get(v1.API_VERSION, "LLMService", NS, "tiny")
    assert svc is not None
    conds = {c["type"]: c for c in svc["status"]["conditions"]}
    assert conds["Ready"]["status"] == "False"
    assert conds["Ready"]["reason"] == "Forbidden"
    assert conds["Degraded"]["status"] == "True"
    message = conds["Ready"]["message"]
    assert message.startswith("create Deployment tiny-w (from spec.workerGroups[w]): 403 ")
    assert memo["operator"].service(NS, "tiny").failure is not None


def test_conflicts_are_temporary(
    kube: MemoryKube, memo: kopf.Memo, monkeypatch: pytest.MonkeyPatch
) -> None:
    create_service(kube)

    def conflict(*args: Any, **kwargs: Any) -> Any:
        raise KubeError(409, "conflict")

    monkeypatch.setattr(kube, "create", conflict)
    with pytest.raises(kopf.TemporaryError):
        handlers.reconcile_service(name="tiny", namespace=NS, memo=memo, logger=LOG)


def test_delete_handler_removes_owned_objects(kube: MemoryKube, memo: kopf.Memo) -> None:
    svc = create_service(kube)
    handlers.reconcile_service(name="tiny", namespace=NS, memo=memo, logger=LOG)
    handlers.delete_service(
        name="tiny", namespace=NS, uid=svc["metadata"]["uid"], memo=memo, logger=LOG
    )
    assert [k for k in kube.objects if k[1] not in ("LLMService", "Event")] == []


def test_delete_handler_drops_the_control_loops_state(
    kube: MemoryKube, memo: kopf.Memo, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kopf stops the service's daemon on deletion before its loop can see the service gone:
    the delete handler tells the loop, or `/healthz` keeps judging the dead service's last
    tick (STALLED, 503 after three intervals) and its gauges stay exported."""
    from splitserve.operator.control import runtime

    monkeypatch.setattr(runtime, "_rt", runtime._Runtime())  # a fresh one, restored after
    svc = create_service(kube)
    handlers.reconcile_service(name="tiny", namespace=NS, memo=memo, logger=LOG)
    controller = runtime.controller(lambda: kube)
    controller.tick(NS, "tiny")
    assert f"{NS}/tiny" in controller.last_ticks()
    handlers.delete_service(
        name="tiny", namespace=NS, uid=svc["metadata"]["uid"], memo=memo, logger=LOG
    )
    assert controller.last_ticks() == {}


def test_delete_handler_forgets_the_services_events(kube: MemoryKube, memo: kopf.Memo) -> None:
    """The Event recorder remembers each distinct Event it posted (to bump its count); a
    deleted service's are dropped, or an operator that lives through many services (and many
    pods, whose names Events carry) keeps them all."""
    svc = create_service(kube)
    body = {k: v for k, v in svc.items() if k in ("apiVersion", "kind", "spec")}
    other = kube.create({**body, "metadata": {"name": "other", "namespace": NS}})
    handlers.reconcile_service(name="tiny", namespace=NS, memo=memo, logger=LOG)
    handlers.reconcile_service(name="other", namespace=NS, memo=memo, logger=LOG)
    recorder = memo["operator"].events
    both = recorder.remembered()
    assert both > 0
    handlers.delete_service(
        name="tiny", namespace=NS, uid=svc["metadata"]["uid"], memo=memo, logger=LOG
    )
    assert 0 < recorder.remembered() < both
    handlers.delete_service(
        name="other", namespace=NS, uid=other["metadata"]["uid"], memo=memo, logger=LOG
    )
    assert recorder.remembered() == 0


def test_pool_event_reconciles_on_replica_change_only(kube: MemoryKube, memo: kopf.Memo) -> None:
    create_service(kube)
    handlers.reconcile_service(name="tiny", namespace=NS, memo=memo, logger=LOG)
    for i in range(3):
        kube.create(worker_pod("tiny", "w", f"p{i}", ip=f"10.0.0.{i + 1}"))
    pool = kube.get(v1.API_VERSION, "LLMPool", NS, "tiny-decode")
    assert pool is not None

    pool_memo = object_memo(memo)

    def event(body: dict[str, Any]) -> None:
        kwargs: dict[str, Any] = {
            "event": {"type": "MODIFIED", "object": body},
            "body": kopf.Body(body),  # type: ignore[arg-type]
            "namespace": NS,
            "memo": pool_memo,
        }
        if handlers.replicas_changed(**kwargs):
            handlers.pool_changed(body=kwargs["body"], namespace=NS, memo=pool_memo, logger=LOG)

    event(pool)  # first sighting: remembered, nothing done
    dep = kube.get("apps/v1", "Deployment", NS, "tiny-w")
    assert dep is not None
    assert dep["spec"]["replicas"] == 2
    pool = kube.patch(v1.API_VERSION, "LLMPool", NS, "tiny-decode", {"spec": {"replicas": 2}})
    event(pool)
    dep = kube.get("apps/v1", "Deployment", NS, "tiny-w")
    assert dep is not None
    assert dep["spec"]["replicas"] == 3
    event(pool)  # a status-only event: nothing to do
    # External mode: the operator never wrote the pool's replicas back.
    pool = kube.get(v1.API_VERSION, "LLMPool", NS, "tiny-decode")
    assert pool is not None
    assert pool["spec"]["replicas"] == 2


def test_timer_reconciles(kube: MemoryKube, memo: kopf.Memo) -> None:
    create_service(kube)
    handlers.tick(name="tiny", namespace=NS, memo=object_memo(memo), logger=LOG)
    assert kube.get("apps/v1", "Deployment", NS, "tiny-router") is not None


def test_timer_survives_errors(kube: MemoryKube, memo: kopf.Memo) -> None:
    create_service(kube, pools={"mixed": {"replicas": 1}})
    for _ in range(2):
        handlers.tick(name="tiny", namespace=NS, memo=object_memo(memo), logger=LOG)


def test_timer_logs_a_bug_with_its_traceback_once(
    kube: MemoryKube,
    memo: kopf.Memo,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    create_service(kube)

    def bug(*args: Any, **kwargs: Any) -> Any:
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(reconcile, "reconcile", bug)
    service_memo = object_memo(memo)
    with caplog.at_level(logging.DEBUG, logger="test"):
        for _ in range(3):
            handlers.tick(name="tiny", namespace=NS, memo=service_memo, logger=LOG)
    tracebacks = [r for r in caplog.records if r.exc_info is not None]
    assert len(tracebacks) == 1
    assert service_memo["last_unexpected"] == "a bug"
    assert "last_unexpected" not in memo  # the object's own memo, not the operator's


def test_registry_wires_every_handler_and_the_timer_interval() -> None:
    reg = handlers.registry(handlers.OperatorConfig(interval_s=7))
    timers = [h for h in reg._spawning.get_all_handlers() if h.id == "tick"]
    assert [(t.interval, t.initial_delay) for t in timers if isinstance(t, TimerHandler)] == [
        (7, 7)
    ]
    ids = {h.id for h in reg._watching.get_all_handlers()}
    assert {f"cache-{PLURALS[k]}" for k in handlers.CACHED_KINDS} <= ids


def test_login_uses_the_kubeconfig_flag_not_the_environment(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    def kubeconfig(name: str, server: str, token: str) -> str:
        path = tmp_path / name
        path.write_text(
            "apiVersion: v1\nkind: Config\n"
            f"clusters: [{{name: c, cluster: {{server: '{server}'}}}}]\n"
            f"users: [{{name: u, user: {{token: {token}}}}}]\n"
            "contexts: [{name: x, context: {cluster: c, user: u}}]\n"
            "current-context: x\n"
        )
        return str(path)

    monkeypatch.setenv("KUBECONFIG", kubeconfig("admin", "https://admin:6443", "admin-token"))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "")  # not in a pod
    flag = kubeconfig("sa", "https://sa:6443", "sa-token")
    memo = handlers.memo(handlers.OperatorConfig(kubeconfig=flag))
    info = handlers.login(settings=kopf.OperatorSettings(), memo=memo)
    assert (info.server, info.scheme, info.token) == ("https://sa:6443", "Bearer", "sa-token")


async def test_autoscale_daemon_holds_no_thread_between_ticks(
    memo: kopf.Memo, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control loop's daemon is async: between ticks it holds none of kopf's executor
    threads (a synchronous daemon per service starves every other handler once services
    outnumber the threads)."""
    import asyncio
    import contextlib
    import threading

    from splitserve.operator.control import runtime
    from splitserve.operator.control.loop import TickResult

    ticks: list[str] = []

    class Controller:
        def tick(self, namespace: str, name: str) -> TickResult:
            ticks.append(threading.current_thread().name)
            return TickResult(interval_s=0.01, wrote=["status"])

    class Stopped:  # kopf's DaemonStopped, as an async daemon uses it
        def __init__(self) -> None:
            self.event = asyncio.Event()

        def __bool__(self) -> bool:
            return self.event.is_set()

        async def wait(self, seconds: float) -> None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.event.wait(), seconds)

    monkeypatch.setattr(runtime, "controller", lambda kube: Controller())
    stopped = Stopped()
    daemon = asyncio.create_task(
        handlers.autoscale_loop(
            name="tiny",
            namespace=NS,
            stopped=stopped,  # type: ignore[arg-type]
            memo=object_memo(memo),
            logger=LOG,
        )
    )
    while len(ticks) < 3:  # noqa: ASYNC110 (the ticks run in other threads)
        await asyncio.sleep(0.05)
    assert all(t != threading.current_thread().name for t in ticks)  # ticks run in threads
    stopped.event.set()
    await asyncio.wait_for(daemon, 5)


def test_deleted_services_timers_are_rechecked_every_second_not_every_minute() -> None:
    # A `tick` caught mid-run when its service is deleted does not stop at once; kopf then
    # holds the finalizer until its next check, 60 s by default (an integration test waiting
    # 45 s for "service gone" failed on it under load).
    settings = kopf.OperatorSettings()
    assert settings.background.cancellation_polling == 60
    handlers.configure(settings)
    assert settings.background.cancellation_polling == handlers.CANCELLATION_POLLING_S == 1.0
    assert settings.persistence.finalizer == f"{v1.GROUP}/finalizer"


def test_start_up_failure_and_success_reach_healthz(monkeypatch: pytest.MonkeyPatch) -> None:
    """The start-up handler records each outcome for `/healthz`: a failing start-up (here no
    kubeconfig) is 503 with its error and kopf's retry back-off, a later success is healthy."""
    from splitserve.core.errors import ConfigError
    from splitserve.operator.control import runtime

    monkeypatch.setattr(runtime, "_rt", runtime._Runtime())  # a fresh one, restored after
    runtime.startup().begin()
    memo = handlers.memo(handlers.OperatorConfig(workers=FakeWorkers(), interval_s=0))
    broken = True

    def factory() -> MemoryKube:
        if broken:
            raise ConfigError("Invalid kube-config file. No configuration found.")
        return MemoryKube()

    memo["operator"].config.kube_factory = factory
    with pytest.raises(ConfigError):
        handlers.startup(settings=kopf.OperatorSettings(), memo=memo, logger=LOG)
    verdict = runtime.startup().verdict()
    assert verdict is not None
    assert not verdict[0]
    assert verdict[1].startswith("start-up failing: Invalid kube-config file.")
    assert verdict[1].endswith(f"retrying in {handlers.STARTUP_RETRY_S:.0f} s")
    broken = False
    handlers.startup(settings=kopf.OperatorSettings(), memo=memo, logger=LOG)
    assert runtime.startup().verdict() is None


def test_start_up_handler_retries_after_the_back_off_healthz_names() -> None:
    reg = handlers.registry(handlers.OperatorConfig(interval_s=7))
    [start] = [h for h in reg._activities.get_all_handlers() if h.id == "startup"]
    assert start.backoff == handlers.STARTUP_RETRY_S


def test_delete_handler_removes_the_secrets_cert_manager_wrote(kube: MemoryKube) -> None:
    """cert-manager writes each Certificate's Secret without an ownerReference (unless it runs
    with --enable-certificate-owner-ref, off by default), so the garbage collector would leave
    the service's keys behind: the delete handler deletes the Certificates, then their Secrets
    (in that order: cert-manager re-issues a Secret deleted under a live Certificate)."""
    from splitserve.operator import certs

    config = handlers.OperatorConfig(
        workers=FakeWorkers(),
        interval_s=0,
        internal_tls_namespace=NS,
        cert_manager_issuer=certs.IssuerRef("internal-ca"),
    )
    config.kube_factory = lambda: kube
    memo = handlers.memo(config)
    svc = create_service(kube)
    handlers.reconcile_service(name="tiny", namespace=NS, memo=memo, logger=LOG)
    for role in certs.SERVICE_ROLES:  # as cert-manager writes them
        kube.create(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "type": "kubernetes.io/tls",
                "metadata": {
                    "name": f"tiny-tls-{role}",
                    "namespace": NS,
                    "annotations": {"cert-manager.io/certificate-name": f"tiny-tls-{role}"},
                },
                "data": {"tls.crt": "", "tls.key": ""},
            }
        )
    kube.create(  # another service's, or the user's: left alone
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "other-tls-worker", "namespace": NS},
        }
    )
    kube.writes.clear()
    handlers.delete_service(
        name="tiny", namespace=NS, uid=svc["metadata"]["uid"], memo=memo, logger=LOG
    )
    left = [k for k in kube.objects if k[1] not in ("LLMService", "Event")]
    assert left == [("v1", "Secret", NS, "other-tls-worker")]
    deletes = [w for w in kube.writes if "tls-worker" in w]
    assert deletes == ["DELETE Certificate tiny-tls-worker", "DELETE Secret tiny-tls-worker"]


def _pool_event(kube: MemoryKube, memo: kopf.Memo, name: str) -> bool:
    """One watch event of LLMPool `name` through the unowned-pool handler; whether it ran."""
    body = kube.get(v1.API_VERSION, "LLMPool", NS, name)
    assert body is not None
    kwargs: dict[str, Any] = {
        "event": {"type": "ADDED", "object": body},
        "body": kopf.Body(body),  # type: ignore[arg-type]
        "namespace": NS,
        "memo": object_memo(memo),
        "logger": LOG,
    }
    if not handlers.unowned_pool(**kwargs):
        return False
    handlers.stray_pool(**kwargs)
    return True


def test_an_llmpool_made_by_hand_says_it_sizes_nothing(kube: MemoryKube, memo: kopf.Memo) -> None:
    """Found by the operator probe: `kubectl apply` of an LLMPool the operator did not make (a
    `mixed` pool the service has none of, a misnamed copy) was accepted and never read: no
    status, no condition, no Event, while its spec.replicas sized nothing."""
    create_service(kube)
    handlers.reconcile_service(name="tiny", namespace=NS, memo=memo, logger=LOG)
    for name, role in (("extra", "mixed"), ("tiny-decode2", "decode")):
        kube.create(
            {
                "apiVersion": v1.API_VERSION,
                "kind": "LLMPool",
                "metadata": {"name": name, "namespace": NS},
                "spec": {"service": "tiny", "role": role, "replicas": 4},
            }
        )
        assert _pool_event(kube, memo, name)
        pool = kube.get(v1.API_VERSION, "LLMPool", NS, name)
        assert pool is not None
        [cond] = pool["status"]["conditions"]
        assert (cond["type"], cond["status"], cond["reason"]) == ("Ready", "False", "NotManaged")
        assert f"LLMPool {name} is not one the operator made" in cond["message"]
        assert f"spec.pools.{role}" in cond["message"]
        warnings = [
            e
            for e in kube.list("v1", "Event", NS)
            if e["reason"] == "NotManaged" and e["involvedObject"]["name"] == name
        ]
        assert [e["type"] for e in warnings] == ["Warning"]
        assert _pool_event(kube, memo, name)  # said once: the next event writes nothing
        again = [
            e
            for e in kube.list("v1", "Event", NS)
            if e["reason"] == "NotManaged" and e["involvedObject"]["name"] == name
        ]
        assert [e["count"] for e in again] == [1]
    # The operator's own pools are not touched.
    assert not _pool_event(kube, memo, "tiny-decode")
    pool = kube.get(v1.API_VERSION, "LLMPool", NS, "tiny-decode")
    assert pool is not None
    assert all(c["reason"] != "NotManaged" for c in pool["status"].get("conditions", []))


def test_an_llmpool_made_before_its_service_is_left_to_be_adopted(
    kube: MemoryKube, memo: kopf.Memo
) -> None:
    """`<service>-<role>` of a pool the service has (applied before the LLMService, as a GitOps
    tool may): the service's reconcile adopts it; no NotManaged on it."""
    kube.create(
        {
            "apiVersion": v1.API_VERSION,
            "kind": "LLMPool",
            "metadata": {"name": "tiny-decode", "namespace": NS},
            "spec": {"service": "tiny", "role": "decode", "replicas": 1},
        }
    )
    create_service(kube)
    _pool_event(kube, memo, "tiny-decode")
    pool = kube.get(v1.API_VERSION, "LLMPool", NS, "tiny-decode")
    assert pool is not None
    assert "status" not in pool or not pool["status"].get("conditions")
    handlers.reconcile_service(name="tiny", namespace=NS, memo=memo, logger=LOG)
    pool = kube.get(v1.API_VERSION, "LLMPool", NS, "tiny-decode")
    assert pool is not None
    assert pool["metadata"]["ownerReferences"][0]["name"] == "tiny"
