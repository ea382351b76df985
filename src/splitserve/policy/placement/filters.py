"""Filters: drop endpoints that must not take the request."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from splitserve.core.kv import blocks_for
from splitserve.core.roles import Role
from splitserve.policy.placement.base import EndpointView, Filter, RequestView


@dataclass(frozen=True, slots=True)
class AcceptsWork:
    """Only ready endpoints that are neither fenced nor draining."""

    kind: ClassVar[str] = "accepts-work"

    def filter(self, req: RequestView, eps: Sequence[EndpointView]) -> Sequence[EndpointView]:
        return [e for e in eps if e.accepts_work]


@dataclass(frozen=True, slots=True)
class RoleIn:
    """Only endpoints whose current role is one of `roles`."""

    kind: ClassVar[str] = "role"
    roles: frozenset[Role] = field(default_factory=lambda: frozenset(Role))

    def filter(self, req: RequestView, eps: Sequence[EndpointView]) -> Sequence[EndpointView]:
        return [e for e in eps if e.role in self.roles]


@dataclass(frozen=True, slots=True)
class KvCanHoldPrompt:
    """Only endpoints with enough free KV blocks for the prompt right now."""

    kind: ClassVar[str] = "kv-fits"

    def filter(self, req: RequestView, eps: Sequence[EndpointView]) -> Sequence[EndpointView]:
        return [
            e for e in eps if blocks_for(req.num_prompt_tokens, e.kv_block_size) <= e.kv_free_blocks
        ]


_conforms: tuple[type[Filter], ...] = (AcceptsWork, RoleIn, KvCanHoldPrompt)
