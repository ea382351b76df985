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
from splitserve.core.roles import Role
from splitserve.policy.placement.base import EndpointView, Filter, Picker, RequestView, Scorer
from splitserve.policy.placement.builtin import FILTERS, PICKERS, SCORERS


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
        """Eligible endpoints, best first. Empty when every endpoint was filtered out."""
        eligible = self.eligible(req, eps)
        return self.picker.order(self.totals(req, eligible)) if eligible else []


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
