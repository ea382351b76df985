"""Aladdin's best-fit placement ("aladdin-pack") and its output-length predictor.

Invariants (research/seed-distserve-vidur-aladdin.md C.10 and the module docstring):
1. scores lie in [0, 1]; a feasible endpoint always outranks an infeasible one (hypothesis);
2. Eq 4 budget (C.10-2): with k₂ = 1e-5, c₂ = 2e-4, c₃ = 0.01, T_dec = 0.05 the budget is 3360
   tokens at b = 32, 2000 at b = 100 and none at b >= 200; a request pushing past it is rejected;
3. the JSQ counterexample (C.10-3, Fig. 3): capacity 9, A = (4 in, 1 out), B = (1 in, 4 out):
   {A, A} and {B, B} peak at 10 (infeasible), {A, B} peaks at 7 (feasible);
4. best fit: among feasible workers the most loaded ranks first;
5. mixed mode: a long prompt is kept off a worker whose decodes have little slack (C.10-9), and
   (c) rejects a prompt whose prefill exceeds the TTFT SLO;
6. the predictor returns the conditional mean, and re-predicts above the generated length;
7. knobs: lowering θ or raising γ never turns an infeasible placement feasible (hypothesis);
8. registered as "aladdin-pack"; without `load_of` it works from the endpoint view alone;
9. Alg. 2: errors accumulate as the paper counts them; with a perfect predictor re-balancing makes
   no move (C.10-6); a worker running over its plan hands a new request to one running under,
   and every move lowers the summed error distance (hypothesis).
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from splitserve.core.ids import EndpointId, RequestId
from splitserve.core.roles import Role
from splitserve.policy.placement import SCORERS, PluginSpec, ProfileSpec, build_profile
from splitserve.policy.placement.aladdin import (
    AladdinPacking,
    ConditionalMeanLengths,
    OngoingRequest,
    PredictionError,
    WorkerLoad,
    prediction_error,
    rebalance,
)
from splitserve.policy.placement.base import EndpointView, RequestView
from splitserve.policy.planner.aladdin import AladdinPerfModel

C10 = AladdinPerfModel(k1=1e-4, c1=0.01, k2=1e-5, c2=2e-4, c3=0.01, kv_capacity=1e9)


def ep(name: str, total_tokens: int = 1 << 20, free_tokens: int | None = None) -> EndpointView:
    free = total_tokens if free_tokens is None else free_tokens
    return EndpointView(
        EndpointId(name),
        Role.DECODE,
        kv_free_blocks=free // 16,
        kv_total_blocks=total_tokens // 16,
    )


def req(prompt: int = 100, out: int = 50, rid: str = "r") -> RequestView:
    return RequestView(RequestId(rid), prompt, out)


def test_eq4_budget_values_and_rejection() -> None:
    assert C10.context_budget(32, 0.05) == pytest.approx(3360)
    assert C10.context_budget(100, 0.05) == pytest.approx(2000)
    assert C10.context_budget(200, 0.05) <= 0
    scorer = AladdinPacking(perf=C10, atgt_slo_s=0.05, gamma=0.0, theta=1.0)
    # 31 ongoing requests of 100 tokens + a new one of 200: 3300 <= 3360 fits; 300 does not.
    load = WorkerLoad(tuple(OngoingRequest(100, 0, 1) for _ in range(31)))
    assert scorer.check(OngoingRequest(200, 0, 1), load, 1e9).feasible
    assert not scorer.check(OngoingRequest(300, 0, 1), load, 1e9).feasible
    big = WorkerLoad(tuple(OngoingRequest(1, 0, 1) for _ in range(199)))
    assert not scorer.check(OngoingRequest(1, 0, 1), big, 1e9).feasible


def test_jsq_counterexample_peaks() -> None:
    perf = AladdinPerfModel(k2=1e-9, c2=0.0, c3=0.0, kv_capacity=9)
    scorer = AladdinPacking(perf=perf, atgt_slo_s=1.0, theta=1.0)
    a, b = OngoingRequest(4, 0, 1), OngoingRequest(1, 0, 4)
    assert not scorer.check(a, WorkerLoad((a,)), 9).feasible  # peak 10
    assert not scorer.check(b, WorkerLoad((b,)), 9).feasible  # peak 10
    assert scorer.check(b, WorkerLoad((a,)), 9).feasible  # peak 7
    assert scorer.check(a, WorkerLoad((b,)), 9).feasible
    # As a scorer: B goes to the worker holding A, not the one holding B.
    loads = {"w-a": WorkerLoad((a,)), "w-b": WorkerLoad((b,))}
    s = AladdinPacking(perf=perf, atgt_slo_s=1.0, theta=1.0, load_of=lambda e: loads[str(e)])
    eps = [
        EndpointView(
            EndpointId(n), Role.DECODE, kv_free_blocks=4, kv_total_blocks=9, kv_block_size=1
        )
        for n in loads
    ]
    scores = s.score(RequestView(RequestId("b2"), 1, 4), eps)
    assert scores[EndpointId("w-a")] >= 0.5 > scores[EndpointId("w-b")]


def test_best_fit_prefers_the_most_loaded_feasible_worker() -> None:
    loads = {
        "empty": WorkerLoad(),
        "some": WorkerLoad(tuple(OngoingRequest(200, 10, 100) for _ in range(5))),
        "more": WorkerLoad(tuple(OngoingRequest(200, 10, 100) for _ in range(20))),
        "full": WorkerLoad(tuple(OngoingRequest(3000, 10, 100) for _ in range(100))),
    }
    roomy = AladdinPerfModel(k2=1e-7, c2=2e-4, c3=0.01, kv_capacity=1e9)
    s = AladdinPacking(perf=roomy, atgt_slo_s=0.05, load_of=lambda e: loads[str(e)])
    scores = s.score(req(), [ep(n) for n in loads])
    order = sorted(scores, key=lambda e: -scores[e])
    assert [str(e) for e in order] == ["more", "some", "empty", "full"]
    assert scores[EndpointId("full")] < 0.5


def test_mixed_mode_slack_and_ttft() -> None:
    perf = AladdinPerfModel(k1=1e-4, c1=0.005, k2=1e-7, c2=1e-4, c3=0.01, kv_capacity=1e6)
    tight = WorkerLoad((OngoingRequest(100, 50, 60, decode_s=50 * 0.029),))
    roomy = WorkerLoad((OngoingRequest(100, 50, 60, decode_s=50 * 0.012),))
    s = AladdinPacking(perf=perf, atgt_slo_s=0.03, ttft_slo_s=1.0, mixed=True)
    long_prompt = OngoingRequest(4000, 0, 50, prefilled=False)
    assert not s.check(long_prompt, tight, 1e6).feasible  # (d): stall > θ·slack
    assert s.check(long_prompt, roomy, 1e6).feasible
    assert AladdinPacking(perf=perf, mixed=False).check(long_prompt, tight, 1e6).feasible
    # (c): 12000 prompt tokens take 1.205 s > TTFT 1 s.
    assert not s.check(OngoingRequest(12000, 0, 5, prefilled=False), WorkerLoad(), 1e6).feasible


def test_conditional_mean_predictor() -> None:
    pairs = [(100, 10)] * 10 + [(100, 30)] * 10 + [(3000, 500)] * 20
    t = ConditionalMeanLengths.of(pairs, min_samples=5)
    assert t.predict(100) == 20
    assert t.predict(3000) == 500
    assert t.predict(100, generated_tokens=20) == 30  # E[l | l > 20]
    assert t.predict(100, generated_tokens=40) == 41  # nothing longer seen: one more token
    sparse = ConditionalMeanLengths.of([(5, 7)] * 3 + [(5000, 9)] * 30, min_samples=5)
    assert sparse.predict(5) == round((7 * 3 + 9 * 30) / 33)  # falls back to all samples
    s = AladdinPacking(lengths=t)
    assert s.predict(req(100, 15)) == 15  # never above max_tokens
    assert s.predict(req(100, 1000)) == 20


loads_st = st.lists(
    st.tuples(st.integers(1, 3000), st.integers(0, 500), st.integers(1, 800)), max_size=40
)


@given(loads_st, st.integers(1, 4000), st.integers(1, 800))
def test_knobs_are_monotone(ongoing: list[tuple[int, int, int]], prompt: int, out: int) -> None:
    load = WorkerLoad(tuple(OngoingRequest(p, g, max(g + 1, o)) for p, g, o in ongoing))
    new = OngoingRequest(prompt, 0, out, prefilled=False)
    perf = AladdinPerfModel(kv_capacity=60_000)
    for mixed in (False, True):
        loose = AladdinPacking(perf=perf, theta=0.95, gamma=0.5, mixed=mixed)
        for strict in (
            AladdinPacking(perf=perf, theta=0.8, gamma=0.5, mixed=mixed),
            AladdinPacking(perf=perf, theta=0.95, gamma=1.0, mixed=mixed),
        ):
            if strict.check(new, load, 60_000).feasible:
                assert loose.check(new, load, 60_000).feasible


endpoints_st = st.lists(
    st.tuples(st.integers(0, 4000), st.integers(0, 4000), st.integers(0, 300)),
    min_size=1,
    max_size=8,
)


@given(endpoints_st, st.integers(1, 3000), st.integers(1, 2000))
def test_scores_in_unit_interval_and_feasible_first(
    specs: list[tuple[int, int, int]], prompt: int, out: int
) -> None:
    eps = [
        EndpointView(
            EndpointId(f"e{i}"),
            Role.DECODE,
            num_running=run,
            kv_free_blocks=min(free, total),
            kv_total_blocks=total,
        )
        for i, (free, total, run) in enumerate(specs)
    ]
    s = AladdinPacking()
    scores = s.score(req(prompt, out), eps)
    assert set(scores) == {e.id for e in eps}
    assert all(0.0 <= v <= 1.0 for v in scores.values())
    feasible = [v for v in scores.values() if v >= 0.5]
    infeasible = [v for v in scores.values() if v < 0.5]
    if feasible and infeasible:
        assert min(feasible) > max(infeasible)


def test_registered_and_builds_in_a_profile() -> None:
    assert SCORERS.get("aladdin-pack") is AladdinPacking
    profile = build_profile(
        ProfileSpec("d", (), (PluginSpec("aladdin-pack", 1.0, {"theta": 0.8}),))
    )
    busy = EndpointView(
        EndpointId("b"), Role.DECODE, num_running=4, kv_free_blocks=3000, kv_total_blocks=3500
    )
    ranked = profile.rank(req(), [ep("a"), busy])
    assert ranked[0] == EndpointId("b")  # best fit: the one already holding KV
    with pytest.raises(ValueError, match="theta"):
        AladdinPacking(theta=0.0)


def test_prediction_error_accumulates_as_alg2() -> None:
    t = ConditionalMeanLengths.of([(100, 10)] * 10 + [(100, 30)] * 10, min_samples=5)
    ongoing = (
        OngoingRequest(100, 25, 20),  # under-estimated: re-predicted 30, +10 tokens, +1
        OngoingRequest(100, 5, 20),  # on track: nothing
    )
    err = prediction_error(ongoing, [(8, 20), (40, 20)], t)  # one ended early: −12, −1
    assert err == PredictionError(10 - 12, 0)
    assert prediction_error((), ()) == PredictionError()


def test_rebalance_no_moves_with_a_perfect_predictor_and_moves_off_an_overrun() -> None:
    perf = AladdinPerfModel()
    a, b = EndpointId("a"), EndpointId("b")
    pending = {"n1": (a, 100), "n2": (a, 300), "n3": (b, 50)}
    assert rebalance({a: PredictionError(), b: PredictionError()}, pending, perf) == {}
    errors = {a: PredictionError(400.0, 2.0), b: PredictionError(-300.0, -2.0)}
    moves = rebalance(errors, pending, perf)
    assert moves
    assert set(moves.values()) == {b}
    assert all(pending[r][0] == a for r in moves)  # only requests on the overrun worker move


@given(
    st.lists(st.tuples(st.floats(-2000, 2000), st.integers(-10, 10)), min_size=2, max_size=5),
    st.lists(st.tuples(st.integers(0, 4), st.integers(1, 800)), max_size=12),
)
def test_rebalance_never_raises_the_total_error(
    errs: list[tuple[float, int]], reqs: list[tuple[int, int]]
) -> None:
    perf = AladdinPerfModel()
    ids = [EndpointId(f"w{i}") for i in range(len(errs))]
    errors = {
        e: PredictionError(length, batch) for e, (length, batch) in zip(ids, errs, strict=True)
    }
    pending = {f"r{j}": (ids[w % len(ids)], pred) for j, (w, pred) in enumerate(reqs)}
    moves = rebalance(errors, pending, perf)
    after = {e: [v.length, v.batch] for e, v in errors.items()}
    for rid, dst in moves.items():
        src, pred = pending[rid]
        after[src][0] -= pred
        after[src][1] -= 1
        after[dst][0] += pred
        after[dst][1] += 1
    total_before = sum(v.distance(perf) for v in errors.values())
    total_after = sum(PredictionError(x, y).distance(perf) for x, y in after.values())
    assert total_after <= total_before + 1e-9
