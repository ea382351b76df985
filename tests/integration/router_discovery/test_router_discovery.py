"""`KubernetesDiscovery` against an API server: kmock by default, a real cluster with
`TARGET=real KUBECONFIG=...`.

The tests play the kubelet and the operator: they create worker pods, flip their role and fenced
labels, and delete them; the router's `PoolView` must follow. On kmock the pods' IPs are
127.0.0.x loopback addresses where fake workers listen on the discovery's one gRPC port, so the
pool also hears their load reports and placement can be checked end to end; on a real cluster the
pods run a pause image and only membership and fencing are checked.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from tests.fakes.fake_worker import FakeWorker, Script
from tests.fakes.ports import free_port_on_all
from tests.fakes.rbac import ApiCall, allowed, attributes

from splitserve.api import v1alpha1 as v1
from splitserve.api.router import DiscoverySettings, PoolSettings
from splitserve.core.clock import SystemClock
from splitserve.core.errors import NoEligibleEndpoint
from splitserve.core.ids import RequestId
from splitserve.core.roles import Role
from splitserve.policy.placement import RequestView
from splitserve.router.discovery import KubernetesDiscovery, KubernetesPodSource
from splitserve.router.dispatch import default_decider
from splitserve.router.pool_view import PoolView

pytestmark = [pytest.mark.k8s, pytest.mark.integration, pytest.mark.timeout(120)]

TARGET = os.environ.get("TARGET", "kmock")
NS = os.environ.get("TEST_NAMESPACE", "default")
IMAGE = os.environ.get("TEST_POD_IMAGE", "registry.k8s.io/pause:3.10")
FAST_POOL = PoolSettings(
    load_interval_s=0.05, stale_after_s=5.0, reconnect_min_s=0.01, reconnect_max_s=0.1
)
ROUTER_RBAC = [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]
"""The Role the operator renders for the router (operator/render.py `router_manifests`)."""


class Cluster:
    """Worker pods of one service, written through the `kubernetes` client."""

    def __init__(self, api_client: Any, service: str) -> None:
        from kubernetes import client

        self.api_client = api_client
        self.core = client.CoreV1Api(api_client)
        self.service = service
        self.names: list[str] = []

    def labels(self, role: Role, **extra: str) -> dict[str, str]:
        return {
            v1.LABEL_SERVICE: self.service,
            v1.LABEL_COMPONENT: "worker",
            v1.LABEL_GROUP: "main",
            v1.LABEL_ROLE: role.value,
            **extra,
        }

    async def create(
        self,
        name: str,
        role: Role,
        ip: str,
        *,
        service: str | None = None,
        replica_set: str | None = None,
    ) -> None:
        """`replica_set`: `<deployment>-<hash>`, set as the pod's controller (and the hash as its
        `pod-template-hash` label), as the ReplicaSet controller does."""
        labels = self.labels(role)
        if service is not None:
            labels[v1.LABEL_SERVICE] = service
        metadata: dict[str, Any] = {"name": name, "namespace": NS, "labels": labels}
        if replica_set is not None:
            labels["pod-template-hash"] = replica_set.rsplit("-", 1)[1]
            metadata["ownerReferences"] = [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": replica_set,
                    "uid": str(uuid.uuid4()),
                    "controller": True,
                }
            ]
        body: Any = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": metadata,
            "spec": {
                "containers": [{"name": "worker", "image": IMAGE}],
                "terminationGracePeriodSeconds": 0,
            },
        }
        if TARGET == "kmock":  # no kubelet: the pod starts out running, Ready, with its IP
            body["status"] = _status(ip, ready=True)
        await asyncio.to_thread(self.core.create_namespaced_pod, NS, body)
        self.names.append(name)

    async def patch(self, name: str, body: dict[str, Any]) -> None:
        await asyncio.to_thread(
            self.core.patch_namespaced_pod,
            name,
            NS,
            body,
            _content_type="application/merge-patch+json",
        )

    async def label(self, name: str, **labels: str) -> None:
        await self.patch(name, {"metadata": {"labels": labels}})

    async def set_ready(self, name: str, ready: bool, ip: str) -> None:
        """kmock only: a real kubelet owns the status."""
        await self.patch(name, {"status": _status(ip, ready=ready)})

    async def ip(self, name: str) -> str:
        pod = await asyncio.to_thread(self.core.read_namespaced_pod, name, NS)
        return str((pod.status.pod_ip if pod.status else None) or "")

    async def delete(self, name: str) -> None:
        from kubernetes.client.exceptions import ApiException

        with contextlib.suppress(ApiException):
            await asyncio.to_thread(
                self.core.delete_namespaced_pod, name, NS, grace_period_seconds=0
            )

    async def cleanup(self) -> None:
        for name in self.names:
            await self.delete(name)


def _status(ip: str, *, ready: bool) -> dict[str, Any]:
    return {
        "phase": "Running",
        "podIP": ip,
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
    }


class LoopbackWorker(FakeWorker):
    async def start_on(self, host: str, port: int) -> None:
        from grpc import aio

        from splitserve._gen.v1 import worker_pb2_grpc

        self._server = aio.server()
        worker_pb2_grpc.add_WorkerServicer_to_server(self, self._server)
        self._server.add_insecure_port(f"{host}:{port}")
        await self._server.start()
        self.address = f"{host}:{port}"


HOSTS = {"127.0.0.2": Role.PREFILL, "127.0.0.3": Role.DECODE, "127.0.0.4": Role.DECODE}


@pytest.fixture
async def workers() -> AsyncIterator[tuple[int, dict[str, LoopbackWorker]]]:
    """Fake workers on 127.0.0.2-4, one port (kmock only; a real cluster's pods run pause)."""
    port = free_port_on_all(list(HOSTS))
    started = {host: LoopbackWorker(Script(role=role)) for host, role in HOSTS.items()}
    if TARGET == "kmock":
        for host, worker in started.items():
            await worker.start_on(host, port)
    yield port, started
    for worker in started.values():
        await worker.stop()


@pytest.fixture
async def cluster(kubeconfig: str) -> AsyncIterator[Cluster]:
    import kubernetes

    api_client = kubernetes.config.new_client_from_config(config_file=kubeconfig)  # type: ignore[no-untyped-call]
    c = Cluster(api_client, f"svc-{uuid.uuid4().hex[:8]}")
    yield c
    await c.cleanup()


@contextlib.asynccontextmanager
async def router_pool(
    cluster: Cluster, port: int, owner_deployments: tuple[str, ...] = ()
) -> AsyncIterator[tuple[PoolView, KubernetesDiscovery]]:
    settings = DiscoverySettings(
        owner_deployments=owner_deployments,
        namespace=NS,
        selector=f"{v1.LABEL_SERVICE}={cluster.service},{v1.LABEL_COMPONENT}=worker",
        role_label=v1.LABEL_ROLE,
        fenced_label=v1.LABEL_FENCED,
        grpc_port=port,
        watch_timeout_s=30,
        backoff_min_s=0.05,
        backoff_max_s=0.5,
    )
    source = KubernetesPodSource(settings, cluster.api_client)
    async with PoolView([], clock=SystemClock(), settings=FAST_POOL) as pool:
        discovery = KubernetesDiscovery(pool, settings, source)
        await discovery.start()
        try:
            yield pool, discovery
        finally:
            await discovery.stop()


def _state(pool: PoolView) -> dict[str, bool]:
    """address -> fenced."""
    return {v.id: v.fenced for v in pool.views()}


async def _until(
    what: str, pool: PoolView, predicate: Callable[[PoolView], bool], timeout_s: float = 20
) -> None:
    try:
        await pool.wait_for(predicate, timeout_s)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}; pool: {_state(pool)}") from None


