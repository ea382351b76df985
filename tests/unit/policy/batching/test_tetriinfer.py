"""TetriInfer's prefill-instance and decode-instance step policies.

Invariants (research/seed-splitwise-tetriinfer.md B8.1-B8.3, B8.9, and the module docstring):
1. prefill chunks are sliced and merged in scheduled order, at most ChunkSize tokens a step
   (the paper's worked example: R1=300, R2=700, R3=100 give C1/C2/C3 exactly);
2. windows of PrefillSchedBatch requests are sorted by prompt length only within the window;
3. no decision exceeds the token budget or the free blocks; chunks stay within a sequence's
   uncomputed tokens; no sequence appears twice (hypothesis);
4. with a finite workload every request finishes under FCFS and SJF (hypothesis, engine-driven);
5. reserve-static / reserve-dynamic admission avoid the preemptions greedy admission causes when
   predictions are exact; reserve-dynamic admits where reserve-static would wait for a job that
   is about to finish;
6. params validate and the registered factories build the paper's defaults.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from splitserve.core.ids import RequestId
from splitserve.core.kv import BlockManager, blocks_for
from splitserve.core.request import Request, SamplingSpec
from splitserve.policy.batching import EngineModel, SeqView, StepView, make_batching_policy
from splitserve.policy.batching.base import BatchingPolicy
from splitserve.policy.batching.engine import RequestMode
from splitserve.policy.batching.tetriinfer import (
    Admission,
    LengthEstimate,
    PrefillOrder,
    TetriDecodeParams,
    TetriDecodePolicy,
    TetriPrefillParams,
    TetriPrefillPolicy,
)


def waiting(rid: str, prompt: int, arrival_s: float = 0.0, remote: bool = False) -> SeqView:
    return SeqView(RequestId(rid), arrival_s, prompt, 1 if remote else 0, 0, 1000, 0, remote)


def request(rid: str, prompt: int, max_tokens: int = 1, arrival_s: float = 0.0) -> Request:
    return Request(
        RequestId(rid), (1,) * prompt, SamplingSpec(max_tokens, ignore_eos=True), arrival_s
    )


def prefill_steps(policy: BatchingPolicy, prompts: Sequence[int]) -> list[list[tuple[str, int]]]:
    """Run prompts (arriving in order) through a prefill engine; the chunks of every step."""
    engine = EngineModel(policy, BlockManager(10_000, 16), tokens=None)
    for i, p in enumerate(prompts):
        engine.add(request(f"R{i + 1}", p, arrival_s=float(i)), RequestMode.PREFILL)
    steps: list[list[tuple[str, int]]] = []
    now = 10.0
    while (step := engine.schedule(now)) is not None:
        steps.append([(str(rid), n) for rid, n in step.decision.chunks])
        engine.complete(step, now)
        now += 1.0
    return steps


# -- prefill ------------------------------------------------------------------------------------


def test_paper_worked_example_fcfs() -> None:
    policy = TetriPrefillPolicy(TetriPrefillParams(order=PrefillOrder.FCFS))
    assert prefill_steps(policy, [300, 700, 100]) == [
        [("R1", 300), ("R2", 212)],
        [("R2", 488), ("R3", 24)],
        [("R3", 76)],
    ]


def test_long_prompt_takes_ceil_chunks() -> None:
    steps = prefill_steps(TetriPrefillPolicy(), [5000])
    assert [sum(n for _, n in s) for s in steps] == [512] * 9 + [5000 - 9 * 512]


@pytest.mark.parametrize(
    ("order", "window", "expected"),
    [
        (PrefillOrder.SJF, 2, [50, 900, 20, 400, 700]),
        (PrefillOrder.LJF, 5, [900, 700, 400, 50, 20]),
        (PrefillOrder.FCFS, 5, [900, 50, 400, 20, 700]),
        (PrefillOrder.SJF, 16, [20, 50, 400, 700, 900]),
    ],
    ids=["sjf-b2", "ljf-b5", "fcfs", "sjf-b16"],
)
def test_windows_sort_only_within(order: PrefillOrder, window: int, expected: list[int]) -> None:
    raw = [900, 50, 400, 20, 700]
    view = StepView(
        0.0, tuple(waiting(f"r{i}", p, float(i)) for i, p in enumerate(raw)), (), 10_000, 10_000, 16
    )
    policy = TetriPrefillPolicy(TetriPrefillParams(order=order, window_size=window))
    assert [s.num_prompt_tokens for s in policy.scheduled_order(view)] == expected


def test_started_prompt_goes_first_even_if_longer() -> None:
    started = SeqView(RequestId("long"), 0.0, 2000, 0, 512, 1, 32)
    view = StepView(0.0, (waiting("short", 10, 1.0),), (started,), 1000, 1032, 16)
    decision = TetriPrefillPolicy().decide(view)
    assert decision.chunks[0] == (RequestId("long"), 512)


def test_prefill_stops_at_a_prompt_that_does_not_fit() -> None:
    view = StepView(0.0, (waiting("a", 100), waiting("b", 10, 1.0)), (), 3, 10, 16)
    policy = TetriPrefillPolicy(TetriPrefillParams(order=PrefillOrder.FCFS))
    assert policy.decide(view).chunks == ()


# -- decode -------------------------------------------------------------------------------------


def decode_run(
    params: TetriDecodeParams, num_blocks: int, n: int, prompt: int, out: int
) -> tuple[int, float]:
    """n identical remote-KV requests on one decode engine: (preemptions, mean finish step)."""
    engine = EngineModel(TetriDecodePolicy(params), BlockManager(num_blocks, 10), tokens=None)
    for i in range(n):
        engine.add(request(f"r{i}", prompt, out, float(i)), RequestMode.DECODE, first_token_id=0)
    finish: list[int] = []
    t = 0
    while (step := engine.schedule(float(t))) is not None:
        for rid in step.transfers:
            engine.finish_transfer(rid)
        finish += [t] * len(engine.complete(step, float(t)).finished)
        t += 1
        assert t < 10_000
    assert len(finish) == n
    return engine.num_preemptions, sum(finish) / n


@pytest.mark.parametrize(
    ("admission", "preempts"),
    [
        (Admission.GREEDY, True),
        (Admission.RESERVE_STATIC, False),
        (Admission.RESERVE_DYNAMIC, False),
    ],
    ids=["greedy", "rs", "rd"],
)
def test_reservation_avoids_preemption(admission: Admission, preempts: bool) -> None:
    # KV for 1000 tokens, prompts of 100, 400 outputs each (research B8.9), exact predictions.
    params = TetriDecodeParams(admission=admission, length_granularity_tokens=1)
    num_preempt, _ = decode_run(params, 100, 6, 100, 400)
    assert (num_preempt > 0) is preempts


@pytest.mark.parametrize(
    ("admission", "admits"),
    [
        (Admission.GREEDY, True),
        (Admission.RESERVE_STATIC, False),
        (Admission.RESERVE_DYNAMIC, True),
    ],
    ids=["greedy", "rs", "rd"],
)
def test_dynamic_reservation_counts_on_the_shortest_job_finishing(
    admission: Admission, admits: bool
) -> None:
    # 100 blocks of 10 tokens. Running: prompt 100, 395 of 400 outputs done (50 blocks held,
    # done in 5 steps). Newcomer: prompt 110, 400 outputs -> peak 51 blocks. Together the peaks
    # (50 + 51) overflow (RS says no); once the running job ends in 5 steps, the newcomer alone
    # needs 12 blocks then (RD says yes).
    run = SeqView(RequestId("run"), 0.0, 100, 395, 494, 400, 50)
    new = SeqView(RequestId("new"), 1.0, 110, 1, 0, 400, 0, True)
    view = StepView(0.0, (new,), (run,), 50, 100, 10)
    policy = TetriDecodePolicy(TetriDecodeParams(admission, length_granularity_tokens=1))
    chunks = policy.decide(view).chunks
    assert chunks[0] == (RequestId("run"), 1)
    assert ((RequestId("new"), 0) in chunks) is admits


def test_admission_with_empty_batch_ignores_reservation() -> None:
    # Predicted peak (100 + 900) exceeds capacity, but nothing runs: admit to make progress.
    view = StepView(0.0, (SeqView(RequestId("a"), 0.0, 100, 1, 0, 900, 0, True),), (), 50, 50, 16)
    policy = TetriDecodePolicy(TetriDecodeParams(Admission.RESERVE_STATIC, 1))
    assert policy.decide(view).chunks == ((RequestId("a"), 0),)


@pytest.mark.parametrize(
    ("estimate", "max_tokens", "expected"),
    [
        (LengthEstimate.LOWER, 450, 400),
        (LengthEstimate.MID, 450, 500),
        (LengthEstimate.UPPER, 450, 599),
        (LengthEstimate.LOWER, 150, 1),
    ],
    ids=["lower", "mid", "upper", "first-bucket-lower"],
)
def test_predicted_length_buckets(estimate: LengthEstimate, max_tokens: int, expected: int) -> None:
    seq = SeqView(RequestId("a"), 0.0, 10, 1, 0, max_tokens, 0, True)
    params = TetriDecodeParams(length_granularity_tokens=200, length_estimate=estimate)
    assert params.predicted_output_tokens(seq) == expected


# -- params and registry ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"chunk_tokens": 0}, "must be >= 1"),
        ({"window_size": 0}, "must be >= 1"),
        ({"max_num_seqs": 0}, "must be >= 1"),
        ({"order": "shortest"}, "not a valid PrefillOrder"),
    ],
    ids=["chunk", "window", "seqs", "order"],
)
def test_prefill_params_validate(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        TetriPrefillParams(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"length_granularity_tokens": 0}, "length_granularity_tokens"),
        ({"max_num_seqs": 0}, "max_num_seqs"),
        ({"admission": "lazy"}, "not a valid Admission"),
    ],
    ids=["granularity", "seqs", "admission"],
)
def test_decode_params_validate(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        TetriDecodeParams(**kwargs)  # type: ignore[arg-type]


def test_registered_factories_build_paper_defaults() -> None:
    prefill = make_batching_policy("tetriinfer-prefill", order="ljf")
    decode = make_batching_policy("tetriinfer-decode")
    assert isinstance(prefill, TetriPrefillPolicy)
    assert isinstance(decode, TetriDecodePolicy)
    assert prefill.params.order is PrefillOrder.LJF
    assert (prefill.params.chunk_tokens, prefill.params.window_size) == (512, 16)
    assert decode.params.admission is Admission.RESERVE_DYNAMIC
    assert decode.params.length_granularity_tokens == 200


# -- properties ---------------------------------------------------------------------------------


@st.composite
def views(draw: st.DrawFn) -> StepView:
    size = 16
    running: list[SeqView] = []
    for i in range(draw(st.integers(0, 6))):
        prompt = draw(st.integers(1, 3000))
        outputs = draw(st.integers(0, 50))
        known = prompt + outputs
        computed = draw(st.integers(0, known - 1)) if outputs == 0 else known - 1
        running.append(
            SeqView(
                RequestId(f"run{i}"),
                float(i),
                prompt,
                outputs,
                computed,
                outputs + draw(st.integers(1, 600)),
                blocks_for(computed, size),
            )
        )
    queue = tuple(
        waiting(f"w{i}", draw(st.integers(1, 3000)), 10.0 + i, draw(st.booleans()))
        for i in range(draw(st.integers(0, 8)))
    )
    held = sum(s.blocks_held for s in running)
    free = draw(st.integers(0, 400))
    return StepView(0.0, queue, tuple(running), free, free + held, size)


POLICIES: list[BatchingPolicy] = [
    TetriPrefillPolicy(TetriPrefillParams(chunk_tokens=256, order=PrefillOrder.SJF)),
    TetriPrefillPolicy(TetriPrefillParams(order=PrefillOrder.LJF, window_size=3)),
    TetriDecodePolicy(TetriDecodeParams(Admission.GREEDY, max_num_batched_tokens=300)),
    TetriDecodePolicy(TetriDecodeParams(Admission.RESERVE_STATIC)),
    TetriDecodePolicy(TetriDecodeParams(Admission.RESERVE_DYNAMIC, 1)),
]


@settings(max_examples=150, deadline=None)
@given(views(), st.sampled_from(range(len(POLICIES))))
def test_decisions_respect_budget_and_blocks(view: StepView, which: int) -> None:
    policy = POLICIES[which]
    decision = policy.decide(view)
    if isinstance(policy, TetriPrefillPolicy):
        budget = policy.params.chunk_tokens
    else:
        assert isinstance(policy, TetriDecodePolicy)
        budget = policy.params.max_num_batched_tokens
    assert sum(n for _, n in decision.chunks) <= budget
    seqs = {s.id: s for s in view.waiting + view.running}
    ids = [rid for rid, _ in decision.chunks] + list(decision.preempt)
    assert len(ids) == len(set(ids))
    free = view.free_blocks + sum(seqs[rid].blocks_held for rid in decision.preempt)
    for rid, n in decision.chunks:
        s = seqs[rid]
        if s.remote_kv and s in view.waiting:
            assert n == 0
            free -= max(0, blocks_for(s.num_prompt_tokens, view.block_size) - s.blocks_held)
        else:
            assert 1 <= n <= s.num_uncomputed_tokens
            free -= max(0, blocks_for(s.num_computed_tokens + n, view.block_size) - s.blocks_held)
    assert free >= 0


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 2500), st.integers(2, 300)), min_size=1, max_size=12),
    st.sampled_from([PrefillOrder.FCFS, PrefillOrder.SJF]),
    st.sampled_from(list(Admission)),
)
def test_every_request_finishes(
    lengths: list[tuple[int, int]], order: PrefillOrder, admission: Admission
) -> None:
    """Prefill then decode each request on one engine pair; all finish in bounded steps."""
    prefill = EngineModel(
        TetriPrefillPolicy(TetriPrefillParams(order=order, window_size=4)),
        BlockManager(400, 16),
        tokens=None,
    )
    decode = EngineModel(
        TetriDecodePolicy(TetriDecodeParams(admission)), BlockManager(400, 16), tokens=None
    )
    reqs = {}
    for i, (p, o) in enumerate(lengths):
        r = request(f"r{i}", p, o, float(i))
        reqs[r.id] = r
        prefill.add(r, RequestMode.PREFILL)
    finished: set[RequestId] = set()
    for t in range(20_000):
        progressed = False
        for engine in (prefill, decode):
            step = engine.schedule(float(t))
            if step is None:
                continue
            progressed = True
            for rid in step.transfers:
                decode.finish_transfer(rid)
            result = engine.complete(step, float(t))
            finished.update(result.finished)
            for rid in result.prefilled:
                prefill.release(rid)
                decode.add(reqs[rid], RequestMode.DECODE, first_token_id=0)
        if not progressed:
            break
    assert finished == set(reqs)
