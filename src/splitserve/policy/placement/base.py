"""What placement sees (immutable endpoint and request views) and the extension-point contracts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import ClassVar, Final, Protocol

from splitserve.core.ids import EndpointId, RequestId, SloClassName
from splitserve.core.request import DEFAULT_SLO_CLASS
from splitserve.core.roles import Role

# The three views below are built on every placement (the simulator's hot path, issue 4), so they
# are slotted dataclasses with an explicit `__init__` and `Final` fields rather than
# `frozen=True`: a frozen dataclass's generated `__init__` sets each field through
# `object.__setattr__` (interpreted even under mypyc) and costs several times as much. Values,
# `repr`, equality, hashing and `dataclasses.replace` are as before; immutability is checked by
# mypy (`Final`) and enforced at runtime in the compiled build, not in pure Python.


@dataclass(slots=True, init=False, unsafe_hash=True)
class EndpointView:
    """One worker as the router sees it: its last load report plus the router's own in-flight."""

    id: Final[EndpointId]
    role: Final[Role]
    ready: Final[bool]
    fenced: Final[bool]
    """An operator is flipping this worker: send it no new work."""
    draining: Final[bool]
    num_waiting: Final[int]
    num_running: Final[int]
    kv_free_blocks: Final[int]
    kv_total_blocks: Final[int]
    kv_block_size: Final[int]
    pending_prefill_tokens: Final[int]
    inflight: Final[int]
    """Requests the router has sent or reserved here and not yet seen finish (covers the gap
    between reports, and simultaneous placements: a reservation counts from decision time)."""
    prefill_tokens_per_s: Final[float]
    """The owner's fitted prefill throughput of this worker; 0 = no estimate yet."""
    decode_step_base_s: Final[float]
    """Fitted decode step time: base + per_seq * batch; both 0 = no estimate yet."""
    decode_step_per_seq_s: Final[float]
    kv_pull_tokens_per_s: Final[float]
    """The owner's estimate of how fast KV pulls into this worker move (prompt tokens per
    second over its inbound link); 0 = no estimate yet."""
    pending_pull_tokens: Final[int]
    """Prompt tokens whose KV will be pulled into this worker before a pull placed now (split
    requests placed here and not yet pulled); 0 when the owner does not count them."""
    stale: Final[bool]
    """The worker's load reports stopped while its connection stayed up (frozen, or starved of
    CPU): its load is the owner's own guess. Ranked after every worker with fresh reports."""

    def __init__(
        self,
        id: EndpointId,
        role: Role,
        ready: bool = True,
        fenced: bool = False,
        draining: bool = False,
        num_waiting: int = 0,
        num_running: int = 0,
        kv_free_blocks: int = 0,
        kv_total_blocks: int = 0,
        kv_block_size: int = 16,
        pending_prefill_tokens: int = 0,
        inflight: int = 0,
        prefill_tokens_per_s: float = 0.0,
        decode_step_base_s: float = 0.0,
        decode_step_per_seq_s: float = 0.0,
        kv_pull_tokens_per_s: float = 0.0,
        pending_pull_tokens: int = 0,
        stale: bool = False,
    ) -> None:
        self.id = id
        self.role = role
        self.ready = ready
        self.fenced = fenced
        self.draining = draining
        self.num_waiting = num_waiting
        self.num_running = num_running
        self.kv_free_blocks = kv_free_blocks
        self.kv_total_blocks = kv_total_blocks
        self.kv_block_size = kv_block_size
        self.pending_prefill_tokens = pending_prefill_tokens
        self.inflight = inflight
        self.prefill_tokens_per_s = prefill_tokens_per_s
        self.decode_step_base_s = decode_step_base_s
        self.decode_step_per_seq_s = decode_step_per_seq_s
        self.kv_pull_tokens_per_s = kv_pull_tokens_per_s
        self.pending_pull_tokens = pending_pull_tokens
        self.stale = stale

    @property
    def batch(self) -> int:
        """Requests on the worker as the router sees them (reported plus its own in flight)."""
        return self.num_waiting + self.num_running + self.inflight

    @property
    def accepts_work(self) -> bool:
        return self.ready and not self.fenced and not self.draining


@dataclass(slots=True, init=False, unsafe_hash=True)
class RequestView:
    id: Final[RequestId]
    num_prompt_tokens: Final[int]
    max_tokens: Final[int]
    slo_class: Final[SloClassName]
    predicted_output_tokens: Final[int | None]
    ttft_budget_s: Final[float | None]
    """Seconds left until the request's TTFT deadline at decision time (None: no SLO)."""
    tpot_target_s: Final[float | None]
    """The request's TPOT target (None: no SLO)."""

    def __init__(
        self,
        id: RequestId,
        num_prompt_tokens: int,
        max_tokens: int,
        slo_class: SloClassName = DEFAULT_SLO_CLASS.name,
        predicted_output_tokens: int | None = None,
        ttft_budget_s: float | None = None,
        tpot_target_s: float | None = None,
    ) -> None:
        self.id = id
        self.num_prompt_tokens = num_prompt_tokens
        self.max_tokens = max_tokens
        self.slo_class = slo_class
        self.predicted_output_tokens = predicted_output_tokens
        self.ttft_budget_s = ttft_budget_s
        self.tpot_target_s = tpot_target_s


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


@dataclass(slots=True, init=False, unsafe_hash=True)
class Placement:
    path: Final[Path]
    decode: Final[tuple[EndpointId, ...]]
    """Decode (or aggregated) candidates, best first."""
    prefill: Final[tuple[EndpointId, ...]]
    """Prefill candidates, best first; empty for the aggregated path."""
    reason: Final[str]

    def __init__(
        self,
        path: Path,
        decode: tuple[EndpointId, ...],
        prefill: tuple[EndpointId, ...] = (),
        reason: str = "",
    ) -> None:
        self.path = path
        self.decode = decode
        self.prefill = prefill
        self.reason = reason
