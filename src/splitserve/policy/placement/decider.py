"""The P/D decider: disaggregated (prefill worker -> decode worker) or aggregated.

`PdDeciderParams.mode` is the service's `router.disaggregation`:

* `NEVER`: always aggregated on a decode or mixed worker (reason `never`);
* `ALWAYS`: always split; aggregated only when no prefill worker accepts work
  (`no_prefill_worker`) — a failed prefill falls back at run time too;
* `AUTO` (default): aggregated when the prompt is shorter than `min_prompt_tokens_for_pd`
  (`short_prompt`), when no prefill worker accepts work (`no_prefill_worker`), or when the best
  prefill worker's predicted queueing + prefill would miss the request's TTFT deadline while the
  best decode-capable worker would meet it (`prefill_would_miss_ttft`: Splitwise's mixed pool);
  else split (`split`).

Reasons are short fixed strings (metric labels). No decode-capable worker at all is a
`NoEligibleEndpoint` naming why each endpoint was left out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from mypy_extensions import mypyc_attr

from splitserve.core.errors import NoEligibleEndpoint
from splitserve.core.ids import EndpointId
from splitserve.policy.placement.base import EndpointView, Path, Placement, RequestView
from splitserve.policy.placement.profile import Profile
from splitserve.policy.placement.slo import predicted_prefill_s, predicted_tpot_s


class Disaggregation(StrEnum):
    """When to split prefill and decode (the CRD's `router.disaggregation`)."""

    AUTO = "Auto"
    ALWAYS = "Always"
    NEVER = "Never"


REASONS = (
    "never",
    "short_prompt",
    "no_prefill_worker",
    "prefill_would_miss_ttft",
    "split",
)
"""Every `Placement.reason` the decider gives (bounded metric label values)."""


@dataclass(frozen=True, slots=True)
class PdDeciderParams:
    min_prompt_tokens_for_pd: int = 1
    """Prompts shorter than this run aggregated (Auto)."""
    mode: Disaggregation = Disaggregation.AUTO


def why_none(eps: Sequence[EndpointView]) -> str:
    """Why no endpoint can take work, by condition (for a 503 that says which)."""
    if not eps:
        return "no workers known"
    counts: dict[str, int] = {}
    for e in eps:
        if not e.role.can_decode:
            key = f"role {e.role.value}"
        elif e.fenced:
            key = "fenced"
        elif e.draining:
            key = "draining"
        elif not e.ready:
            key = "not ready (no live load stream)"
        else:
            key = "filtered out (KV full or scored out)"
        counts[key] = counts.get(key, 0) + 1
    return ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))


@mypyc_attr(allow_interpreted_subclasses=True)  # cluster set-ups specialise it (Splitwise)
class PdDecider:
    def __init__(
        self, decode: Profile, prefill: Profile, params: PdDeciderParams | None = None
    ) -> None:
        self.decode = decode
        self.prefill = prefill
        self.params = params or PdDeciderParams()

    def place(self, req: RequestView, eps: Sequence[EndpointView]) -> Placement:
        decode = tuple(self.decode.rank(req, eps))
        if not decode:
            raise NoEligibleEndpoint(
                f"no decode or mixed worker accepts work ({len(eps)} endpoints: {why_none(eps)})"
            )
        mode = self.params.mode
        if mode is Disaggregation.NEVER:
            return Placement(Path.AGGREGATED, decode, reason="never")
        if (
            mode is Disaggregation.AUTO
            and req.num_prompt_tokens < self.params.min_prompt_tokens_for_pd
        ):
            return Placement(Path.AGGREGATED, decode, reason="short_prompt")
        prefill = tuple(self.prefill.rank(req, eps))
        if not prefill:
            return Placement(Path.AGGREGATED, decode, reason="no_prefill_worker")
        if mode is Disaggregation.AUTO and self._aggregated_meets_slo_better(
            req, eps, prefill[0], decode[0]
        ):
            return Placement(Path.AGGREGATED, decode, reason="prefill_would_miss_ttft")
        return Placement(Path.DISAGGREGATED, decode, prefill, reason="split")

    @staticmethod
    def _aggregated_meets_slo_better(
        req: RequestView, eps: Sequence[EndpointView], p_id: EndpointId, d_id: EndpointId
    ) -> bool:
        """The prefill queue would miss the TTFT deadline, the decode worker would not (and
        keeps its TPOT target with the prompt's prefill added to its batch)."""
        budget = req.ttft_budget_s
        if budget is None:
            return False
        by_id = {e.id: e for e in eps}
        p, d = by_id.get(p_id), by_id.get(d_id)
        if p is None or d is None:
            return False
        on_p = predicted_prefill_s(p, req.num_prompt_tokens)
        on_d = predicted_prefill_s(d, req.num_prompt_tokens)
        if on_p is None or on_d is None or on_p <= budget or on_d > budget:
            return False
        tpot = predicted_tpot_s(d)
        return req.tpot_target_s is None or tpot is None or tpot <= req.tpot_target_s
