"""FCFS with `prefill_priority` (vLLM v0.2 scheduling, DistServe's colocated baseline).

Invariants:
1. a step that can admit a waiting prompt runs prompts only (no decode rides along);
2. with nothing admissible waiting, running sequences decode as plain FCFS would;
3. the default (off) is unchanged: decodes and new prompts share a step.
"""

from __future__ import annotations

from splitserve.core.ids import RequestId
from splitserve.policy.batching import FcfsParams, FcfsPolicy, SeqView, StepView


def seq(rid: str, prompt: int, outputs: int = 0, computed: int = 0, blocks: int = 0) -> SeqView:
    return SeqView(
        id=RequestId(rid),
        arrival_s=0.0,
        num_prompt_tokens=prompt,
        num_output_tokens=outputs,
        num_computed_tokens=computed,
        max_tokens=100,
        blocks_held=blocks,
    )


DECODING = seq("d", 16, outputs=3, computed=18, blocks=2)


def view(waiting: tuple[SeqView, ...], free: int = 100) -> StepView:
    return StepView(0.0, waiting, (DECODING,), free, 102, 16)


def test_prompts_run_alone() -> None:
    policy = FcfsPolicy(FcfsParams(chunked_prefill=False, prefill_priority=True))
    decision = policy.decide(view((seq("w", 64),)))
    assert decision.chunks == ((RequestId("w"), 64),)


def test_decodes_run_when_nothing_fits() -> None:
    policy = FcfsPolicy(FcfsParams(chunked_prefill=False, prefill_priority=True))
    assert policy.decide(view((seq("w", 64),), free=1)).chunks == ((RequestId("d"), 1),)
    assert policy.decide(view(())).chunks == ((RequestId("d"), 1),)


def test_default_mixes_decodes_and_prompts() -> None:
    decision = FcfsPolicy(FcfsParams(chunked_prefill=False)).decide(view((seq("w", 64),)))
    assert decision.chunks == ((RequestId("d"), 1), (RequestId("w"), 64))
