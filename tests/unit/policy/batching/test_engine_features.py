"""Engine-model features the paper policies need: finish signal, predicted lengths, swapping.

Invariants:
1. finish signal: over a whole run, fused decode runs included, the policy is told every finished
   request exactly once with its true output length (bar the very last step's, which no decision
   follows), and `FinishTracker` passes exactly those on;
2. predicted lengths: an engine given a predictor shows its prediction on every `SeqView` and
   feeds it every finished request; without one the field is None;
3. swap: a swapped-out sequence frees its blocks, keeps its progress, waits as `swapped`, and a
   chunk brings it back (blocks re-allocated, tokens counted each way); the host space is
   finite and enforced; blocks and host tokens are conserved; the tokens a request generates do
   not depend on whether it was swapped.
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
from splitserve.policy.predict import BucketedPredictor, OraclePredictor
from splitserve.policy.predict.feedback import FinishTracker


class Recording:
    """FCFS that records what it was shown (keeps FCFS's fused-run declaration)."""

    name = "recording"
    steady_decode = True

    def __init__(self) -> None:
        self.inner = FcfsPolicy(FcfsParams(max_num_batched_tokens=512))
        self.views: list[StepView] = []
        self.tracker = FinishTracker()
        self.tracked: list[tuple[int, int]] = []

    def decide(self, view: StepView) -> StepDecision:
        self.views.append(view)
        self.tracked += self.tracker.finished(view)
        decision = self.inner.decide(view)
        self.tracker.scheduled(view, decision.chunks)
        return decision


def request(i: int, prompt: int, output: int, arrival: float = 0.0) -> Request:
    return Request(
        RequestId(f"r{i}"),
        (0,) * prompt,
        SamplingSpec(max_tokens=output, ignore_eos=True),
        arrival_s=arrival,
    )


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 40), st.integers(1, 60)), min_size=1, max_size=12),
    st.sampled_from([1, 1 << 20]),
)
def test_every_finish_reported_with_its_true_length(
    lengths: list[tuple[int, int]], max_repeat: int
) -> None:
    policy = Recording()
    engine = EngineModel(policy, BlockManager(200, 4), None)
    for i, (p, o) in enumerate(lengths):
        engine.add(request(i, p, o), RequestMode.GENERATE)
    now = 0.0
    last: list[RequestId] = []
    while (step := engine.schedule(now, max_repeat)) is not None:
        now += step.repeat
        last = list(engine.complete(step, now).finished)
    reported = [f for v in policy.views for f in v.finished]
    truth = {RequestId(f"r{i}"): (p, o) for i, (p, o) in enumerate(lengths)}
    assert len({f.id for f in reported}) == len(reported)  # each once
    for f in reported:
        assert (f.num_prompt_tokens, f.num_output_tokens) == truth[f.id]
    assert {f.id for f in reported} | set(last) == set(truth)
    assert policy.tracked == [(f.num_prompt_tokens, f.num_output_tokens) for f in reported]


def test_finished_kept_until_a_decision_sees_them() -> None:
    policy = Recording()
    engine = EngineModel(policy, BlockManager(100, 4), None)
    engine.add(request(0, 4, 1), RequestMode.GENERATE)
    step = engine.schedule(0.0)
    assert step is not None
    engine.complete(step, 1.0)
    assert engine.schedule(1.0) is None  # nothing to run: no decision, the report waits
    engine.add(request(1, 4, 2), RequestMode.GENERATE)
    assert engine.schedule(2.0) is not None
    assert [f.id for f in policy.views[-1].finished] == [RequestId("r0")]
    assert engine.view(2.0).finished == ()


def test_predictor_fills_views_and_learns() -> None:
    learner = BucketedPredictor()
    engine = EngineModel(Recording(), BlockManager(100, 4), None, predictor=learner)
    engine.add(request(0, 8, 3), RequestMode.GENERATE)
    assert engine.view(0.0).waiting[0].predicted_output_tokens == 3  # empty table: the cap
    step = engine.schedule(0.0)
    assert step is not None
    while step is not None:
        engine.complete(step, 1.0)
        step = engine.schedule(1.0)
    assert learner._all.total() == 1

    oracle = EngineModel(Recording(), BlockManager(100, 4), None, predictor=OraclePredictor())
    oracle.add(request(1, 8, 17), RequestMode.GENERATE)
    assert oracle.view(0.0).waiting[0].predicted_output_tokens == 17
    plain = EngineModel(Recording(), BlockManager(100, 4), None)
    plain.add(request(2, 8, 17), RequestMode.GENERATE)
    assert plain.view(0.0).waiting[0].predicted_output_tokens is None


