"""Scorers: each returns scores in [0, 1] per endpoint, higher is better."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

from splitserve.core.ids import EndpointId
from splitserve.policy.placement.base import EndpointView, RequestView, Scorer


def _inverse_relative(values: Mapping[EndpointId, float]) -> dict[EndpointId, float]:
    """1 for the smallest value, 0 for the largest, linear between; all 1 when all equal."""
    if not values:
        return {}
    lo, hi = min(values.values()), max(values.values())
    if hi <= lo:
        return dict.fromkeys(values, 1.0)
    return {k: (hi - v) / (hi - lo) for k, v in values.items()}


@dataclass(frozen=True, slots=True)
class LeastLoaded:
    """Prefer endpoints with the fewest requests queued, running or in flight from this router."""

    kind: ClassVar[str] = "least-loaded"

    def score(self, req: RequestView, eps: Sequence[EndpointView]) -> Mapping[EndpointId, float]:
        return _inverse_relative({e.id: e.num_waiting + e.num_running + e.inflight for e in eps})


@dataclass(frozen=True, slots=True)
class KvHeadroom:
    """Prefer endpoints with free KV blocks: score = free / total."""

    kind: ClassVar[str] = "kv-headroom"

    def score(self, req: RequestView, eps: Sequence[EndpointView]) -> Mapping[EndpointId, float]:
        return {
            # Clamped: a report can be inconsistent for an instant (free read as total changed).
            e.id: min(1.0, e.kv_free_blocks / e.kv_total_blocks) if e.kv_total_blocks > 0 else 0.0
            for e in eps
        }


@dataclass(frozen=True, slots=True)
class FewestPendingPrefillTokens:
    """Join-the-shortest-queue on prompt tokens still to compute (Splitwise's prefill JSQ)."""

    kind: ClassVar[str] = "pending-prefill-tokens"

    def score(self, req: RequestView, eps: Sequence[EndpointView]) -> Mapping[EndpointId, float]:
        return _inverse_relative({e.id: float(e.pending_prefill_tokens) for e in eps})


_conforms: tuple[type[Scorer], ...] = (LeastLoaded, KvHeadroom, FewestPendingPrefillTokens)
