"""Which caller owns which request on a worker, so `Cancel` and `ReleaseKv` act only for it.

With internal TLS the owner is the certificate the request came with (its SHA-256): the router
that started a request may cancel it or free its KV; another caller (another router certificate,
or an `admin` tool) gets the same answer as for an unknown id (`found: false`), so ids in flight
are not revealed. Router replicas that mount one Secret share a certificate and so are one
owner. A decode worker (role `worker`, of the same service: the interceptor checks that) may
free the KV it pulled, whoever started the request. Without TLS nobody is named and nothing is
scoped (local plaintext mode, as before).

The table is bounded (`MAX_OWNERS`, oldest forgotten first): a forgotten request is one whose
KV the engine expires on its own.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Final

MAX_OWNERS: Final = 65_536


class Owners:
    def __init__(self, limit: int = MAX_OWNERS) -> None:
        self.limit = limit
        self._owner: OrderedDict[str, str] = OrderedDict()
        self.refusals = 0

    def record(self, request_id: str, owner: str | None) -> None:
        if owner is None:
            return
        self._owner[request_id] = owner
        self._owner.move_to_end(request_id)
        while len(self._owner) > self.limit:
            self._owner.popitem(last=False)

    def forget(self, request_id: str) -> None:
        self._owner.pop(request_id, None)

    def allows(self, request_id: str, caller: str | None) -> bool:
        """May `caller` act on `request_id`? Yes without TLS (no caller named) and for requests
        with no recorded owner; otherwise only its owner."""
        owner = self._owner.get(request_id)
        if caller is None or owner is None or owner == caller:
            return True
        self.refusals += 1
        return False

    def __len__(self) -> int:
        return len(self._owner)
