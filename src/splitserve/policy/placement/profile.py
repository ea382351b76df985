"""A placement profile: filters, then weighted scorers, then a picker.

Profiles are built from plain specs (`ProfileSpec`) naming registered plugins, so the router's
config, the operator's CRD and the simulator all describe placement the same way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from splitserve.core.errors import ConfigError
from splitserve.core.ids import EndpointId
from splitserve.core.kv import blocks_for
from splitserve.core.roles import Role
from splitserve.policy.placement.base import EndpointView, Filter, Picker, RequestView, Scorer
from splitserve.policy.placement.builtin import FILTERS, PICKERS, SCORERS
from splitserve.policy.placement.filters import AcceptsWork, KvCanHoldPrompt, RoleIn
from splitserve.policy.placement.pickers import MaxScore
from splitserve.policy.placement.scorers import FewestPendingPrefillTokens, KvHeadroom, LeastLoaded

# Codes of the built-in plugins `Profile.rank` runs inline (see `_fused_plan`).
_ACCEPTS_WORK, _ROLE_IN, _KV_FITS = 0, 1, 2
_LEAST_LOADED, _KV_HEADROOM, _PENDING_PREFILL = 0, 1, 2


@dataclass(frozen=True, slots=True)
class WeightedScorer:
    scorer: Scorer
    weight: float

    def __post_init__(self) -> None:
        if not self.weight > 0:
            raise ConfigError(f"scorer {self.scorer.kind!r} needs a weight > 0, got {self.weight}")


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    filters: tuple[Filter, ...]
    scorers: tuple[WeightedScorer, ...]
    picker: Picker
    _fused: tuple[tuple[tuple[int, frozenset[Role]], ...], tuple[tuple[int, float], ...]] | None = (
        field(init=False, repr=False, compare=False, default=None)
    )
    """The plan `rank` runs inline when every plugin is a built-in one (`_fused_plan`)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "_fused", _fused_plan(self))

    def eligible(self, req: RequestView, eps: Sequence[EndpointView]) -> list[EndpointView]:
        out = list(eps)
        for f in self.filters:
            out = list(f.filter(req, out))
        return out

    def totals(self, req: RequestView, eps: Sequence[EndpointView]) -> dict[EndpointId, float]:
        """Weighted sum of clamped scores per endpoint (only the given endpoints)."""
        totals = {e.id: 0.0 for e in eps}
        for ws in self.scorers:
            scores = ws.scorer.score(req, eps)
            for eid in totals:
                totals[eid] += ws.weight * min(1.0, max(0.0, scores.get(eid, 0.0)))
        return totals

    def rank(self, req: RequestView, eps: Sequence[EndpointView]) -> list[EndpointId]:
        """Eligible endpoints, best first; those whose load reports went stale after every
        fresh one (a frozen worker gets new work only when no other can take it). Empty when
        every endpoint was filtered out."""
        if self._fused is not None:
            ranked = self._rank_fused(req, eps, self._fused)
        else:
            eligible = self.eligible(req, eps)
            ranked = self.picker.order(self.totals(req, eligible)) if eligible else []
        if len(ranked) < 2:
            return ranked
        for e in eps:  # the hot path (router and simulator): no list unless one is stale
            if e.stale:
                break
        else:
            return ranked
        stale = {e.id for e in eps if e.stale}
        return [i for i in ranked if i not in stale] + [i for i in ranked if i in stale]

    def _rank_fused(
        self,
        req: RequestView,
        eps: Sequence[EndpointView],
        plan: tuple[tuple[tuple[int, frozenset[Role]], ...], tuple[tuple[int, float], ...]],
    ) -> list[EndpointId]:
        """`rank` for built-in filters, scorers and `MaxScore`, inlined: the same comparisons
        and the same float operations in the same order as the plugins, `totals` and `order`
        (so the same ranking, bit for bit), without the per-scorer dicts (the router's and the
        simulator's hot path: every arrival ranks every endpoint twice)."""
        filters, scorers = plan
        out = eps
        for code, roles in filters:
            if code == _ACCEPTS_WORK:
                out = [e for e in out if e.accepts_work]
            elif code == _ROLE_IN:
                out = [e for e in out if e.role in roles]
            else:
                p = req.num_prompt_tokens
                out = [e for e in out if blocks_for(p, e.kv_block_size) <= e.kv_free_blocks]
        if not out:
            return []
        ids = [e.id for e in out]
        n = len(ids)
        if len(set(ids)) != n:  # repeated ids: `totals` keys by id; keep its exact semantics
            return self.picker.order(self.totals(req, out))
        totals = [0.0] * n
        for code, weight in scorers:
            if code == _KV_HEADROOM:
                for i in range(n):
                    e = out[i]
                    total = e.kv_total_blocks
                    s = min(1.0, e.kv_free_blocks / total) if total > 0 else 0.0
                    # `min(1.0, max(0.0, s))`, spelled out (same result for every float)
                    totals[i] += weight * (1.0 if s > 1.0 else (s if s > 0.0 else 0.0))
                continue
            # `_inverse_relative` over least-loaded counts or pending prefill tokens
            values: list[float] | list[int]
            if code == _LEAST_LOADED:
                values = [e.num_waiting + e.num_running + e.inflight for e in out]
            else:
                values = [float(e.pending_prefill_tokens) for e in out]
            lo, hi = min(values), max(values)
            if hi <= lo:
                for i in range(n):
                    totals[i] += weight * 1.0
                continue
            span = hi - lo
            for i in range(n):
                s = (hi - values[i]) / span
                totals[i] += weight * (1.0 if s > 1.0 else (s if s > 0.0 else 0.0))
        # `MaxScore.order`: highest total first, ties to the smaller id
        ranked = sorted(zip([-t for t in totals], ids, strict=True))
        return [eid for _, eid in ranked]


