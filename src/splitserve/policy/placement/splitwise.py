"""Splitwise's cluster-level scheduler as placement plugins: prompt, token and mixed pools.

Splitwise (research/seed-splitwise-tetriinfer.md A3.2, A8.1-A8.7; seeds/splitwise.txt §IV-A)
keeps three pools. A machine's *home* pool is its role: PREFILL = prompt pool, DECODE = token
pool. The mixed pool holds the machines provisioned as MIXED plus any prompt or token machine
currently borrowed for the opposite kind of work; a borrowed machine keeps its identity and goes
back to its home pool once no work of the opposite kind is left on it. Which machines are borrowed
right now is the owner's bookkeeping (`in_mixed`, injected: the simulator derives it from the
requests it routed, a live router from its request table); by default only MIXED machines are in
the mixed pool.

For each request the scheduler picks a prompt machine and a token machine at arrival, each by
join-the-shortest-queue within the first pool that is not overloaded, in the order own pool →
mixed pool → opposite pool (borrow):

* prompt phase: queue = pending prompt tokens; a machine is overloaded when it has a queue and
  the prompt would push its pending prompt tokens past `prompt_queue_threshold_tokens` (8192,
  SplitwiseSim's `prompt_max_pending_batch_tokens`; the paper's "certain threshold");
* token phase: queue = reserved KV (blocks in use, or the owner's reservations, `reserved_of`);
  a machine is overloaded when reserving KV for the prompt plus the output would pass
  `token_memory_watermark` of its KV capacity (1.0, SplitwiseSim). The output length is
  `RequestView.predicted_output_tokens` when set, else `max_tokens` (the simulator's true length,
  the oracle SplitwiseSim uses too).

The opposite pool is borrowed from without an overload check, as SplitwiseSim does; only when no
machine can take the phase at all does the pipeline fall back to running the request whole on one
machine (`SplitwiseDecider`, or `PdDecider`'s aggregated path).

Plugins:
* `SplitwisePoolFilter` ("splitwise-pool"): keeps the first pool tier with a machine that is not
  overloaded (the opposite pool whole); empty only when no machine accepts work.
* `SplitwiseOverflow` ("splitwise-overflow"): scores the same tiers in bands of width 1/4 (own
  pool highest, then mixed, then opposite, then overloaded own-pool or mixed machines) with JSQ
  inside a band, so it orders fallbacks on its own and does JSQ when the filter ran first.
* `SplitwiseDecider`: the P/D decider with Splitwise's rule that a request whose prompt and token
  machine coincide runs there whole, with no KV transfer.

Invariants (property-tested): scores lie in [0, 1]; the filter returns a subset, empty only when
no endpoint accepts work; the top-scored endpoint lies in the tier the filter keeps; a prompt
never goes to the opposite pool while its own or the mixed pool has a machine not overloaded.
Pure: no I/O, no clock, no global state.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import ClassVar

from splitserve.core.ids import EndpointId
from splitserve.core.kv import blocks_for
from splitserve.core.roles import Role
from splitserve.policy.placement.base import (
    EndpointView,
    Filter,
    Path,
    Placement,
    RequestView,
    Scorer,
)
from splitserve.policy.placement.decider import PdDecider

PROMPT_QUEUE_THRESHOLD_TOKENS = 8192
"""SplitwiseSim's `prompt_max_pending_batch_tokens` (research A8.1): 4× the 2048-token batch cap."""


class Phase(StrEnum):
    PROMPT = "prompt"
    TOKEN = "token"


class Tier(StrEnum):
    OWN = "own"
    MIXED = "mixed"
    OPPOSITE = "opposite"
    OVERLOADED = "overloaded"
    """An own-pool or mixed machine over its threshold: used only when nothing else is."""


_HOME = {Phase.PROMPT: Role.PREFILL, Phase.TOKEN: Role.DECODE}
_BAND = {Tier.OWN: 3.0, Tier.MIXED: 2.0, Tier.OPPOSITE: 1.0, Tier.OVERLOADED: 0.0}


def _no_borrow(_: EndpointId) -> bool:
    return False


