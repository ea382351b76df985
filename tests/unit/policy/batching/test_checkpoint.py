"""Partial (block-level) checkpoint in the engine model (`StepDecision.checkpoint`).

Invariants:
1. checkpointing the last k blocks of a running sequence frees exactly k blocks, copies the
   computed tokens they held to host (`Step.swap_out_tokens`), keeps the sequence running with
   its progress, and shows the host tokens (`SeqView.checkpointed_tokens`);
2. its next chunk re-allocates the blocks and swaps exactly those tokens back in
   (`Step.swap_in_tokens`); the host space is then returned;
3. checkpointing every block it holds is a swap-out (it waits, `swapped`);
4. invalid checkpoints raise before anything changes: not running, k out of (0, held], also
   preempted / swapped out / scheduled, more tokens than the host space left;
5. preempting or aborting a checkpointed sequence returns its host tokens;
6. over random runs, blocks are conserved, host tokens equal the sum shown on the views, and the
   tokens a request generates do not depend on checkpoints.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from splitserve.core.ids import RequestId
from splitserve.core.kv import BlockManager
from splitserve.core.request import Request, SamplingSpec
from splitserve.policy.batching import FcfsParams, FcfsPolicy, SeqPhase, StepDecision, StepView
from splitserve.policy.batching.engine import EngineModel, RequestMode
from splitserve.policy.batching.tokens import SyntheticTokens

A, B = RequestId("a"), RequestId("b")


def request(rid: str, prompt: int, output: int) -> Request:
    spec = SamplingSpec(max_tokens=output, ignore_eos=True)
    return Request(RequestId(rid), (0,) * prompt, spec, arrival_s=0.0)


class Scripted:
    """Plays the planned decisions, then FCFS."""

    name = "scripted"

    def __init__(self) -> None:
        self.inner = FcfsPolicy(FcfsParams(max_num_batched_tokens=512))
        self.planned: list[StepDecision] = []

    def decide(self, view: StepView) -> StepDecision:
        return self.planned.pop(0) if self.planned else self.inner.decide(view)


def two_running(host: int = 100) -> tuple[EngineModel, Scripted]:
    """`a` (prompt 10) and `b` (prompt 7) running on blocks of 4 after one step each."""
    policy = Scripted()
    engine = EngineModel(policy, BlockManager(20, 4), None, host_swap_tokens=host)
    engine.add(request("a", 10, 50), RequestMode.GENERATE)
    engine.add(request("b", 7, 50), RequestMode.GENERATE)
    step = engine.schedule(0.0)
    assert step is not None
    engine.complete(step, 1.0)  # a: 10 computed, 3 blocks; b: 7 computed, 2 blocks
    return engine, policy


def plan(engine: EngineModel, *decisions: StepDecision) -> None:
    policy = engine.policy
    assert isinstance(policy, Scripted)
    policy.planned.extend(decisions)


def test_checkpoint_frees_the_tail_and_swaps_it_back() -> None:
    engine, _policy = two_running()
    assert engine.blocks.blocks_held(A) == 3
    plan(engine, StepDecision(chunks=((B, 1),), checkpoint=((A, 2),)))
    step = engine.schedule(1.0)
    assert step is not None
    # a keeps block 0 (tokens 0-3); tokens 4-9 (6 of them) go to host.
    assert step.swap_out_tokens == 6
    assert step.swap_in_tokens == 0
    assert engine.blocks.blocks_held(A) == 1
    assert engine.host_used_tokens == 6
    assert engine.num_checkpoints == 1
    assert engine.checkpointed_tokens == 6
    assert engine.phase(A) is SeqPhase.RUNNING
    engine.complete(step, 2.0)
    view = engine.view(2.0)
    a = next(s for s in view.running if s.id == A)
    assert (a.num_computed_tokens, a.blocks_held, a.checkpointed_tokens) == (10, 1, 6)
    assert not a.swapped
    assert view.host_free_tokens == 94
    # Its next chunk (a decode: 11 tokens, 3 blocks) brings the tail back.
    plan(engine, StepDecision(chunks=((A, 1),)))
    step = engine.schedule(2.0)
    assert step is not None
    assert step.swap_in_tokens == 6
    assert step.swap_out_tokens == 0
    assert engine.blocks.blocks_held(A) == 3
    assert engine.host_used_tokens == 0
    engine.complete(step, 3.0)
    assert all(s.checkpointed_tokens == 0 for s in engine.view(3.0).running)
    assert engine.num_swaps_in == 1


def test_checkpoint_of_every_block_is_a_swap_out() -> None:
    engine, _ = two_running()
    plan(engine, StepDecision(checkpoint=((B, 2),)))
    step = engine.schedule(1.0)
    assert step is not None
    assert step.swap_out_tokens == 7
    assert engine.phase(B) is SeqPhase.WAITING
    assert engine.num_swaps_out == 1
    assert engine.num_checkpoints == 0
    (w,) = engine.view(1.0).waiting
    assert w.swapped
    assert w.checkpointed_tokens == 7


def test_checkpoint_then_swap_out_moves_only_the_rest() -> None:
    engine, _ = two_running()
    plan(engine, StepDecision(checkpoint=((A, 1),)))
    step = engine.schedule(1.0)
    assert step is not None
    assert step.swap_out_tokens == 2
    engine.complete(step, 2.0)
    plan(engine, StepDecision(swap_out=(A,)))
    step = engine.schedule(2.0)
    assert step is not None
    assert step.swap_out_tokens == 8
    assert engine.host_used_tokens == 10
    engine.complete(step, 3.0)
    plan(engine, StepDecision(chunks=((A, 1),)))
    step = engine.schedule(3.0)
    assert step is not None
    assert step.swap_in_tokens == 10
    assert engine.host_used_tokens == 0


@pytest.mark.parametrize(
    ("decision", "match"),
    [
        (StepDecision(checkpoint=((A, 0),)), "cannot checkpoint 0 blocks"),
        (StepDecision(checkpoint=((A, 4),)), "holds 3"),
        (StepDecision(checkpoint=((RequestId("zz"), 1),)), "not running"),
        (StepDecision(preempt=(A,), checkpoint=((A, 1),)), "not running"),
        (StepDecision(swap_out=(B,), checkpoint=((B, 1),)), "not running"),
        (StepDecision(checkpoint=((A, 1), (A, 1))), "not running"),
        (StepDecision(chunks=((A, 1),), checkpoint=((A, 1),)), "cannot schedule"),
        (StepDecision(checkpoint=((A, 2), (B, 1))), "host swap space"),
    ],
)
def test_invalid_checkpoints_raise_and_change_nothing(decision: StepDecision, match: str) -> None:
    engine, _ = two_running(host=8)  # a's last 2 blocks = 6 tokens, b's last = 3: 9 > 8
    plan(engine, decision)
    with pytest.raises(ValueError, match=match):
        engine.schedule(1.0)
    assert engine.blocks.blocks_held(A) == 3
    assert engine.blocks.blocks_held(B) == 2
    assert engine.host_used_tokens == 0
    assert engine.num_checkpoints == 0


def test_no_host_space_no_checkpoint() -> None:
    engine, _ = two_running(host=0)
    plan(engine, StepDecision(checkpoint=((A, 1),)))
    with pytest.raises(ValueError, match="host swap space"):
        engine.schedule(1.0)


def test_an_empty_tail_block_copies_nothing() -> None:
    engine, _ = two_running()
    # a decodes to 11 tokens; then b (7 computed, 2 blocks) checkpoints 1: tokens 4-6 go.
    plan(engine, StepDecision(checkpoint=((B, 1),)))
    step = engine.schedule(1.0)
    assert step is not None
    assert step.swap_out_tokens == 3
    engine.complete(step, 2.0)
    plan(engine, StepDecision(checkpoint=((B, 1),)))  # its last block is full; all but 0 go
    step = engine.schedule(2.0)
    assert step is not None
    assert step.swap_out_tokens == 4
    assert engine.phase(B) is SeqPhase.WAITING  # all its blocks: a swap-out
    assert engine.host_used_tokens == 7


@pytest.mark.parametrize("how", ["preempt", "abort"])
def test_dropping_a_checkpointed_sequence_returns_its_host_tokens(how: str) -> None:
    engine, _ = two_running()
    plan(engine, StepDecision(checkpoint=((A, 1),)))
    step = engine.schedule(1.0)
    assert step is not None
    engine.complete(step, 2.0)
    assert engine.host_used_tokens == 2
    if how == "abort":
        assert engine.abort(A)
    else:
        plan(engine, StepDecision(preempt=(A,)))
        step = engine.schedule(2.0)
        assert step is not None
        engine.complete(step, 3.0)
        assert engine.phase(A) is SeqPhase.WAITING
        assert engine.view(3.0).waiting[0].checkpointed_tokens == 0
    assert engine.host_used_tokens == 0
    assert engine.blocks.num_free + sum(engine.blocks.held.values()) == 20


class Checkpointer:
    """FCFS, but every `every` steps the newest running sequence sits the step out and has its
    last `blocks` blocks checkpointed, host space permitting."""

    name = "checkpointer"

    def __init__(self, every: int, blocks: int) -> None:
        self.inner = FcfsPolicy(FcfsParams(max_num_batched_tokens=64, max_num_seqs=3))
        self.every, self.blocks = every, blocks
        self.n = 0

    def decide(self, view: StepView) -> StepDecision:
        self.n += 1
        decision = self.inner.decide(view)
        if self.n % self.every or decision.preempt or len(view.running) < 2:
            return decision
        s = view.running[-1]
        k = min(self.blocks, s.blocks_held)
        on_gpu = s.num_computed_tokens - s.checkpointed_tokens
        moved = max(0, on_gpu - (s.blocks_held - k) * view.block_size)
        if k == 0 or moved > view.host_free_tokens:
            return decision
        chunks = tuple(c for c in decision.chunks if c[0] != s.id)
        return StepDecision(chunks, (), (), ((s.id, k),))


@settings(max_examples=30, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 30), st.integers(1, 40)), min_size=2, max_size=8),
    st.integers(1, 4),
    st.integers(1, 3),
)
def test_checkpoints_conserve_and_change_no_tokens(
    lengths: list[tuple[int, int]], every: int, k: int
) -> None:
    def run(policy: Checkpointer, host: int) -> dict[RequestId, list[tuple[int, int]]]:
        engine = EngineModel(
            policy, BlockManager(60, 4), SyntheticTokens(1000), host_swap_tokens=host
        )
        for i, (prompt, out) in enumerate(lengths):
            engine.add(request(f"r{i}", prompt, out), RequestMode.GENERATE)
        outputs: dict[RequestId, list[tuple[int, int]]] = {}
        now = 0.0
        while (step := engine.schedule(now)) is not None:
            now += 1.0
            for e in engine.complete(step, now).tokens:
                outputs.setdefault(e.request_id, []).append((e.index, e.token_id))
            blocks = engine.blocks
            assert blocks.num_free + sum(blocks.held.values()) == blocks.num_blocks
            v = engine.view(now)
            shown = sum(s.checkpointed_tokens for s in (*v.running, *v.waiting))
            assert shown == engine.host_used_tokens <= host
            for s in v.running:
                on_gpu = s.num_computed_tokens - s.checkpointed_tokens
                assert 0 <= on_gpu <= s.blocks_held * blocks.block_size
        assert engine.host_used_tokens == 0
        assert not engine.request_ids
        counts.append(engine.num_checkpoints + engine.num_swaps_out)
        return outputs

    counts: list[int] = []

    plain = run(Checkpointer(1 << 30, k), 0)
    checkpointing = run(Checkpointer(every, k), 40)
    assert plain == checkpointing
    assert counts[0] == 0


def test_the_random_runs_do_checkpoint() -> None:
    engine = EngineModel(
        Checkpointer(2, 2), BlockManager(60, 4), SyntheticTokens(1000), host_swap_tokens=40
    )
    for i, (prompt, out) in enumerate([(20, 30), (25, 20), (10, 30), (30, 10)]):
        engine.add(request(f"r{i}", prompt, out), RequestMode.GENERATE)
    now = 0.0
    while (step := engine.schedule(now)) is not None:
        now += 1.0
        engine.complete(step, now)
    assert engine.num_checkpoints > 5
    assert engine.checkpointed_tokens > 0
    assert engine.num_swaps_in >= engine.num_checkpoints