class Swapper:
    """FCFS, but swaps out the newest running sequence every `every` steps."""

    name = "swapper"

    def __init__(self, every: int) -> None:
        self.inner = FcfsPolicy(FcfsParams(max_num_batched_tokens=512))
        self.every = every
        self.n = 0

    def decide(self, view: StepView) -> StepDecision:
        self.n += 1
        d = self.inner.decide(view)
        if self.n % self.every or len(view.running) < 2:
            return d
        victim = view.running[-1]
        if victim.num_computed_tokens > view.host_free_tokens or d.preempt:
            return d
        chunks = tuple(c for c in d.chunks if c[0] != victim.id)
        return StepDecision(chunks, (), (victim.id,))


def test_swap_out_and_back_in() -> None:
    engine = EngineModel(Swapper(1 << 30), BlockManager(100, 4), None, host_swap_tokens=15)
    a, b = request(0, 10, 20), request(1, 6, 20)
    engine.add(a, RequestMode.GENERATE)
    engine.add(b, RequestMode.GENERATE)
    step = engine.schedule(0.0)
    assert step is not None
    engine.complete(step, 1.0)
    held_b = engine.blocks.blocks_held(b.id)
    computed_b = engine._seqs[b.id].num_computed
    free = engine.blocks.num_free
    # Swap b out by hand-made decision (decode a only).
    engine.policy = _Fixed(StepDecision(((a.id, 1),), (), (b.id,)))
    step = engine.schedule(1.0)
    assert step is not None
    assert step.swap_out_tokens == computed_b
    assert step.swap_in_tokens == 0
    assert engine.phase(b.id) is SeqPhase.WAITING
    assert engine.blocks.num_free >= free + held_b - 1
    assert engine.host_used_tokens == computed_b
    engine.complete(step, 2.0)
    view = engine.view(2.0)
    (w,) = view.waiting
    assert w.swapped
    assert w.blocks_held == 0
    assert w.num_computed_tokens == computed_b
    assert view.host_free_tokens == 15 - computed_b
    # Too big for the host space left: the decision raises before anything changes.
    engine.policy = _Fixed(StepDecision((), (), (a.id,)))
    with pytest.raises(ValueError, match="host swap space"):
        engine.schedule(2.0)
    # A chunk brings b back: blocks re-allocated, progress kept, tokens copied back counted.
    engine.policy = _Fixed(StepDecision(((b.id, 1), (a.id, 1))))
    step = engine.schedule(2.0)
    assert step is not None
    assert step.swap_in_tokens == computed_b
    assert step.batch.decode_contexts == (computed_b, engine._seqs[a.id].num_computed)
    assert engine.host_used_tokens == 0
    assert not engine.view(2.0).running[0].swapped
    assert engine.blocks.blocks_held(b.id) >= held_b
    assert engine.num_swaps_out == engine.num_swaps_in == 1


class _Fixed:
    name = "fixed"

    def __init__(self, decision: StepDecision) -> None:
        self.decision = decision

    def decide(self, view: StepView) -> StepDecision:
        return self.decision


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 30), st.integers(2, 40)), min_size=2, max_size=10),
    st.integers(1, 4),
)
def test_swapping_changes_no_tokens_and_conserves(
    lengths: list[tuple[int, int]], every: int
) -> None:
    tokens = SyntheticTokens(vocab_size=500, first_id=5)

    def run(policy: object, host: int) -> dict[RequestId, tuple[int, ...]]:
        engine = EngineModel(policy, BlockManager(60, 4), tokens, host_swap_tokens=host)  # type: ignore[arg-type]
        for i, (p, o) in enumerate(lengths):
            engine.add(
                Request(RequestId(f"r{i}"), tuple(range(p)), SamplingSpec(max_tokens=o), float(i)),
                RequestMode.GENERATE,
            )
        out: dict[RequestId, tuple[int, ...]] = {}
        now = 0.0
        while (step := engine.schedule(now)) is not None:
            ids = {rid: engine.output_ids(rid) for rid, _ in step.decision.chunks}
            now += 1.0
            result = engine.complete(step, now)
            for rid in result.finished:
                out[rid] = (*ids[rid], *[t.token_id for t in result.tokens if t.request_id == rid])
            held = sum(engine.blocks.held.values())
            assert engine.blocks.num_free + held == engine.blocks.num_blocks
            assert 0 <= engine.host_used_tokens <= host
        assert engine.host_used_tokens == 0
        assert engine.blocks.num_free == engine.blocks.num_blocks
        return out

    plain = run(FcfsPolicy(FcfsParams(max_num_batched_tokens=512)), 0)
    swapping = run(Swapper(every), 80)
    assert plain == swapping
