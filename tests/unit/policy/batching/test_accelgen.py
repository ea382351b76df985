"""AccelGen's step policy (research/seed-accelgen-bros.md A9; seeds/accelgen.txt §4).

Invariants:
1. Eq. 6: S_b = S_pf * SLO_min / T_pf (A9-1: 900 and 600 tokens); the model-mode inverse keeps the
   predicted step within SLO_min; a tight TBT shrinks the budget;
2. dynamic chunking is token-exact: S_f reaches S_b, and the cut prompt resumes where it stopped
   (A9-2);
3. remaining-time order and the urgent set (A9-3); a tight-slack request goes first;
4. Alg. 2's best fit beats in-order filling on (compute, KV) (A9-4), and a prompt whose whole KV
   does not fit never starts;
5. ERA: no second long prompt starts while one is mid-prefill (unless ERA is off);
6. KV overflow preempts the running request with the largest T_r; the JCT conversion gives the
   paper's allowed wait (A9-6);
7. every decision is valid for random views, and an engine driven by the policy finishes every
   request (hypothesis); `make()` builds it through the registry.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from splitserve.core.ids import RequestId, SloClassName
from splitserve.core.kv import BlockManager
from splitserve.core.perf import BatchShape
from splitserve.core.request import Request, SamplingSpec, SloClass
from splitserve.policy.batching import EngineModel, SeqView, StepView, make_batching_policy
from splitserve.policy.batching.accelgen import (
    AccelGenParams,
    AccelGenPolicy,
    BudgetMode,
    default_latency_model,
)
from splitserve.policy.batching.base import StepDecision
from splitserve.policy.batching.engine import RequestMode


def cls(name: str, ttft_s: float, tbt_s: float) -> SloClass:
    return SloClass(SloClassName(name), ttft_ms=1000 * ttft_s, tpot_ms=1000 * tbt_s)


def seq(
    rid: str,
    prompt: int,
    *,
    outputs: int = 0,
    computed: int = 0,
    held: int = 0,
    arrival: float = 0.0,
    klass: str = "default",
    max_tokens: int = 100,
) -> SeqView:
    return SeqView(
        RequestId(rid),
        arrival,
        prompt,
        outputs,
        computed,
        max_tokens,
        held,
        slo_class=SloClassName(klass),
    )


def decoding(rid: str, prompt: int, klass: str, block_size: int = 32, room: bool = True) -> SeqView:
    """A returned TG task: prompt + 1 output known, prompt computed, blocks for the next token."""
    held = -(-(prompt + (1 if room else 0)) // block_size)
    return seq(rid, prompt, outputs=1, computed=prompt, held=held, klass=klass)


def view(
    waiting: tuple[SeqView, ...] = (),
    running: tuple[SeqView, ...] = (),
    free: int = 1000,
    total: int = 1000,
    now: float = 0.0,
    block_size: int = 32,
) -> StepView:
    return StepView(now, waiting, running, free, total, block_size)


def check_valid(v: StepView, d: StepDecision) -> None:
    """The engine's validation rules, applied to a bare view."""
    by_id = {s.id: s for s in (*v.running, *v.waiting)}
    running = {s.id for s in v.running}
    free = v.free_blocks
    seen: set[RequestId] = set()
    for rid in d.preempt:
        assert rid in running
        assert rid not in seen
        seen.add(rid)
        free += by_id[rid].blocks_held
    for rid, n in d.chunks:
        assert rid in by_id
        assert rid not in seen
        seen.add(rid)
        s = by_id[rid]
        assert 1 <= n <= s.num_uncomputed_tokens
        extra = -(-(s.num_computed_tokens + n) // v.block_size) - s.blocks_held
        free -= max(0, extra)
        assert free >= 0


# 1. Eq. 6 ---------------------------------------------------------------------------------------


def test_eq6_budget_matches_the_spec_example() -> None:
    p = AccelGenPolicy(AccelGenParams(pivot_tokens=768, pivot_time_s=0.12))
    assert p.budget(0.1875 * 0.75) == 900
    assert p.budget(0.09375) == 600
    assert p.budget(100.0) == p.params.max_budget_tokens
    assert p.budget(0.0) == p.params.min_budget_tokens


def test_model_mode_budget_keeps_the_step_within_the_slo() -> None:
    model = default_latency_model()
    p = AccelGenPolicy(AccelGenParams(budget_mode=BudgetMode.MODEL))
    for slo in (0.05, 0.14, 0.3):
        s_b = p.budget(slo)
        assert model.step_s(BatchShape(((s_b, 0),))) <= slo
        assert model.step_s(BatchShape(((s_b + 1, 0),))) > slo


def test_budget_shrinks_under_a_tight_tbt() -> None:
    classes = (cls("tight", 10.0, 0.05), cls("loose", 10.0, 0.2))
    budgets = []
    for klass in ("loose", "tight"):
        p = AccelGenPolicy(AccelGenParams(slo_classes=classes))
        p.decide(view((seq("w", 5000, klass="loose"),), (decoding("d", 100, klass),)))
        budgets.append(p.last_budget)
    assert budgets[1] < budgets[0]
    assert budgets[0] == AccelGenPolicy(AccelGenParams(slo_classes=classes)).budget(0.2)


def test_chunking_off_uses_the_pivot_budget() -> None:
    p = AccelGenPolicy(AccelGenParams(dynamic_chunking=False))
    assert p.budget(0.01) == p.params.pivot_tokens == 768


# 2. token-exact dynamic chunking ----------------------------------------------------------------


@pytest.mark.parametrize("multi_resource", [True, False])
def test_dynamic_chunking_fills_the_budget_exactly(multi_resource: bool) -> None:
    classes = (cls("a", 2.0, 2.0), cls("b", 100.0, 2.0))
    params = AccelGenParams(
        slo_classes=classes, pivot_tokens=768, pivot_time_s=2.0, multi_resource=multi_resource
    )
    p = AccelGenPolicy(params)
    engine = EngineModel(p, BlockManager(10_000, 32), tokens=None)
    for rid, prompt, klass in (("A", 300, "a"), ("B", 6000, "b")):
        r = Request(
            RequestId(rid),
            (1,) * prompt,
            SamplingSpec(50, ignore_eos=True),
            0.0,
            slo_class=SloClassName(klass),
        )
        engine.add(r, RequestMode.GENERATE)
    step = engine.schedule(0.0)
    assert step is not None
    assert dict(step.decision.chunks) == {"A": 300, "B": 468}
    assert p.last_budget == 768
    engine.complete(step, 0.1)
    step = engine.schedule(0.1)
    assert step is not None
    assert dict(step.decision.chunks) == {"A": 1, "B": 767}
    assert step.batch.num_new_tokens == p.last_budget


# 3. remaining-time order and the urgent set -----------------------------------------------------


def test_remaining_time_order_and_urgent_set() -> None:
    classes = (cls("x", 10.0, 0.047), cls("y", 10.0, 0.094), cls("z", 10.0, 0.375))
    p = AccelGenPolicy(AccelGenParams(slo_classes=classes, pivot_tokens=768, pivot_time_s=0.04))
    v = view(running=(decoding("z", 100, "z"), decoding("x", 100, "x"), decoding("y", 100, "y")))
    q = p.queue(v)
    assert [str(r) for r, _, _ in q] == ["x", "y", "z"]
    assert q[0][1] == pytest.approx(0.007)
    assert [u for _, _, u in q] == [True, False, False]
    p.decide(v)
    assert p.last_budget == p.budget(0.047) == int(768 * 0.047 / 0.04)


def test_a_tight_slack_request_goes_first() -> None:
    classes = (cls("loose", 30.0, 1.0), cls("tight", 0.5, 1.0))
    p = AccelGenPolicy(AccelGenParams(slo_classes=classes, max_budget_tokens=600))
    v = view((seq("early", 600, klass="loose"), seq("late", 600, arrival=0.0, klass="tight")))
    d = p.decide(v)
    assert d.chunks[0] == ("late", 600)
    assert "early" not in dict(d.chunks)
    fifo = AccelGenPolicy(
        AccelGenParams(slo_classes=classes, max_budget_tokens=600, slo_ordering=False)
    )
    assert fifo.decide(v).chunks[0][0] == "early"


# 4. multi-resource best fit ---------------------------------------------------------------------


def best_fit_view() -> StepView:
    p3 = seq("P3", 64, outputs=1, computed=64, held=3, klass="c")  # a slot is free: D = (1, 0)
    return view(
        (seq("P2", 200, klass="c"), seq("P1", 380, klass="c")),
        (p3,),
        free=16,  # A_m = 512 tokens
        total=100,
    )


def test_best_fit_fills_both_resources_where_in_order_does_not() -> None:
    classes = (cls("c", 100.0, 100.0),)
    common = {"slo_classes": classes, "max_budget_tokens": 400, "retain_decodes": False}
    best = AccelGenPolicy(AccelGenParams(**common)).decide(best_fit_view())  # type: ignore[arg-type]
    assert dict(best.chunks) == {"P1": 380, "P3": 1}
    fcfs = AccelGenPolicy(AccelGenParams(multi_resource=False, **common))  # type: ignore[arg-type]
    got = dict(fcfs.decide(best_fit_view()).chunks)
    assert got == {"P2": 200, "P3": 1}
    assert sum(got.values()) == 201


def test_a_prompt_whose_kv_does_not_fit_never_starts() -> None:
    p = AccelGenPolicy(AccelGenParams())
    v = view((seq("big", 3000), seq("small", 100)), free=20, total=200)  # 640 tokens free
    d = p.decide(v)
    assert dict(d.chunks) == {"small": 100}
    check_valid(v, d)


# 5. ERA -----------------------------------------------------------------------------------------


def era_view() -> StepView:
    classes = "default"
    started = seq("L1", 8000, computed=1000, held=32, klass=classes)
    return view((seq("L2", 6000, klass=classes),), (started,), free=2000, total=2100)


def test_era_keeps_a_second_long_prompt_waiting() -> None:
    d = AccelGenPolicy(AccelGenParams(max_budget_tokens=4000)).decide(era_view())
    assert "L2" not in dict(d.chunks)
    assert dict(d.chunks)[RequestId("L1")] > 0
    spread = AccelGenPolicy(AccelGenParams(max_budget_tokens=8000, era=False))
    assert "L2" in dict(spread.decide(era_view()).chunks)


# 6. preemption and JCT conversion ---------------------------------------------------------------


def test_kv_overflow_preempts_the_largest_remaining_time() -> None:
    classes = (cls("tight", 10.0, 0.05), cls("loose", 10.0, 5.0))
    p = AccelGenPolicy(AccelGenParams(slo_classes=classes))
    needy = decoding("needy", 64, "tight", room=False)  # needs a new block
    idle = decoding("idle", 64, "loose")
    d = p.decide(view(running=(needy, idle), free=0, total=10))
    assert d.preempt == ("idle",)
    assert dict(d.chunks) == {"needy": 1}


def test_jct_conversion_matches_the_spec_example() -> None:
    p = AccelGenPolicy(AccelGenParams(pivot_time_s=0.1, preempt_max_s=2.0, preempt_prob=0.01))
    wait = p.jct_allowed_wait_s(120.0, 10, 200)
    assert wait == pytest.approx(95 / 210)


def test_offline_request_yields_to_online_ones() -> None:
    classes = (cls("online", 1.0, 0.2), cls("offline", 3600.0, 10.0))
    p = AccelGenPolicy(
        AccelGenParams(slo_classes=classes, jct_slo_s={"offline": 600.0}, max_budget_tokens=500)
    )
    v = view((seq("off", 500, klass="offline"), seq("on", 500, klass="online", arrival=0.0)))
    assert [str(r) for r, _, _ in p.queue(v)] == ["on", "off"]


# 7. validity and liveness -----------------------------------------------------------------------

CLASSES = (cls("t", 0.3, 0.05), cls("m", 2.0, 0.2), cls("l", 20.0, 1.0))


@st.composite
def views(draw: st.DrawFn) -> StepView:
    size = draw(st.sampled_from([1, 16, 32]))
    seqs_r: list[SeqView] = []
    seqs_w: list[SeqView] = []
    used = 0
    for i in range(draw(st.integers(0, 8))):
        prompt = draw(st.integers(1, 9000))
        klass = draw(st.sampled_from(["t", "m", "l", "unknown"]))
        if draw(st.booleans()):  # running: decoding or mid-prefill
            if draw(st.booleans()):
                outs = draw(st.integers(1, 50))
                computed = prompt + outs - 1
            else:
                outs = 0
                computed = draw(st.integers(1, prompt - 1)) if prompt > 1 else 0
                if computed == 0:
                    continue
            held = -(-computed // size) + draw(st.integers(0, 1))
            used += held
            seqs_r.append(
                seq(f"r{i}", prompt, outputs=outs, computed=computed, held=held, klass=klass)
            )
        else:
            outs = draw(st.integers(0, 5))
            arrival = draw(st.floats(0, 5))
            seqs_w.append(seq(f"w{i}", prompt, outputs=outs, arrival=arrival, klass=klass))
    free = draw(st.integers(0, 2000))
    return StepView(draw(st.floats(5, 10)), tuple(seqs_w), tuple(seqs_r), free, used + free, size)


@settings(max_examples=150, deadline=None)
@given(
    views(),
    st.sampled_from(
        [
            {},
            {"slo_ordering": False},
            {"dynamic_chunking": False},
            {"multi_resource": False},
            {"era": False, "normalise_distance": True},
            {"budget_mode": "model", "budget_slo": "slack", "evict_for_admission": True},
        ]
    ),
)
def test_decisions_are_always_valid(v: StepView, flags: dict[str, object]) -> None:
    p = AccelGenPolicy(AccelGenParams(slo_classes=CLASSES, **flags))  # type: ignore[arg-type]
    d = p.decide(v)
    check_valid(v, d)
    if flags.get("dynamic_chunking", True):
        prompt_tokens = sum(
            n for rid, n in d.chunks if not any(s.id == rid and s.is_decoding for s in v.running)
        )
        assert prompt_tokens <= p.last_budget


@settings(max_examples=25, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(1, 3000), st.integers(1, 60), st.sampled_from(["t", "m", "l"])),
        min_size=1,
        max_size=8,
    ),
    st.sampled_from([{}, {"slo_ordering": False}, {"dynamic_chunking": False}]),
)
def test_engine_finishes_every_request(
    reqs: list[tuple[int, int, str]], flags: dict[str, object]
) -> None:
    policy = AccelGenPolicy(AccelGenParams(slo_classes=CLASSES, **flags))  # type: ignore[arg-type]
    engine = EngineModel(policy, BlockManager(128, 32), tokens=None)  # 4096 tokens of KV
    for i, (prompt, out, klass) in enumerate(reqs):
        r = Request(
            RequestId(f"q{i}"),
            (1,) * prompt,
            SamplingSpec(out, ignore_eos=True),
            0.01 * i,
            slo_class=SloClassName(klass),
        )
        engine.add(r, RequestMode.GENERATE)
    now, finished = 1.0, 0
    model = default_latency_model()
    for _ in range(5000):
        step = engine.schedule(now)
        if step is None:
            break
        now += model.step_s(step.batch)
        finished += len(engine.complete(step, now).finished)
    assert finished == len(reqs)


def test_make_through_the_registry() -> None:
    p = make_batching_policy("accelgen")
    assert isinstance(p, AccelGenPolicy)
    assert p.params.pivot_tokens == 768
    assert p.params.gamma_s == 0.75
    q = make_batching_policy("accelgen", pivot_tokens=1280, budget_mode="model")
    assert isinstance(q, AccelGenPolicy)
    assert q.params.budget_mode is BudgetMode.MODEL
    with pytest.raises(ValueError, match="pivot_tokens"):
        AccelGenParams(pivot_tokens=0)
