"""SLO-headroom scorers: how far each worker's predicted latency stays inside the request's SLO.

Predictions come from the latency model the owner fitted for each worker and put on its
`EndpointView` (`prefill_tokens_per_s`, `decode_step_base_s` + `decode_step_per_seq_s` x batch):

* `predicted_prefill_s(e, tokens)`: queueing plus prefill on `e`, = (pending prefill tokens +
  the prompt) / prefill throughput (the queue drains at the fitted rate);
* `predicted_tpot_s(e)`: one more request in `e`'s decode batch, = base + per_seq x (batch + 1);
* `predicted_pull_s(e, tokens)`: a prompt's KV pulled into `e`, behind the pulls already placed
  there, = (pending pull tokens + the prompt) / pull throughput (`PdDecider`'s
  `pull_would_miss_tpot`).

Scorers (registered names in quotes), all in [0, 1], higher better:

* `TtftHeadroom` ("slo-ttft-headroom"): (budget - predicted prefill) / budget, where budget is
  the request's seconds left to its TTFT deadline; 0 when it would miss;
* `TpotHeadroom` ("slo-tpot-headroom"): (target - predicted TPOT) / target.

A worker with no estimate yet (cold start) or a request without an SLO scores `neutral` (0.5),
so the other scorers of the profile decide. Pure: no I/O, no clock.

Invariants (property-tested): scores lie in [0, 1]; a worker whose prediction is worse never
scores higher than one whose prediction is better.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

from splitserve.core.ids import EndpointId
from splitserve.policy.placement.base import EndpointView, RequestView, Scorer


def predicted_prefill_s(e: EndpointView, num_prompt_tokens: int) -> float | None:
    """Queueing + prefill of a prompt on `e`; None without a throughput estimate."""
    if e.prefill_tokens_per_s <= 0:
        return None
    return (e.pending_prefill_tokens + num_prompt_tokens) / e.prefill_tokens_per_s


def predicted_tpot_s(e: EndpointView, extra: int = 1) -> float | None:
    """Decode step time with `extra` more requests in `e`'s batch; None without an estimate."""
    if e.decode_step_base_s <= 0 and e.decode_step_per_seq_s <= 0:
        return None
    return e.decode_step_base_s + e.decode_step_per_seq_s * (e.batch + extra)


def predicted_pull_s(e: EndpointView, num_prompt_tokens: int) -> float | None:
    """When a prompt's KV pulled into `e` now would have arrived: the pulls ahead of it plus its
    own, = (pending pull tokens + the prompt) / pull throughput; None without an estimate."""
    if e.kv_pull_tokens_per_s <= 0:
        return None
    return (e.pending_pull_tokens + num_prompt_tokens) / e.kv_pull_tokens_per_s


def headroom(budget_s: float | None, predicted_s: float | None, neutral: float) -> float:
    """(budget - predicted) / budget in [0, 1]; `neutral` when either is unknown."""
    if budget_s is None or predicted_s is None:
        return neutral
    if budget_s <= 0:
        return 0.0
    return min(1.0, max(0.0, (budget_s - predicted_s) / budget_s))


@dataclass(frozen=True, slots=True)
class TtftHeadroom:
    kind: ClassVar[str] = "slo-ttft-headroom"
    neutral: float = 0.5

    def score(self, req: RequestView, eps: Sequence[EndpointView]) -> Mapping[EndpointId, float]:
        return {
            e.id: headroom(
                req.ttft_budget_s, predicted_prefill_s(e, req.num_prompt_tokens), self.neutral
            )
            for e in eps
        }


@dataclass(frozen=True, slots=True)
class TpotHeadroom:
    kind: ClassVar[str] = "slo-tpot-headroom"
    neutral: float = 0.5

    def score(self, req: RequestView, eps: Sequence[EndpointView]) -> Mapping[EndpointId, float]:
        return {e.id: headroom(req.tpot_target_s, predicted_tpot_s(e), self.neutral) for e in eps}


_conforms: tuple[type[Scorer], ...] = (TtftHeadroom, TpotHeadroom)
