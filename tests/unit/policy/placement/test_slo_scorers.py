"""SLO-headroom scorers, Past-Future's future-peak KV scorer, the fair picker and the
disaggregation modes: scores in [0, 1], better predictions never score lower."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from splitserve.core.ids import EndpointId, RequestId
from splitserve.core.roles import Role
from splitserve.policy.placement import (
    Disaggregation,
    EndpointView,
    Path,
    PdDecider,
    PdDeciderParams,
    RequestView,
    build_profile,
    default_decode_profile,
    default_prefill_profile,
)
from splitserve.policy.placement.aladdin import OngoingRequest, WorkerLoad
from splitserve.policy.placement.pastfuture import FuturePeakKv, future_peak_tokens
from splitserve.policy.placement.pickers import FairMaxScore
from splitserve.policy.placement.slo import TpotHeadroom, TtftHeadroom

views = st.builds(
    lambda i, pending, rate, base, per, running, free: EndpointView(
        EndpointId(f"e{i}"),
        Role.DECODE,
        num_running=running,
        kv_free_blocks=free,
        kv_total_blocks=100,
        pending_prefill_tokens=pending,
        prefill_tokens_per_s=rate,
        decode_step_base_s=base,
        decode_step_per_seq_s=per,
    ),
    st.integers(0, 1000),
    st.integers(0, 100_000),
    st.floats(0, 1e5, allow_nan=False),
    st.floats(0, 1, allow_nan=False),
    st.floats(0, 0.1, allow_nan=False),
    st.integers(0, 64),
    st.integers(0, 100),
)
budgets = st.none() | st.floats(-1, 10, allow_nan=False)


@given(
    st.lists(views, max_size=8, unique_by=lambda v: v.id), budgets, budgets, st.integers(1, 4000)
)
def test_slo_scores_in_unit_interval(
    eps: list[EndpointView], ttft: float | None, tpot: float | None, prompt: int
) -> None:
    req = RequestView(RequestId("r"), prompt, 16, ttft_budget_s=ttft, tpot_target_s=tpot)
    for scorer in (TtftHeadroom(), TpotHeadroom(), FuturePeakKv()):
        for s in scorer.score(req, eps).values():
            assert 0.0 <= s <= 1.0


@given(st.integers(0, 10_000), st.integers(0, 10_000), st.floats(0.01, 10))
def test_less_pending_prefill_never_scores_lower(a: int, b: int, budget: float) -> None:
    lo, hi = sorted((a, b))
    e1 = EndpointView(
        EndpointId("a"), Role.PREFILL, pending_prefill_tokens=lo, prefill_tokens_per_s=5000.0
    )
    e2 = EndpointView(
        EndpointId("b"), Role.PREFILL, pending_prefill_tokens=hi, prefill_tokens_per_s=5000.0
    )
    s = TtftHeadroom().score(RequestView(RequestId("r"), 100, 8, ttft_budget_s=budget), [e1, e2])
    assert s[e1.id] >= s[e2.id]


def test_no_estimate_is_neutral() -> None:
    e = EndpointView(EndpointId("a"), Role.DECODE)
    req = RequestView(RequestId("r"), 10, 8, ttft_budget_s=1.0, tpot_target_s=0.1)
    assert TtftHeadroom().score(req, [e]) == {e.id: 0.5}
    assert TpotHeadroom().score(req, [e]) == {e.id: 0.5}


def test_future_peak() -> None:
    assert future_peak_tokens([]) == 0
    assert future_peak_tokens([(10, 5)]) == 15
    # two requests: both alive until k=2: 2*? -> max(10+20+2*2, 20+8) = 34
    assert future_peak_tokens([(10, 2), (20, 8)]) == max(10 + 20 + 2 * 2, 20 + 8)
    loads = {
        EndpointId("long"): WorkerLoad((OngoingRequest(100, 0, 900),)),
        EndpointId("short"): WorkerLoad((OngoingRequest(100, 0, 10),)),
    }
    eps = [EndpointView(e, Role.DECODE, kv_total_blocks=100, kv_free_blocks=90) for e in loads]
    s = FuturePeakKv(load_of=loads.__getitem__).score(RequestView(RequestId("r"), 50, 100), eps)
    assert s[EndpointId("short")] > s[EndpointId("long")]


def test_fair_picker_rotates_ties_only() -> None:
    picker = FairMaxScore()
    tie = {EndpointId("a"): 1.0, EndpointId("b"): 1.0, EndpointId("c"): 0.5}
    firsts = [picker.order(tie)[0] for _ in range(4)]
    assert firsts == ["a", "b", "a", "b"]
    assert picker.order(tie)[-1] == "c"
    assert picker.order({EndpointId("a"): 0.2, EndpointId("b"): 0.9})[0] == "b"


def _decider(mode: Disaggregation, min_pd: int = 1) -> PdDecider:
    return PdDecider(
        build_profile(default_decode_profile()),
        build_profile(default_prefill_profile()),
        PdDeciderParams(min_prompt_tokens_for_pd=min_pd, mode=mode),
    )


def test_disaggregation_modes() -> None:
    eps = [EndpointView(EndpointId("d"), Role.DECODE), EndpointView(EndpointId("p"), Role.PREFILL)]
    req = RequestView(RequestId("r"), 100, 8)
    assert _decider(Disaggregation.NEVER).place(req, eps).reason == "never"
    always = _decider(Disaggregation.ALWAYS, min_pd=1000).place(req, eps)
    assert (always.path, always.reason) == (Path.DISAGGREGATED, "split")
    auto = _decider(Disaggregation.AUTO, min_pd=1000).place(req, eps)
    assert (auto.path, auto.reason) == (Path.AGGREGATED, "short_prompt")


def test_auto_serves_aggregated_when_the_prefill_queue_would_miss_ttft() -> None:
    p = EndpointView(
        EndpointId("p"), Role.PREFILL, pending_prefill_tokens=50_000, prefill_tokens_per_s=10_000.0
    )
    d = EndpointView(
        EndpointId("d"),
        Role.DECODE,
        pending_prefill_tokens=0,
        prefill_tokens_per_s=10_000.0,
        decode_step_base_s=0.01,
        decode_step_per_seq_s=0.001,
    )
    tight = RequestView(RequestId("r"), 500, 8, ttft_budget_s=1.0, tpot_target_s=0.1)
    placed = _decider(Disaggregation.AUTO).place(tight, [p, d])
    assert (placed.path, placed.reason) == (Path.AGGREGATED, "prefill_would_miss_ttft")
    loose = RequestView(RequestId("r"), 500, 8, ttft_budget_s=10.0, tpot_target_s=0.1)
    assert _decider(Disaggregation.AUTO).place(loose, [p, d]).path is Path.DISAGGREGATED
    # Always never takes that shortcut
    assert _decider(Disaggregation.ALWAYS).place(tight, [p, d]).path is Path.DISAGGREGATED