def _picked(pool: PoolView) -> set[str]:
    """Every endpoint placement would consider for a long prompt (empty: none eligible)."""
    req = RequestView(RequestId("r"), num_prompt_tokens=64, max_tokens=8)
    try:
        placement = default_decider().place(req, pool.views())
    except NoEligibleEndpoint:
        return set()
    return {*placement.decode, *placement.prefill}


async def _placed(pool: PoolView, want: set[str]) -> None:
    """Wait for placement to consider exactly `want` (load reports may lag a label change)."""
    await _until(f"placement on {sorted(want)}", pool, lambda pv: _picked(pv) == want)


async def _ips(cluster: Cluster, names: list[str], port: int) -> dict[str, str]:
    """name -> endpoint address (on a real cluster: once the kubelet has given the pod an IP)."""
    out: dict[str, str] = {}
    deadline = time.monotonic() + 90
    for name in names:
        while not (ip := await cluster.ip(name)):
            assert time.monotonic() < deadline, f"pod {name} got no IP"
            await asyncio.sleep(0.5)
        out[name] = f"{ip}:{port}"
    return out


async def test_pool_follows_worker_pods(
    cluster: Cluster,
    workers: tuple[int, dict[str, LoopbackWorker]],
    api_calls: Callable[[], list[ApiCall]] | None,
) -> None:
    port, _ = workers
    async with router_pool(cluster, port) as (pool, discovery):
        await asyncio.wait_for(discovery.synced.wait(), 20)
        assert pool.ids() == []
        # two workers and a pod of another service (kmock ignores selectors; discovery must not)
        await cluster.create("p-0", Role.PREFILL, "127.0.0.2")
        await cluster.create("d-0", Role.DECODE, "127.0.0.3")
        await cluster.create("other-0", Role.DECODE, "127.0.0.4", service="other")
        addr = await _ips(cluster, ["p-0", "d-0"], port)
        p0, d0 = addr["p-0"], addr["d-0"]
        await _until(
            "both workers unfenced", pool, lambda pv: _state(pv) == {p0: False, d0: False}, 90
        )
        if TARGET == "kmock":  # live workers: their load reports arrive, placement splits P/D
            await _placed(pool, {p0, d0})

        # the operator fences d-0 for a flip: it stays in the pool, takes no new work
        await cluster.label("d-0", **{v1.LABEL_FENCED: "true"})
        await _until("d-0 fenced", pool, lambda pv: _state(pv) == {p0: False, d0: True})
        if TARGET == "kmock":
            for _ in range(10):
                assert d0 not in _picked(pool)

        # ...flips its role label and unfences it: same endpoint, never removed
        await cluster.label("d-0", **{v1.LABEL_ROLE: "prefill"})
        await cluster.label("d-0", **{v1.LABEL_FENCED: "false"})
        await _until("d-0 unfenced", pool, lambda pv: _state(pv) == {p0: False, d0: False})
        assert discovery.applied[d0].role is Role.PREFILL
        if TARGET == "kmock":
            await _placed(pool, {p0, d0})

        # a new decode pod joins; deleting p-0 removes it
        await cluster.create("d-1", Role.DECODE, "127.0.0.4")
        d1 = (await _ips(cluster, ["d-1"], port))["d-1"]
        await _until("d-1 joins", pool, lambda pv: d1 in pv.ids(), 90)
        await cluster.delete("p-0")
        await _until("p-0 gone", pool, lambda pv: p0 not in pv.ids(), 60)
        assert set(pool.ids()) == {d0, d1}

        # a pod that stops matching the selector leaves the pool too
        await cluster.label("d-1", **{v1.LABEL_SERVICE: f"{cluster.service}-x"})
        await _until("d-1 gone", pool, lambda pv: pv.ids() == [d0])
        if TARGET == "kmock":  # kmock never ends a watch: all of it came through one watch
            assert discovery.lists == 1, "a watch broke and discovery listed again"

    if api_calls is not None:  # only list and watch of pods in the namespace: the router's Role
        mine = [c for c in api_calls() if "watch" in c.params or c.path.endswith("/pods")]
        assert mine
        assert any(c.params.get("watch") in ("true", "True", "1") for c in mine)
        for call in mine:
            if call.method.upper() != "GET":
                continue  # the test's own writes
            attrs = attributes(call)
            assert attrs is not None
            assert attrs.namespaced
            assert allowed(attrs, ROUTER_RBAC), call


