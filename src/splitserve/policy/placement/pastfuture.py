"""Past-Future's future-peak KV headroom as a placement scorer ("pastfuture-peak-kv").

Past-Future (Gong et al.; research/seed-pastfuture-alise.md) admits a request into a batch only
when the batch's *future peak* KV use fits: each running request j holds ctx_j + k tokens k steps
from now until it finishes after rem_j more tokens, so the batch's KV over time peaks just before
some request finishes. Placing by that peak (instead of today's free blocks) sends a request
where it will still fit when the long decodes already there have grown.

Score of an endpoint, in [0, 1]: 1 - peak / capacity with the new request added (0 when the peak
overflows), where capacity = total KV tokens. Ongoing requests per endpoint come from `load_of`
(the owner's request table: the router's ledger, or the simulator's); without it, the view
alone: the KV in use now as one request that never grows, plus the new request.
Remaining lengths use `OngoingRequest.predicted_output_tokens` (re-predicted as one more token
once outlived). Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from splitserve.core.ids import EndpointId
from splitserve.policy.placement.aladdin import OngoingRequest, WorkerLoad
from splitserve.policy.placement.base import EndpointView, RequestView, Scorer


def future_peak_tokens(requests: Sequence[tuple[int, int]]) -> int:
    """max over future steps k of Σ_{j: rem_j >= k} (ctx_j + k), for (ctx, rem) pairs."""
    if not requests:
        return 0
    ordered = sorted(requests, key=lambda cr: cr[1])
    n = len(ordered)
    suffix_ctx = [0] * (n + 1)
    for i in range(n - 1, -1, -1):
        suffix_ctx[i] = suffix_ctx[i + 1] + ordered[i][0]
    peak = 0
    for i, (_, rem) in enumerate(ordered):
        alive = n - i
        peak = max(peak, suffix_ctx[i] + alive * rem)
    return peak


@dataclass(frozen=True, slots=True)
class FuturePeakKv:
    kind: ClassVar[str] = "pastfuture-peak-kv"
    load_of: Callable[[EndpointId], WorkerLoad] | None = field(default=None, compare=False)

    def _pairs(self, e: EndpointView) -> list[tuple[int, int]]:
        if self.load_of is None:
            used = max(0, e.kv_total_blocks - e.kv_free_blocks) * e.kv_block_size
            return [(used, 0)] if used else []
        return [
            (r.num_prompt_tokens + r.num_generated_tokens, _remaining(r))
            for r in self.load_of(e.id).requests
        ]

    def score(self, req: RequestView, eps: Sequence[EndpointView]) -> Mapping[EndpointId, float]:
        out = (
            req.predicted_output_tokens
            if req.predicted_output_tokens is not None
            else (req.max_tokens)
        )
        new = (req.num_prompt_tokens, max(1, out))
        scores: dict[EndpointId, float] = {}
        for e in eps:
            capacity = e.kv_total_blocks * e.kv_block_size
            if capacity <= 0:
                scores[e.id] = 0.0
                continue
            peak = future_peak_tokens([*self._pairs(e), new])
            scores[e.id] = min(1.0, max(0.0, 1.0 - peak / capacity))
        return scores


def _remaining(r: OngoingRequest) -> int:
    return max(1, r.predicted_output_tokens - r.num_generated_tokens)


_conforms: tuple[type[Scorer], ...] = (FuturePeakKv,)
