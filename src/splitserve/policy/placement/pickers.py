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