@pytest.mark.skipif(TARGET != "kmock", reason="a real kubelet owns pod status")
async def test_not_ready_pods_get_no_work(
    cluster: Cluster, workers: tuple[int, dict[str, LoopbackWorker]]
) -> None:
    port, _ = workers
    p0, d0, d1 = (f"127.0.0.{i}:{port}" for i in (2, 3, 4))
    async with router_pool(cluster, port) as (pool, _discovery):
        await cluster.create("p-0", Role.PREFILL, "127.0.0.2")
        await cluster.create("d-0", Role.DECODE, "127.0.0.3")
        await cluster.create("d-1", Role.DECODE, "127.0.0.4")
        await _placed(pool, {p0, d0, d1})
        await cluster.set_ready("d-0", False, "127.0.0.3")
        await _until("d-0 fenced", pool, lambda pv: pv.view(d0).fenced)
        for _ in range(10):
            assert d0 not in _picked(pool)
        await _placed(pool, {p0, d1})
        await cluster.set_ready("d-0", True, "127.0.0.3")
        await _until("d-0 back", pool, lambda pv: not pv.view(d0).fenced)
        await _placed(pool, {p0, d0, d1})


@pytest.mark.skipif(TARGET != "kmock", reason="a real GC deletes pods of absent ReplicaSets")
async def test_only_pods_of_the_services_deployments_become_workers(
    cluster: Cluster, workers: tuple[int, dict[str, LoopbackWorker]]
) -> None:
    """A pod with the worker labels but no ReplicaSet of the service's worker Deployments (made
    by hand, or by another Deployment) gets no endpoint; the operator's pods do."""
    port, _ = workers
    deployment = f"{cluster.service}-main"
    async with router_pool(cluster, port, (deployment,)) as (pool, discovery):
        await cluster.create("stray", Role.DECODE, "127.0.0.3")
        await cluster.create("other", Role.DECODE, "127.0.0.4", replica_set="impostor-5d8f7c")
        await cluster.create("owned", Role.PREFILL, "127.0.0.2", replica_set=f"{deployment}-5d8f7c")
        owned = f"127.0.0.2:{port}"
        # Events arrive in order: once the last pod is in, the first two were seen and refused.
        await _until("the owned pod", pool, lambda pv: owned in _state(pv))
        assert set(_state(pool)) == {owned}
        assert {k.split("/")[1] for k in discovery.pods.refused} == {"stray", "other"}


@pytest.mark.skipif(TARGET != "kmock", reason="needs a server that expires watches on cue")
async def test_expired_watch_lists_again(
    cluster: Cluster,
    workers: tuple[int, dict[str, LoopbackWorker]],
    expire_watches: Callable[[int], None] | None,
) -> None:
    assert expire_watches is not None
    port, _ = workers
    expire_watches(2)  # the first two watches expire at once: list, 410, list, 410, list, watch
    async with router_pool(cluster, port) as (pool, discovery):
        await discovery.wait_for(lambda d: d.lists == 3, 20)
        await cluster.create("d-0", Role.DECODE, "127.0.0.3")
        await _until("d-0 joins", pool, lambda pv: pv.ids() == [f"127.0.0.3:{port}"])
        assert discovery.lists == 3  # the third watch holds
