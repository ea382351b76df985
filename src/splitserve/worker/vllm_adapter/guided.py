"""Guided decoding (vLLM's structured outputs) for our engine, P/D included.

A request's `SamplingSpec.structured_outputs` (vLLM's `StructuredOutputsParams` as JSON) becomes
`SamplingParams.structured_outputs` on every worker that samples for it: the prefill worker
samples the first token under the grammar, like the decode worker samples the rest.

The decode worker continues from the prefill's first token, which vLLM sees as the last prompt
token; its grammar would start from the beginning and allow a second opening. `GrammarCatchUp`
advances the decode request's grammar past that token (vLLM's own `accept_tokens`) once the
grammar is compiled and before the scheduler builds the first step's token bitmask, so the
decode samples token 2 exactly where an aggregated run's grammar would be.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

log = logging.getLogger(__name__)


def structured_params(spec: str) -> Any:
    """vLLM's `StructuredOutputsParams` of a request (None when it asks for none)."""
    if not spec:
        return None
    from vllm.sampling_params import StructuredOutputsParams

    return StructuredOutputsParams(**json.loads(spec))


class GrammarCatchUp:
    """Advances the grammars of continued (decode) requests past the tokens they already have.

    Lives on the engine thread: `expect` is called where requests are added, and the wrapped
    `get_grammar_bitmask` runs inside `engine.step()`.
    """

    def __init__(self) -> None:
        self._pending: dict[str, list[int]] = {}

    @classmethod
    def install(cls, sched: Any) -> GrammarCatchUp:
        """Wrap `sched.get_grammar_bitmask` (on this scheduler instance)."""
        catch_up = cls()
        bitmask = sched.get_grammar_bitmask

        def advanced_first(scheduler_output: Any) -> Any:
            if catch_up._pending:
                catch_up.advance(sched.requests)
            return bitmask(scheduler_output)

        sched.get_grammar_bitmask = advanced_first
        return catch_up

    def expect(self, request_id: str, tokens: Sequence[int]) -> None:
        """`request_id`'s grammar must accept `tokens` before it samples its first token."""
        self._pending[request_id] = list(tokens)

    @property
    def num_pending(self) -> int:
        return len(self._pending)

    def advance(self, requests: Any) -> None:
        for rid in list(self._pending):
            req = requests.get(rid)
            so = None if req is None else req.structured_output_request
            if so is None:  # gone (aborted, finished) or unguided: nothing to advance
                del self._pending[rid]
                continue
            grammar = so.grammar  # None while vLLM still compiles it
            if grammar is None:
                continue
            tokens = self._pending.pop(rid)
            if isinstance(grammar, Exception):
                continue  # vLLM fails the request itself
            if not grammar.accept_tokens(rid, tokens):
                log.warning("grammar of %s rejected its first token(s) %s", rid, tokens)