@dataclass(frozen=True, slots=True)
class SplitwisePools:
    """Pool membership and the overload predicates shared by the filter and the scorer."""

    phase: Phase = Phase.PROMPT
    prompt_queue_threshold_tokens: int = PROMPT_QUEUE_THRESHOLD_TOKENS
    token_memory_watermark: float = 1.0
    in_mixed: Callable[[EndpointId], bool] = field(default=_no_borrow, compare=False)
    """Whether a prompt or token machine is borrowed into the mixed pool right now."""
    reserved_of: Callable[[EndpointId], int] | None = field(default=None, compare=False)
    """KV blocks the owner has reserved on a machine; None = blocks in use (total - free)."""

    @property
    def pools(self) -> SplitwisePools:
        """The pool rule itself (the filter and the scorer are pools with a plugin method)."""
        return self

    def __post_init__(self) -> None:
        object.__setattr__(self, "phase", Phase(self.phase))
        if self.prompt_queue_threshold_tokens < 1:
            raise ValueError("prompt_queue_threshold_tokens must be >= 1")
        if not self.token_memory_watermark > 0:
            raise ValueError("token_memory_watermark must be > 0")

    def tier(self, e: EndpointView) -> Tier:
        if e.role is Role.MIXED or self.in_mixed(e.id):
            return Tier.MIXED
        return Tier.OWN if e.role is _HOME[self.phase] else Tier.OPPOSITE

    def reserved_blocks(self, e: EndpointView) -> int:
        if self.reserved_of is not None:
            return self.reserved_of(e.id)
        return max(0, e.kv_total_blocks - e.kv_free_blocks)

    def queue(self, e: EndpointView) -> float:
        """The JSQ queue length: pending prompt tokens, or the reserved KV fraction."""
        if self.phase is Phase.PROMPT:
            return float(e.pending_prefill_tokens)
        total = max(e.kv_total_blocks, 1)
        return self.reserved_blocks(e) / total

    def overloaded(self, req: RequestView, e: EndpointView) -> bool:
        if self.phase is Phase.PROMPT:
            pending = e.pending_prefill_tokens + req.num_prompt_tokens
            return e.num_waiting > 0 and pending > self.prompt_queue_threshold_tokens
        output = req.predicted_output_tokens
        if output is None:
            output = req.max_tokens
        need = blocks_for(req.num_prompt_tokens + max(output, 1), e.kv_block_size)
        return self.reserved_blocks(e) + need > self.token_memory_watermark * e.kv_total_blocks

    def effective_tier(self, req: RequestView, e: EndpointView) -> Tier:
        """The tier, with an overloaded own-pool or mixed machine as the last resort."""
        t = self.tier(e)
        if t is not Tier.OPPOSITE and self.overloaded(req, e):
            return Tier.OVERLOADED
        return t

    def keep(self, req: RequestView, eps: Sequence[EndpointView]) -> list[EndpointView]:
        """The first tier with a machine that is not overloaded; else the opposite pool whole
        (borrowing); else every machine that accepts work (all of them overloaded)."""
        live = [e for e in eps if e.accepts_work]
        for t in (Tier.OWN, Tier.MIXED):
            ok = [e for e in live if self.tier(e) is t and not self.overloaded(req, e)]
            if ok:
                return ok
        opposite = [e for e in live if self.tier(e) is Tier.OPPOSITE]
        return opposite or live


@dataclass(frozen=True, slots=True)
class SplitwisePoolFilter(SplitwisePools):
    """Keep the machines of the pool this phase goes to now (own → mixed → borrow)."""

    kind: ClassVar[str] = "splitwise-pool"

    def filter(self, req: RequestView, eps: Sequence[EndpointView]) -> Sequence[EndpointView]:
        return self.pools.keep(req, eps)


@dataclass(frozen=True, slots=True)
class SplitwiseOverflow(SplitwisePools):
    """Tier bands (own > mixed > opposite > overloaded) with JSQ on the phase's queue inside."""

    kind: ClassVar[str] = "splitwise-overflow"

    def score(self, req: RequestView, eps: Sequence[EndpointView]) -> Mapping[EndpointId, float]:
        pools = self.pools
        queues = {e.id: pools.queue(e) for e in eps}
        lo = min(queues.values(), default=0.0)
        hi = max(queues.values(), default=0.0)
        span = hi - lo
        scores: dict[EndpointId, float] = {}
        for e in eps:
            jsq = 1.0 if span <= 0 else (hi - queues[e.id]) / span
            band = _BAND[pools.effective_tier(req, e)]
            scores[e.id] = (band + 0.999 * jsq) / 4.0
        return scores


class SplitwiseDecider(PdDecider):
    """`PdDecider` plus Splitwise's rule: when the prompt machine is also the best token machine,
    the request runs there whole (no KV transfer; SplitwiseSim's `p == t` case)."""

    def place(self, req: RequestView, eps: Sequence[EndpointView]) -> Placement:
        placement = super().place(req, eps)
        if placement.path is Path.DISAGGREGATED and placement.prefill[0] == placement.decode[0]:
            return Placement(Path.AGGREGATED, placement.decode, reason="same_worker")
        return placement


_conforms_filters: tuple[type[Filter], ...] = (SplitwisePoolFilter,)
_conforms_scorers: tuple[type[Scorer], ...] = (SplitwiseOverflow,)
