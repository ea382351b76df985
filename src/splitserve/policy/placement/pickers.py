"""Pickers: order endpoints by total score."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from splitserve.core.ids import EndpointId
from splitserve.policy.placement.base import Picker


@dataclass(frozen=True, slots=True)
class MaxScore:
    """Highest total first; ties go to the smaller endpoint id, so decisions are reproducible."""

    kind: ClassVar[str] = "max-score"

    def order(self, totals: Mapping[EndpointId, float]) -> list[EndpointId]:
        return sorted(totals, key=lambda e: (-totals[e], e))


_conforms: tuple[type[Picker], ...] = (MaxScore,)


class FairMaxScore:
    """Highest total first; endpoints tied at the top take turns (a rotating offset), so equal
    workers share a stream of requests instead of the smallest id taking every one.

    Holds one counter (the rotation); deterministic for a given sequence of calls.
    """

    kind: ClassVar[str] = "fair-max-score"

    def __init__(self, tolerance: float = 1e-9) -> None:
        self.tolerance = tolerance
        self._turn = 0

    def order(self, totals: Mapping[EndpointId, float]) -> list[EndpointId]:
        ranked = sorted(totals, key=lambda e: (-totals[e], e))
        if len(ranked) < 2:
            return ranked
        best = totals[ranked[0]]
        tied = [e for e in ranked if best - totals[e] <= self.tolerance]
        if len(tied) < 2:
            return ranked
        k = self._turn % len(tied)
        self._turn += 1
        return tied[k:] + tied[:k] + ranked[len(tied) :]


_conforms_fair: tuple[type[Picker], ...] = (FairMaxScore,)
