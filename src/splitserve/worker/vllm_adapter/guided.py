"""Guided decoding (vLLM's structured outputs) for our engine, P/D included.

A request's `SamplingSpec.structured_outputs` (vLLM's `StructuredOutputsParams` as JSON) becomes
`SamplingParams.structured_outputs` on every worker that samples for it: the prefill worker
samples the first token under the grammar, like the decode worker samples the rest.

The decode worker continues from the prefill's first token, which vLLM sees as the last prompt
token; its grammar would start from the beginning and allow a second opening. `GrammarCatchUp`
advances the decode request's grammar past that token (vLLM's own `accept_tokens`) once the
grammar is compiled and before the scheduler builds the first step's token bitmask, so the
decode samples token 2 exactly where an aggregated run's grammar would be.

vLLM's scheduler knows a request by its *internal* id: `LLMEngine.add_request` appends eight
random characters to the id it is given and returns the result. The catch-up must be keyed by
that id (`GrammarCatchUp.add_request`); keyed by ours it found no request, took it for an
aborted one, and the decode's grammar started again (`{{` in the P/D contract test).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any, Final

from splitserve.core.request import Request

log = logging.getLogger(__name__)


GENERATED_KEY: Final = "splitserve_generated"
"""The router's key in a takeover's structured-outputs JSON (`Generate` with the prompt plus the
tokens already sent, after a decode failed): how many of the prompt's last tokens are generated
output, which the grammar accepts before the request samples. Not one of vLLM's fields."""


def accepted_tokens(request: Request, mode: str) -> tuple[int, ...]:
    """Tokens the request's grammar must accept before it samples: a decode's first token (the
    prefill's, its last prompt token), or a takeover's generated tokens; () without a grammar.

    Raises:
        ValueError: a takeover count that is not an integer in [0, prompt length).
    """
    spec = request.sampling.structured_outputs
    if not spec:
        return ()
    if mode == "decode":
        return request.prompt_token_ids[-1:]
    n = json.loads(spec).get(GENERATED_KEY, 0) if mode == "generate" else 0
    if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n < request.num_prompt_tokens:
        raise ValueError(f"sampling.structured_outputs.{GENERATED_KEY} must be in [0, prompt)")
    return request.prompt_token_ids[request.num_prompt_tokens - n :] if n else ()


def structured_params(spec: str) -> Any:
    """vLLM's `StructuredOutputsParams` of a request (None when it asks for none).

    Raises:
        ValueError: `spec` is not a JSON object of `StructuredOutputsParams`' fields, or has
            not exactly one constraint.
    """
    if not spec:
        return None
    from vllm.sampling_params import StructuredOutputsParams

    fields = json.loads(spec)
    if not isinstance(fields, dict):
        raise ValueError("sampling.structured_outputs must be a JSON object")
    fields.pop(GENERATED_KEY, None)  # ours (`accepted_tokens`), not vLLM's
    from vllm.exceptions import VLLMClientError

    try:
        return StructuredOutputsParams(**fields)
    except (TypeError, VLLMClientError) as err:  # an unknown key, not exactly one constraint
        raise ValueError(f"sampling.structured_outputs: {err}") from err


def check(engine: Any, sampling: Any) -> None:
    """vLLM's own validation of `sampling`'s constraint (a regex, schema or grammar its backend
    cannot take), on the caller's side, before the request reaches the engine thread.

    Raises:
        ValueError: naming what is wrong (the worker answers INVALID_ARGUMENT, the router 400).
    """
    if sampling.structured_outputs is None:
        return
    from vllm.exceptions import VLLMClientError

    cfg = engine.vllm_config
    try:
        sampling.verify(
            cfg.model_config,
            cfg.speculative_config,
            cfg.structured_outputs_config,
            engine.input_processor.tokenizer,
        )
    except VLLMClientError as err:  # vLLM's 4xx errors are not ValueErrors
        raise ValueError(f"sampling.structured_outputs: {err}") from err


def engine_config(args: dict[str, Any]) -> None:
    """`--structured-outputs-config '{"disable_any_whitespace": true}'` (a worker engine
    argument, JSON) as vLLM's `StructuredOutputsConfig`, in place. vLLM 0.32 reads the
    whitespace and additional-properties options there, for every request of the engine."""
    so = args.get("structured_outputs_config")
    if isinstance(so, dict):
        from vllm.config import StructuredOutputsConfig

        args["structured_outputs_config"] = StructuredOutputsConfig(**so)


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

    def add_request(
        self, engine: Any, request_id: str, prompt: Any, sampling: Any, accepted: Sequence[int]
    ) -> str:
        """`engine.add_request(...)`; when `accepted` (tokens the grammar must take before the
        request samples) is not empty, expect them under the id vLLM's scheduler uses, which
        `add_request` returns. Returns that id."""
        internal = engine.add_request(request_id, prompt, sampling)
        internal = request_id if internal is None else str(internal)
        if accepted:
            self.expect(internal, accepted)
        return internal

    def expect(self, request_id: str, tokens: Sequence[int]) -> None:
        """`request_id` (vLLM's internal id: see `add_request`)'s grammar must accept `tokens`
        before it samples its first token."""
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
