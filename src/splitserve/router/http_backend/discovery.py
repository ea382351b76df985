"""Stock `vllm serve` pods found by their labels (`backend_discovery` in router.yaml).

The list / watch / re-list loop, the label selector and the pod-to-endpoint rules (an IP and a
role label make an endpoint; not Ready, being deleted or the fenced label fence it) are
`router.discovery.KubernetesDiscovery`'s; only the pool membership differs: each pod becomes an
`HttpWorker` at `scheme://podIP:httpPort` in the pool, with the role its label names. A stock
server reports no role of its own, so a changed role label changes where the router places.
"""

from __future__ import annotations

import logging

from splitserve.api.backends import BackendDiscoverySettings, HttpBackend
from splitserve.api.router import DiscoverySettings
from splitserve.core.roles import Role
from splitserve.router.discovery import KubernetesDiscovery, PodSource
from splitserve.router.http_backend.worker import HttpWorker
from splitserve.router.pool_view import PoolView

log = logging.getLogger(__name__)


def pod_discovery_settings(settings: BackendDiscoverySettings) -> DiscoverySettings:
    """The pod watch's settings (the endpoint port is the servers' HTTP port)."""
    return DiscoverySettings(
        namespace=settings.namespace,
        selector=settings.selector,
        role_label=settings.role_label,
        fenced_label=settings.fenced_label,
        grpc_port=settings.http_port,
        watch_timeout_s=settings.watch_timeout_s,
        backoff_min_s=settings.backoff_min_s,
        backoff_max_s=settings.backoff_max_s,
    )


class _HttpMembership:
    """`discovery.Membership` over `HttpWorker`s: pod addresses (`ip:port`) to URLs."""

    def __init__(self, pool: PoolView, settings: BackendDiscoverySettings) -> None:
        self.pool = pool
        self.settings = settings
        self.roles: dict[str, Role] = {}
        """The role label of each address discovery is about to apply."""
        self.workers: dict[str, HttpWorker] = {}

    def url(self, address: str) -> str:
        return f"{self.settings.scheme}://{address}"

    def add(self, address: str) -> object:
        backend = HttpBackend(
            url=self.url(address),
            role=self.roles.get(address, Role.MIXED),
            metrics_interval_s=self.settings.metrics_interval_s,
            request_timeout_s=self.settings.request_timeout_s,
        )
        worker = self.workers[address] = HttpWorker(backend)
        return self.pool.add_stub(backend.url, worker, worker)

    async def remove(self, eid: str) -> None:
        self.workers.pop(eid, None)
        await self.pool.remove(self.url(eid))

    def fence(self, eid: str) -> None:
        self.pool.fence(self.url(eid))

    def unfence(self, eid: str) -> None:
        self.pool.unfence(self.url(eid))


class BackendDiscovery(KubernetesDiscovery):
    """Keeps the pool's stock vLLM servers in step with the matching pods."""

    def __init__(
        self,
        pool: PoolView,
        settings: BackendDiscoverySettings,
        source: PodSource | None = None,
    ) -> None:
        self.membership = _HttpMembership(pool, settings)
        super().__init__(self.membership, pod_discovery_settings(settings), source)

    async def _sync(self) -> None:
        roles = {address: ep.role for address, ep in self.pods.desired().items()}
        self.membership.roles = roles
        await super()._sync()
        for address, worker in self.membership.workers.items():
            role = roles.get(address)
            if role is not None and role is not worker.role:
                log.info("backend discovery: %s role label now %s", address, role.value)
                worker.role = role
