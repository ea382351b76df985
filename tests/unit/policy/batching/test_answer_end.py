"""Answers that end by themselves on the simulated engine (`SyntheticTokens.answer_median`).

Invariants:
1. each request's answer length is a deterministic function of its prompt and seed, at least 1,
   lognormal around the median (sigma 0: exactly the median);
2. the engine ends the answer there with the end-of-text id (finish `stop`), unless `ignore_eos`
   (then it runs to `max_tokens`); `min_tokens` moves the end to the first position allowed and
   keeps stop tokens out of the positions before it;
3. P/D (prefill here, decode there), fused decode runs and one-at-a-time steps give the same
   tokens and the same finish;
4. without an answer length (the simulator's mode, and `answer_median` 0) nothing changes.
"""

from __future__ import annotations

import csv
import math
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from splitserve.core.ids import RequestId
from splitserve.core.kv import BlockManager
from splitserve.core.request import FinishReason, Request, SamplingSpec
from splitserve.policy.batching import EngineModel, FcfsParams, FcfsPolicy
from splitserve.policy.batching.engine import RequestMode
from splitserve.policy.batching.tokens import (
    DEFAULT_ANSWER_SIGMA,
    DEFAULT_ANSWER_TOKENS,
    SyntheticTokens,
)
from splitserve.sim.traces import bundled_trace

EOS = 1
ENDING = SyntheticTokens(vocab_size=1000, first_id=10, eos_id=EOS, answer_median=12)
NEVER = SyntheticTokens(vocab_size=1000, first_id=10)


def make_request(prompt: tuple[int, ...], **sampling: object) -> Request:
    spec = SamplingSpec(**{"max_tokens": 200, **sampling})  # type: ignore[arg-type]
    return Request(RequestId("r"), prompt, spec, 0.0)


def generate(
    tokens: SyntheticTokens, req: Request, max_repeat: int = 1
) -> tuple[list[int], FinishReason | None]:
    """The answer's tokens and its finish reason, stepping until idle."""
    engine = EngineModel(
        FcfsPolicy(FcfsParams(max_num_batched_tokens=512)), BlockManager(64, 16), tokens
    )
    engine.add(req, RequestMode.GENERATE)
    return generate_added(engine, req.id, max_repeat)


def generate_added(
    engine: EngineModel, rid: RequestId, max_repeat: int
) -> tuple[list[int], FinishReason | None]:
    """Steps `engine` until idle. A fused run reports its last token only; the ones before it
    are read from the engine's outputs (-1 where a finishing run hid them)."""
    reason: FinishReason | None = None
    outputs: list[int] = list(engine.output_ids(rid))
    now = 0.0
    while (step := engine.schedule(now, max_repeat)) is not None:
        for transfer in step.transfers:  # a decode's KV arrives at once
            engine.finish_transfer(transfer)
        now += 1.0
        for ev in engine.complete(step, now).tokens:
            if ev.finish_reason is not None:
                reason = ev.finish_reason
                hidden = ev.index - len(outputs)
                outputs = [*outputs, *[-1] * hidden, ev.token_id]
            else:
                outputs = list(engine.output_ids(rid))
    return outputs, reason


def same(a: list[int], b: list[int]) -> bool:
    """Equal lengths, equal tokens wherever both saw one."""
    return len(a) == len(b) and all(x == y or -1 in (x, y) for x, y in zip(a, b, strict=True))


prompts = st.lists(st.integers(10, 999), min_size=1, max_size=30).map(tuple)


@given(prompts, st.integers(0, 3))
def test_answer_length_is_deterministic_and_positive(prompt: tuple[int, ...], seed: int) -> None:
    key = ENDING.key(prompt, seed)
    n = ENDING.answer_length(key)
    assert n >= 1
    assert ENDING.answer_length(ENDING.key(list(prompt), seed)) == n
    assert NEVER.answer_length(key) == 0


def test_answer_lengths_are_lognormal_around_the_median() -> None:
    t = SyntheticTokens(vocab_size=1000, eos_id=EOS, answer_median=128, answer_sigma=1.0)
    lengths = [t.answer_length(t.key((i, i + 1), None)) for i in range(4000)]
    assert 115 <= statistics.median(lengths) <= 141
    short = sum(n <= 47 for n in lengths) / len(lengths)  # exp(-1) * 128: one sigma below
    assert 0.13 <= short <= 0.19
    flat = SyntheticTokens(vocab_size=1000, eos_id=EOS, answer_median=50, answer_sigma=0.0)
    assert {flat.answer_length(flat.key((i,), None)) for i in range(100)} == {50}


@settings(max_examples=50, deadline=None)
@given(prompts)
def test_answer_ends_with_end_of_text_at_its_length(prompt: tuple[int, ...]) -> None:
    req = make_request(prompt)
    n = ENDING.answer_length(ENDING.key(prompt, None))
    out, reason = generate(ENDING, req)
    if n <= 200:
        assert len(out) == n
        assert out[-1] == EOS
        assert EOS not in out[:-1]
        assert reason is FinishReason.STOP
    else:
        assert len(out) == 200
        assert reason is FinishReason.LENGTH


