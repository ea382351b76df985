"""What placement sees (frozen endpoint and request views) and the extension-point contracts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import ClassVar, Protocol

from splitserve.core.ids import EndpointId, RequestId, SloClassName
from splitserve.core.request import DEFAULT_SLO_CLASS
from splitserve.core.roles import Role


@dataclass(frozen=True, slots=True)
class EndpointView:
    """One worker as the router sees it: its last load report plus the router's own in-flight."""

    id: EndpointId
    role: Role
    ready: bool = True
    fenced: bool = False
    """An operator is flipping this worker: send it no new work."""
    draining: bool = False
    num_waiting: int = 0
    num_running: int = 0
    kv_free_blocks: int = 0
    kv_total_blocks: int = 0
    kv_block_size: int = 16
    pending_prefill_tokens: int = 0
    inflight: int = 0
    """Requests the router has sent and not yet seen finish (covers the gap between reports)."""

    @property
    def accepts_work(self) -> bool:
        return self.ready and not self.fenced and not self.draining


@dataclass(frozen=True, slots=True)
class RequestView:
    id: RequestId
    num_prompt_tokens: int
    max_tokens: int
    slo_class: SloClassName = DEFAULT_SLO_CLASS.name
    predicted_output_tokens: int | None = None


class Filter(Protocol):
    """Returns a subset of the endpoints (never adds one). May return an empty sequence."""

    kind: ClassVar[str]

    def filter(self, req: RequestView, eps: Sequence[EndpointView]) -> Sequence[EndpointView]: ...


class Scorer(Protocol):
    """Scores endpoints in [0, 1], higher is better. Omitted endpoints count as 0.

    The profile clamps each score into [0, 1] and multiplies it by the scorer's weight.
    """

    kind: ClassVar[str]

    def score(
        self, req: RequestView, eps: Sequence[EndpointView]
    ) -> Mapping[EndpointId, float]: ...


class Picker(Protocol):
    """Orders endpoints by their weighted total score: the first is the pick, the rest fallbacks."""

    kind: ClassVar[str]

    def order(self, totals: Mapping[EndpointId, float]) -> list[EndpointId]: ...


class Path(StrEnum):
    DISAGGREGATED = "disaggregated"
    """Prefill on a prefill worker, KV handed to a decode worker."""
    AGGREGATED = "aggregated"
    """The whole request on one decode or mixed worker."""


@dataclass(frozen=True, slots=True)
class Placement:
    path: Path
    decode: tuple[EndpointId, ...]
    """Decode (or aggregated) candidates, best first."""
    prefill: tuple[EndpointId, ...] = ()
    """Prefill candidates, best first; empty for the aggregated path."""
    reason: str = ""
