"""The P/D decider: disaggregated (prefill worker -> decode worker) or aggregated.

Aggregated when no prefill worker can take the request, or when the prompt is so short that a KV
handoff costs more than it saves (`min_prompt_tokens_for_pd`). No decode-capable worker at all is
a `NoEligibleEndpoint`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from mypy_extensions import mypyc_attr

from splitserve.core.errors import NoEligibleEndpoint
from splitserve.policy.placement.base import EndpointView, Path, Placement, RequestView
from splitserve.policy.placement.profile import Profile


@dataclass(frozen=True, slots=True)
class PdDeciderParams:
    min_prompt_tokens_for_pd: int = 1
    """Prompts shorter than this run aggregated."""


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
                f"no decode or mixed worker accepts work ({len(eps)} endpoints known)"
            )
        if req.num_prompt_tokens < self.params.min_prompt_tokens_for_pd:
            return Placement(Path.AGGREGATED, decode, reason="short prompt")
        prefill = tuple(self.prefill.rank(req, eps))
        if not prefill:
            return Placement(Path.AGGREGATED, decode, reason="no prefill worker available")
        return Placement(Path.DISAGGREGATED, decode, prefill, reason="prefill and decode available")