@settings(max_examples=30, deadline=None)
@given(prompts)
def test_ignore_eos_runs_to_max_tokens_with_the_same_tokens(prompt: tuple[int, ...]) -> None:
    out, reason = generate(ENDING, make_request(prompt, ignore_eos=True, max_tokens=60))
    plain, _ = generate(NEVER, make_request(prompt, max_tokens=60))
    assert reason is FinishReason.LENGTH
    assert out == plain
    ended, _ = generate(ENDING, make_request(prompt, max_tokens=60))
    assert ended in (out, [*out[: len(ended) - 1], EOS])


@settings(max_examples=30, deadline=None)
@given(prompts, st.integers(1, 80))
def test_min_tokens_moves_the_end_and_masks_stop_tokens(
    prompt: tuple[int, ...], min_tokens: int
) -> None:
    n = ENDING.answer_length(ENDING.key(prompt, None))
    end = max(n, min_tokens + 1)
    # room past the end (a drawn length can exceed make_request's 200: prompt (111,) gives 263)
    out, reason = generate(ENDING, make_request(prompt, min_tokens=min_tokens, max_tokens=end + 1))
    assert len(out) == end
    assert reason is FinishReason.STOP
    # a small vocabulary, half of it stop tokens: none of them before min_tokens
    small = SyntheticTokens(vocab_size=20, first_id=10)
    stops = tuple(range(15, 20))
    masked, why = generate(small, make_request(prompt, min_tokens=min_tokens, stop_token_ids=stops))
    assert len(masked) > min_tokens
    assert not set(masked[:min_tokens]) & set(stops)
    assert masked[-1] in stops
    assert why is FinishReason.STOP


@settings(max_examples=30, deadline=None)
@given(prompts, st.integers(0, 5))
def test_pd_split_and_fused_runs_end_where_aggregated_does(
    prompt: tuple[int, ...], min_tokens: int
) -> None:
    req = make_request(prompt, min_tokens=min_tokens)
    whole, reason = generate(ENDING, req)
    fused, fused_reason = generate(ENDING, req, max_repeat=1 << 20)
    assert same(fused, whole)
    assert fused_reason is reason
    policy = FcfsPolicy(FcfsParams(max_num_batched_tokens=512))
    p = EngineModel(policy, BlockManager(64, 16), ENDING)
    p.add(req, RequestMode.PREFILL)
    step = p.schedule(0.0)
    assert step is not None
    first = p.complete(step, 1.0).tokens[0]
    assert first.token_id == whole[0]
    if first.finish_reason is not None:  # ended at its first token: nothing to decode
        assert (len(whole), reason) == (1, first.finish_reason)
        with pytest.raises(ValueError, match="nothing to decode"):
            EngineModel(policy, BlockManager(64, 16), ENDING).add(
                req, RequestMode.DECODE, first_token_id=first.token_id
            )
        return
    d = EngineModel(policy, BlockManager(64, 16), ENDING)
    d.add(req, RequestMode.DECODE, first_token_id=first.token_id)
    decoded, decoded_reason = generate_added(d, req.id, max_repeat=1 << 20)
    assert decoded[0] == first.token_id
    assert same(decoded, whole)
    assert decoded_reason is reason


def test_the_defaults_are_the_conversation_traces() -> None:
    """`DEFAULT_ANSWER_TOKENS` / `DEFAULT_ANSWER_SIGMA` say they are the bundled Azure
    conversation trace's median and log spread: held to the trace, and the engine's draws hold
    the same median."""
    with bundled_trace("conv").open() as f:
        lengths = [int(row["GeneratedTokens"]) for row in csv.DictReader(f)]
    lengths = [n for n in lengths if n > 0]
    assert abs(statistics.median(lengths) - DEFAULT_ANSWER_TOKENS) <= 2
    logs = [math.log(n) for n in lengths]
    assert abs(statistics.pstdev(logs) - DEFAULT_ANSWER_SIGMA) <= 0.01
    t = SyntheticTokens(
        4096, 16, eos_id=EOS, answer_median=DEFAULT_ANSWER_TOKENS, answer_sigma=DEFAULT_ANSWER_SIGMA
    )
    drawn = [t.answer_length(t.key((i, 2 * i + 1), None)) for i in range(4000)]
    assert abs(statistics.median(drawn) - DEFAULT_ANSWER_TOKENS) <= 8
    spread = statistics.pstdev(math.log(n) for n in drawn)
    assert abs(spread - DEFAULT_ANSWER_SIGMA) <= 0.05


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="eos_id"):
        SyntheticTokens(vocab_size=100, answer_median=10)
    with pytest.raises(ValueError, match="eos_id"):
        SyntheticTokens(vocab_size=100, eos_id=-2, answer_median=10)
    above = SyntheticTokens(vocab_size=100, eos_id=128, answer_median=10)  # specials on top
    assert above.at(above.key((1,), None), 0, SamplingSpec(max_tokens=5), 0) == 128
    with pytest.raises(ValueError, match="answer_median"):
        SyntheticTokens(vocab_size=100, eos_id=1, answer_median=-1)