@dataclass(frozen=True, slots=True)
class PluginSpec:
    type: str
    weight: float = 1.0
    params: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ProfileSpec:
    name: str
    filters: tuple[PluginSpec, ...]
    scorers: tuple[PluginSpec, ...]
    picker: PluginSpec = PluginSpec("max-score")


def _build(registry_get: Any, spec: PluginSpec) -> Any:
    cls = registry_get(spec.type)
    try:
        return cls(**dict(spec.params))
    except TypeError as err:
        raise ConfigError(f"bad params for {spec.type!r}: {err}") from err


def _fused_plan(
    profile: Profile,
) -> tuple[tuple[tuple[int, frozenset[Role]], ...], tuple[tuple[int, float], ...]] | None:
    """Codes for `Profile._rank_fused` when every plugin is exactly a built-in type (not a
    subclass); None otherwise, and `rank` calls the plugins."""
    if type(profile.picker) is not MaxScore:
        return None
    no_roles: frozenset[Role] = frozenset()
    filters: list[tuple[int, frozenset[Role]]] = []
    for f in profile.filters:
        if type(f) is AcceptsWork:
            filters.append((_ACCEPTS_WORK, no_roles))
        elif type(f) is RoleIn:
            assert isinstance(f, RoleIn)
            filters.append((_ROLE_IN, f.roles))
        elif type(f) is KvCanHoldPrompt:
            filters.append((_KV_FITS, no_roles))
        else:
            return None
    scorers: list[tuple[int, float]] = []
    for ws in profile.scorers:
        if type(ws.scorer) is LeastLoaded:
            scorers.append((_LEAST_LOADED, ws.weight))
        elif type(ws.scorer) is KvHeadroom:
            scorers.append((_KV_HEADROOM, ws.weight))
        elif type(ws.scorer) is FewestPendingPrefillTokens:
            scorers.append((_PENDING_PREFILL, ws.weight))
        else:
            return None
    return tuple(filters), tuple(scorers)


def build_profile(spec: ProfileSpec) -> Profile:
    if not spec.scorers:
        raise ConfigError(f"profile {spec.name!r} needs at least one scorer")
    return Profile(
        name=spec.name,
        filters=tuple(_build(FILTERS.get, f) for f in spec.filters),
        scorers=tuple(WeightedScorer(_build(SCORERS.get, s), s.weight) for s in spec.scorers),
        picker=_build(PICKERS.get, spec.picker),
    )


def default_decode_profile() -> ProfileSpec:
    """Least-loaded baseline for decode (and aggregated) placement, with KV headroom."""
    return ProfileSpec(
        name="decode",
        filters=(
            PluginSpec("accepts-work"),
            PluginSpec("role", params={"roles": frozenset({Role.DECODE, Role.MIXED})}),
        ),
        scorers=(PluginSpec("least-loaded", 1.0), PluginSpec("kv-headroom", 0.5)),
    )


def default_prefill_profile() -> ProfileSpec:
    """Least-loaded baseline for prefill: fewest pending prompt tokens first."""
    return ProfileSpec(
        name="prefill",
        filters=(
            PluginSpec("accepts-work"),
            PluginSpec("role", params={"roles": frozenset({Role.PREFILL})}),
        ),
        scorers=(PluginSpec("pending-prefill-tokens", 1.0), PluginSpec("least-loaded", 0.5)),
    )
