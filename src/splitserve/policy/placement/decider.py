"""The P/D decider: disaggregated (prefill worker -> decode worker) or aggregated.

`PdDeciderParams.mode` is the service's `router.disaggregation`:

* `NEVER`: always aggregated on a decode or mixed worker (reason `never`);
* `ALWAYS`: always split; aggregated only when no prefill worker accepts work
  (`no_prefill_worker`) — a failed prefill falls back at run time too;
* `AUTO` (default): aggregated when the prompt is shorter than `min_prompt_tokens_for_pd`
  (`short_prompt`), when no prefill worker accepts work (`no_prefill_worker`), or when the best
  prefill worker's predicted queueing + prefill would miss the request's TTFT deadline while the
  best decode-capable worker would meet it (`prefill_would_miss_ttft`: Splitwise's mixed pool);
  when the KV pull between token 1 and token 2 would by itself break the request's TPOT
  target while a decode-capable worker can run the whole request within its TTFT deadline
  (`pull_would_miss_tpot`, below); else split (`split`).

`pull_would_miss_tpot`: a split request's first token comes from the prefill worker, the
decode worker pulls the prompt's KV, then generates the rest, so the pull is spread over the
request's n - 1 inter-token gaps. With pull = `predicted_pull_s(decode worker)` (the pulls
placed there before it plus its own, over the worker's fitted pull rate) and n the *predicted*
output length (`RequestView.predicted_output_tokens`, else `max_tokens`: never the true
length, which a live router does not know), the rule fires when n >= 2 and pull / (n - 1) >
the TPOT target. The request then runs aggregated on the first worker of the decode ranking
whose predicted prefill meets the TTFT budget, whose predicted TPOT (when estimated) meets
the target and, when it already runs requests, whose TPOT plus the prompt's prefill time
spread over n - 1 gaps still meets it (the prefill stalls the requests decoding there once;
the request's own n stands in for theirs). No such worker, no TTFT budget, no TPOT target or
no pull estimate: split as before. Monotone: a longer predicted pull never turns an
aggregated decision back into a split.

Not on the prefill worker that would have run the prompt, even where its role could
generate: in the simulator (Azure code trace, `--quick`, static P14:D6, true lengths) a mixed
prefill worker keeping such requests met 96.90 % against 99.17 % on decode workers, its
decode steps stalled behind the long prompts it prefills back to back (docs/benchmarks.md,
2026-11-27).

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
from splitserve.policy.placement.slo import (
    predicted_prefill_s,
    predicted_pull_s,
    predicted_tpot_s,
)


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
    "pull_would_miss_tpot",
    "split",
    "same_worker",
)
"""Every `Placement.reason` the deciders give (bounded metric label values); `same_worker`:
`SplitwiseDecider`, the prompt and token machine coincide (the request runs there whole)."""


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
        if mode is Disaggregation.AUTO:
            whole = self._pull_would_miss_tpot(req, eps, decode)
            if whole is not None:
                return Placement(Path.AGGREGATED, whole, reason="pull_would_miss_tpot")
        return Placement(Path.DISAGGREGATED, decode, prefill, reason="split")

    @staticmethod
    def _pull_would_miss_tpot(
        req: RequestView,
        eps: Sequence[EndpointView],
        decode: tuple[EndpointId, ...],
    ) -> tuple[EndpointId, ...] | None:
        """The aggregated candidates (the chosen one first) when the split's KV pull alone
        would break the TPOT target and a decode-capable worker meets TTFT running the whole
        request; None: split. See the module docstring."""
        target, budget = req.tpot_target_s, req.ttft_budget_s
        if target is None or budget is None or not decode:
            return None
        n = req.predicted_output_tokens
        if n is None:
            n = req.max_tokens
        if n < 2:
            return None  # one token: no inter-token gap for the pull to stretch
        by_id = {e.id: e for e in eps}
        d = by_id.get(decode[0])
        if d is None:
            return None
        pull = predicted_pull_s(d, req.num_prompt_tokens)
        if pull is None or pull <= target * (n - 1):
            return None
        for eid in decode:
            e = by_id.get(eid)
            if e is None or not e.role.can_generate:
                continue
            on_e = predicted_prefill_s(e, req.num_prompt_tokens)
            if on_e is None or on_e > budget:
                continue
            tpot = predicted_tpot_s(e)
            if tpot is not None and tpot > target:
                continue
            if e.batch > 0:
                # The prompt's prefill stalls the requests already decoding on `e` for about
                # its own compute time, once: spread over their gaps (the request's own
                # predicted n stands in for theirs), it must not break their TPOT either.
                stall = req.num_prompt_tokens / e.prefill_tokens_per_s
                if (tpot or 0.0) + stall / (n - 1) > target:
                    continue
            return (eid, *(x for x in decode if x != eid))
        return None

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
