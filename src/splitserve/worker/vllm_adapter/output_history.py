"""The prefill's first token as *output* in the decode engine's sampler (P/D).

A decode continues from the prefill's first token, which vLLM sees as the last prompt token.
vLLM's sampler reads a request's output tokens for the presence and frequency penalties and
for multi-token `bad_words` (a word's last token is banned after its other tokens were
generated), so the decode's token 2 would be sampled as if token 1 had not been generated:
P/D would differ from aggregated serving.

`FirstTokenAsOutput` moves that token from the prompt to the output in the model runner's copy
of the request (`CachedRequestState`), before the runner's persistent batch takes it in
(`InputBatch.add_request`, wrapped on this runner's instance). The token count is unchanged
(positions, KV and the scheduler's view stay as they are); the sampler then sees exactly
the history an aggregated run has after its first token. The repetition penalty covers prompt
and output, so it is unchanged.

vLLM's scheduler keeps counting its own output tokens (the decode's, without token 1), and
the runner trims a request's output list to the scheduler's count each step
(`GPUModelRunner._update_states`, for discarded tokens): for a moved request the count the
runner is handed is raised by the tokens moved (`_update_states` wrapped too) until the request
finishes. vLLM's `min_tokens` logits processor counts the runner's output list: the decode's
`SamplingParams` asks for one fewer (`engine.sampling_kwargs(continued=True)`, what the
scheduler needs), and the runner's copy gets that one back.

Keyed by vLLM's internal request id (`LLMEngine.add_request` returns it: see guided.py).
Lives on the engine thread: `expect` where requests are added, the wrapper inside
`engine.step()`. Needs vLLM's in-process V1 model runner (`VLLM_ENABLE_V1_MULTIPROCESSING=0`,
what `VllmEngine` runs); `install` returns None when the runner is not reachable there.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

log = logging.getLogger(__name__)

MAX_PENDING = 4096
"""Expected requests remembered at most (far more than an engine admits between two steps)."""


class FirstTokenAsOutput:
    """Counts the last `n` prompt tokens of expected requests as already generated output."""

    def __init__(self) -> None:
        self._pending: dict[str, int] = {}
        self._moved: dict[str, int] = {}

    @classmethod
    def install(cls, core: Any) -> FirstTokenAsOutput | None:
        """Wrap the persistent batch's `add_request` of `core`'s (vLLM's in-process
        `EngineCore`) model runner; None when there is none (another executor or runner)."""
        runner = model_runner(core)
        batch: Any = getattr(runner, "input_batch", None)
        add = getattr(batch, "add_request", None)
        update = getattr(runner, "_update_states", None)
        if add is None or update is None:
            log.warning(
                "vLLM's model runner is not reachable in this process: in P/D, presence / "
                "frequency penalties and multi-token bad_words will not count the first token"
            )
            return None
        seeded = cls()

        def add_request(request: Any) -> Any:
            if seeded._pending:
                seeded.apply(request)
            return add(request)

        def update_states(scheduler_output: Any) -> Any:
            if seeded._moved:
                seeded.recount(scheduler_output)
            return update(scheduler_output)

        batch.add_request = add_request
        runner._update_states = update_states
        return seeded

    def expect(self, request_id: str, n: int = 1) -> None:
        """`request_id` (vLLM's internal id)'s last `n` prompt tokens are output.

        A request aborted before its first step leaves its entry (internal ids are unique);
        past `MAX_PENDING` entries the oldest go."""
        if n <= 0:
            return
        self._pending[request_id] = n
        while len(self._pending) > MAX_PENDING:
            del self._pending[next(iter(self._pending))]

    @property
    def num_pending(self) -> int:
        return len(self._pending)

    @property
    def num_moved(self) -> int:
        return len(self._moved)

    def recount(self, scheduler_output: Any) -> None:
        """Raise the scheduler's output-token counts of moved requests by the tokens moved (in
        the step's `CachedRequestData`, built anew each step); forget finished requests."""
        for rid in scheduler_output.finished_req_ids:
            self._moved.pop(rid, None)
        cached = scheduler_output.scheduled_cached_reqs
        counts = cached.num_output_tokens
        for i, rid in enumerate(cached.req_ids):
            n = self._moved.get(rid)
            if n:
                counts[i] += n

    def apply(self, state: Any) -> None:
        """Move the tail of `state`'s (a `CachedRequestState`) prompt to its output, once."""
        n = self._pending.pop(str(state.req_id), 0)
        prompt = state.prompt_token_ids
        if not n or prompt is None or len(prompt) <= n or state.output_token_ids:
            return
        state.prompt_token_ids = list(prompt[:-n])
        state.num_prompt_tokens -= n
        state.output_token_ids[:0] = prompt[-n:]
        self._moved[str(state.req_id)] = n
        params = state.sampling_params
        if params is not None and params.min_tokens:
            params = copy.copy(params)  # the scheduler's copy keeps counting without them
            params.min_tokens += n
            state.sampling_params = params


def model_runner(core: Any) -> Any:
    """The model runner of vLLM's in-process engine core (UniProcExecutor), or None."""
    executor = getattr(core, "model_executor", None)
    driver = getattr(executor, "driver_worker", None)
    worker = getattr(driver, "worker", None)
    return getattr(worker, "model_runner", None)
