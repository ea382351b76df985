"""Which role may call which internal method, checked on every call (gRPC interceptor).

Callers are named by their TLS certificate (`security.tls.peer`). A method not in the table is
refused (deny by default); a caller without a verified certificate of this service's CA never
gets this far (the TLS handshake needs one). Refusals are PERMISSION_DENIED and are logged at
WARNING with the caller's address and role.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Final

import grpc
from grpc import aio

from splitserve.security import tls
from splitserve.security.guard import guarded, refused

log = logging.getLogger(__name__)

ANY: Final = frozenset({"operator", "router", "worker", "admin"})
_ROUTER: Final = frozenset({"router", "admin"})
_OPERATOR: Final = frozenset({"operator", "admin"})

WORKER_METHODS: Final[Mapping[str, frozenset[str]]] = {
    "/splitserve.v1.Worker/Prefill": _ROUTER,
    "/splitserve.v1.Worker/Decode": _ROUTER,
    "/splitserve.v1.Worker/Generate": _ROUTER,
    "/splitserve.v1.Worker/Multiplex": _ROUTER,
    "/splitserve.v1.Worker/Cancel": _ROUTER,
    # A decode worker frees the prefill worker's copy once it pulled the KV.
    "/splitserve.v1.Worker/ReleaseKv": _ROUTER | {"worker"},
    "/splitserve.v1.Worker/WatchLoad": _ROUTER | _OPERATOR,
    "/splitserve.v1.Worker/WatchSteps": _ROUTER | _OPERATOR,
    "/splitserve.v1.Worker/WatchStepBatches": _ROUTER | _OPERATOR,
    "/splitserve.v1.Worker/Drain": _OPERATOR,
    "/splitserve.v1.Worker/SetRole": _OPERATOR,
    # The router warms prefill -> decode pairs; the decode worker asks its peer's endpoint.
    "/splitserve.v1.WorkerKv/WarmKv": _ROUTER,
    "/splitserve.v1.WorkerKv/KvEndpoint": _ROUTER | {"worker"},
    "/grpc.health.v1.Health/Check": ANY,
    "/grpc.health.v1.Health/Watch": ANY,
}
"""The worker's methods and the roles that may call them (docs/security.md). `admin` is the
identity of people's tools (`splitserve profile`)."""


class RoleInterceptor(aio.ServerInterceptor):  # type: ignore[misc]
    """Refuse a method unless the caller's certificate names a role allowed to call it."""

    def __init__(
        self,
        table: Mapping[str, frozenset[str]],
        service: str | None = None,
        any_service: frozenset[str] | set[str] = frozenset(),
    ) -> None:
        """`service`: also require the caller's certificate to name this service (None: any
        service of the CA), except for the roles in `any_service` (the operator, which
        manages every service its CA signs for)."""
        self.table = table
        self.service = service
        self.any_service = frozenset(any_service)
        self.refusals = 0

    async def intercept_service(self, continuation: Any, details: Any) -> Any:
        handler = await continuation(details)
        if handler is None:
            return None
        method = str(details.method)
        allowed = self.table.get(method)
        if allowed is None:
            self.refusals += 1
            log.warning("refused %s: not an internal method anyone may call", method)
            return refused(handler, grpc.StatusCode.PERMISSION_DENIED, f"{method}: not allowed")

        async def check(_: Any, context: Any) -> None:
            refusal = self.refusal(method, context)
            if refusal is not None:
                await context.abort(grpc.StatusCode.PERMISSION_DENIED, refusal)

        return guarded(handler, check)

    def refusal(self, method: str, context: Any) -> str | None:
        """Why the caller of `context` may not call `method` (logged, counted); None: it may.
        Also the worker's stream link's check (`worker.link`), with `context` its connection."""
        allowed = self.table.get(method, frozenset())
        who = tls.peer(context)
        ok = (
            who is not None
            and who.role in allowed
            and (
                self.service is None or who.service == self.service or who.role in self.any_service
            )
        )
        if ok:
            return None
        self.refusals += 1
        name = "no verified certificate" if who is None else f"{who.role} of {who.service}"
        log.warning("refused %s from %s (%s)", method, context.peer(), name)
        return f"{method} may be called by {', '.join(sorted(allowed))}, not {name}"
