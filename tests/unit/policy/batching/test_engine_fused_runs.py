"""Fused decode runs in the engine model (the simulator's speed path).

Invariants:
1. a fused run of k steps leaves the engine (outputs, computed tokens, blocks, token ids) exactly
   as k single steps would;
2. a run never crosses a finish: the run ends at the first sequence reaching max_tokens;
3. a run never needs more blocks than are free (it is cut to fit);
4. `split` + `truncate` keep the ledger consistent and reject bad arguments;
5. policies without `steady_decode` and count-only engines with stop tokens never fuse.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from splitserve.core.ids import RequestId
from splitserve.core.kv import BlockManager
from splitserve.core.request import Request, SamplingSpec
from splitserve.policy.batching import EngineModel, FcfsParams, FcfsPolicy, StepDecision, StepView
from splitserve.policy.batching.engine import RequestMode, Step
from splitserve.policy.batching.tokens import SyntheticTokens

TOKENS = SyntheticTokens(vocab_size=1000, first_id=10)


def engine(blocks: int = 64, tokens: SyntheticTokens | None = TOKENS) -> EngineModel:
    return EngineModel(
        FcfsPolicy(FcfsParams(max_num_batched_tokens=512)), BlockManager(blocks, 4), tokens
    )


def req(rid: str, prompt: int, out: int, stop: tuple[int, ...] = ()) -> Request:
    return Request(
        RequestId(rid), tuple(range(1, prompt + 1)), SamplingSpec(out, stop_token_ids=stop), 0.0
    )


def prefill_all(e: EngineModel) -> None:
    """Run steps until every sequence is decoding (no prompt left)."""
    while True:
        step = e.schedule(0.0)
        assert step is not None
        e.complete(step, 0.0)
        if not step.batch.prefill_chunks:
            return


def state(e: EngineModel) -> list[tuple[str, tuple[int, ...], int]]:
    return sorted((str(r), e.output_ids(r), e.blocks.blocks_held(r)) for r in e.request_ids)


@given(
    st.lists(st.tuples(st.integers(1, 30), st.integers(3, 40)), min_size=1, max_size=6),
    st.integers(20, 120),
)
def test_fused_equals_single_steps(shapes: list[tuple[int, int]], blocks: int) -> None:
    a, b = engine(blocks), engine(blocks)
    for i, (p, o) in enumerate(shapes):
        for e in (a, b):
            e.add(req(f"r{i}", p, o), RequestMode.GENERATE)
    prefill_all(a)
    prefill_all(b)
    while a.has_runnable_work:
        step = a.schedule(0.0, max_repeat=1 << 20)
        assert step is not None
        for _ in range(step.repeat):
            single = b.schedule(0.0)
            assert single is not None
            assert single.decision == step.decision or step.repeat == 1
            b.complete(single, 0.0)
        result = a.complete(step, 0.0)
        if step.repeat > 1:
            assert not step.decision.preempt
            assert len(result.tokens) == len(step.decision.chunks)
        assert state(a) == state(b)
        assert a.blocks.num_free == b.blocks.num_free
    assert not b.has_runnable_work


def _decoding(n: int, out: int, blocks: int = 64) -> tuple[EngineModel, Step]:
    e = engine(blocks, tokens=None)
    for i in range(n):
        e.add(req(f"r{i}", 4, out + i), RequestMode.GENERATE)
    prefill_all(e)
    step = e.schedule(0.0, max_repeat=1000)
    assert step is not None
    return e, step


def test_run_stops_at_first_finish() -> None:
    e, step = _decoding(3, 10)
    assert step.repeat == 8  # r0 has 2 of its 10 tokens (prefill + one decode step)
    result = e.complete(step, 1.0)
    assert result.finished == (RequestId("r0"),)


def test_run_is_cut_to_fit_blocks() -> None:
    e, step = _decoding(2, 40, blocks=20)
    held = sum(e.blocks.blocks_held(r) for r in e.request_ids)
    assert held + e.blocks.num_free == 20
    assert 1 < step.repeat < 39
    e.complete(step, 1.0)
    assert e.blocks.num_free >= 0


def test_split_and_truncate() -> None:
    e, step = _decoding(2, 30)
    with pytest.raises(ValueError, match="steps_done"):
        e.split(step, step.repeat, 0.5)
    rest = e.split(step, 5, 0.5)
    assert rest.repeat == step.repeat - 5
    assert rest.batch.decode_contexts == tuple(c + 5 for c in step.batch.decode_contexts)
    assert [len(e.output_ids(r)) for r in e.request_ids] == [7, 7]  # 2 before the run
    with pytest.raises(RuntimeError, match="in flight"):
        e.truncate(step, 1)
    one = e.truncate(rest, 1)
    assert one.repeat == 1
    with pytest.raises(ValueError, match="repeat"):
        e.truncate(one, 2)
    e.complete(one, 1.0)
    assert [len(e.output_ids(r)) for r in e.request_ids] == [8, 8]


def test_no_fusing_without_steady_policy_or_with_stop_tokens() -> None:
    class Plain:
        name = "plain"

        def __init__(self) -> None:
            self.inner = FcfsPolicy()

        def decide(self, view: StepView) -> StepDecision:
            return self.inner.decide(view)

    e = EngineModel(Plain(), BlockManager(64, 4), None)
    e.add(req("a", 4, 20), RequestMode.GENERATE)
    prefill_all(e)
    step = e.schedule(0.0, max_repeat=100)
    assert step is not None
    assert step.repeat == 1

    e2 = engine()
    e2.add(req("a", 4, 20, stop=(5,)), RequestMode.GENERATE)
    prefill_all(e2)
    step2 = e2.schedule(0.0, max_repeat=100)
    assert step2 is not None
    assert step2.repeat == 1
