"""`PdDecider`'s `pull_would_miss_tpot` rule: serve aggregated when the KV pull alone would
break the TPOT target and a decode-capable worker meets TTFT running the whole request."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from splitserve.core.ids import EndpointId, RequestId
from splitserve.core.roles import Role
from splitserve.policy.placement import (
    EndpointView,
    Path,
    PdDecider,
    PdDeciderParams,
    RequestView,
    build_profile,
    default_decode_profile,
    default_prefill_profile,
)
from splitserve.policy.placement.decider import REASONS, Disaggregation
from splitserve.policy.placement.slo import predicted_pull_s

PULL_RATE = 10_000.0  # prompt tokens per second over a decode worker's link
PREFILL_RATE = 8_000.0


def ep(name: str, role: Role = Role.DECODE, **kw: object) -> EndpointView:
    defaults: dict[str, object] = {
        "kv_free_blocks": 1000,
        "kv_total_blocks": 1000,
        "prefill_tokens_per_s": PREFILL_RATE,
        "kv_pull_tokens_per_s": PULL_RATE if role is not Role.PREFILL else 0.0,
    }
    defaults.update(kw)
    return EndpointView(EndpointId(name), role, **defaults)  # type: ignore[arg-type]


def req(
    prompt: int = 4000,
    predicted: int | None = 7,
    budget: float | None = 2.0,
    tpot: float | None = 0.1,
    max_tokens: int = 4096,
) -> RequestView:
    return RequestView(
        RequestId("r"),
        num_prompt_tokens=prompt,
        max_tokens=max_tokens,
        predicted_output_tokens=predicted,
        ttft_budget_s=budget,
        tpot_target_s=tpot,
    )


def decider(mode: Disaggregation = Disaggregation.AUTO) -> PdDecider:
    return PdDecider(
        build_profile(default_decode_profile()),
        build_profile(default_prefill_profile()),
        PdDeciderParams(mode=mode),
    )


def test_reason_is_a_known_label() -> None:
    assert "pull_would_miss_tpot" in REASONS


def test_predicted_pull_counts_the_pulls_ahead() -> None:
    e = ep("d", pending_pull_tokens=6000)
    assert predicted_pull_s(e, 4000) == 1.0
    assert predicted_pull_s(ep("d", kv_pull_tokens_per_s=0.0), 4000) is None


def test_long_pull_short_output_runs_aggregated_on_a_decode_worker() -> None:
    # 6,000 + 4,000 tokens at 10k/s = 1 s over 6 gaps = 167 ms > 100 ms.
    eps = [ep("p", Role.PREFILL), ep("d", pending_pull_tokens=6000)]
    placed = decider().place(req(), eps)
    assert (placed.path, placed.reason) == (Path.AGGREGATED, "pull_would_miss_tpot")
    assert placed.decode[0] == EndpointId("d")
    assert placed.prefill == ()


def test_pull_within_the_target_splits() -> None:
    # 4,000 tokens at 10k/s = 0.4 s over 6 gaps = 67 ms <= 100 ms.
    eps = [ep("p", Role.PREFILL), ep("d")]
    assert decider().place(req(), eps).reason == "split"


def test_a_longer_predicted_output_spreads_the_pull() -> None:
    eps = [ep("p", Role.PREFILL), ep("d", pending_pull_tokens=6000)]
    assert decider().place(req(predicted=7), eps).reason == "pull_would_miss_tpot"
    assert decider().place(req(predicted=200), eps).reason == "split"


def test_one_token_has_no_gap_to_stretch() -> None:
    eps = [ep("p", Role.PREFILL), ep("d", pending_pull_tokens=60_000)]
    assert decider().place(req(predicted=1), eps).reason == "split"


def test_max_tokens_stands_in_when_nothing_is_predicted() -> None:
    eps = [ep("p", Role.PREFILL), ep("d", pending_pull_tokens=6000)]
    assert decider().place(req(predicted=None, max_tokens=4), eps).reason == (
        "pull_would_miss_tpot"
    )
    assert decider().place(req(predicted=None, max_tokens=4096), eps).reason == "split"


def test_without_slo_or_estimates_it_splits() -> None:
    eps = [ep("p", Role.PREFILL), ep("d", pending_pull_tokens=60_000)]
    assert decider().place(req(tpot=None), eps).reason == "split"
    assert decider().place(req(budget=None), eps).reason == "split"
    no_rate = [ep("p", Role.PREFILL), ep("d", pending_pull_tokens=60_000, kv_pull_tokens_per_s=0)]
    assert decider().place(req(), no_rate).reason == "split"


def test_not_when_no_decode_worker_meets_ttft() -> None:
    # 40,000 pending prefill tokens at 8k/s: 5.5 s > the 2 s budget.
    eps = [
        ep("p", Role.PREFILL),
        ep("d", pending_pull_tokens=60_000, pending_prefill_tokens=40_000),
    ]
    assert decider().place(req(), eps).reason == "split"


def test_the_first_decode_worker_that_meets_ttft_is_chosen() -> None:
    eps = [
        ep("p", Role.PREFILL),
        ep("a", pending_pull_tokens=60_000),  # the decode ranking's first (least loaded)
        ep("b", pending_prefill_tokens=40_000, num_running=1),
    ]
    placed = decider().place(req(), eps)
    assert placed.reason == "pull_would_miss_tpot"
    assert placed.decode[0] == EndpointId("a")
    busy_first = [
        ep("p", Role.PREFILL),
        ep("a", pending_pull_tokens=60_000, pending_prefill_tokens=40_000),
        ep("b", num_running=1),
    ]
    placed = decider().place(req(), busy_first)
    assert placed.reason == "pull_would_miss_tpot"
    assert placed.decode == (EndpointId("b"), EndpointId("a"))


def test_not_where_the_prefill_would_stall_running_decodes() -> None:
    # A 4,000-token prefill at 8k/s stalls d's batch 0.5 s, over 6 gaps: 83 ms + its TPOT.
    stalled = ep(
        "d",
        pending_pull_tokens=60_000,
        num_running=4,
        decode_step_base_s=0.02,
        decode_step_per_seq_s=0.001,
    )
    eps = [ep("p", Role.PREFILL), stalled]
    assert decider().place(req(), eps).reason == "split"
    idle = ep("d", pending_pull_tokens=60_000, decode_step_base_s=0.02, decode_step_per_seq_s=0.001)
    assert decider().place(req(), [ep("p", Role.PREFILL), idle]).reason == ("pull_would_miss_tpot")


def test_not_where_the_decode_worker_would_miss_tpot() -> None:
    slow = ep("d", pending_pull_tokens=60_000, decode_step_base_s=0.2)
    assert decider().place(req(), [ep("p", Role.PREFILL), slow]).reason == "split"


def test_only_in_auto_mode() -> None:
    eps = [ep("p", Role.PREFILL), ep("d", pending_pull_tokens=60_000)]
    assert decider(Disaggregation.ALWAYS).place(req(), eps).reason == "split"
    assert decider(Disaggregation.NEVER).place(req(), eps).reason == "never"


workers: st.SearchStrategy[list[dict[str, object]]] = st.lists(
    st.fixed_dictionaries(
        {
            "pending_prefill_tokens": st.integers(0, 50_000),
            "num_running": st.integers(0, 8),
            "decode_step_base_s": st.sampled_from([0.0, 0.01, 0.05, 0.2]),
            "decode_step_per_seq_s": st.sampled_from([0.0, 0.001, 0.01]),
            "kv_pull_tokens_per_s": st.sampled_from([0.0, 2_000.0, 10_000.0]),
        }
    ),
    min_size=1,
    max_size=4,
)
requests = st.builds(
    req,
    prompt=st.integers(1, 16_000),
    predicted=st.one_of(st.none(), st.integers(1, 300)),
    budget=st.one_of(st.none(), st.floats(0.0, 5.0)),
    tpot=st.one_of(st.none(), st.floats(0.01, 0.3)),
    max_tokens=st.integers(1, 4096),
)


def _eps(specs: list[dict[str, object]], pending: int) -> list[EndpointView]:
    out = [ep("p", Role.PREFILL)]
    for i, kw in enumerate(specs):
        out.append(ep(f"d{i}", Role.DECODE, pending_pull_tokens=pending, **kw))
    return out


@given(requests, workers, st.integers(0, 100_000))
def test_never_aggregated_when_no_decode_worker_meets_ttft(
    r: RequestView, specs: list[dict[str, object]], pending: int
) -> None:
    eps = _eps(specs, pending)
    placed = decider().place(r, eps)
    if placed.reason != "pull_would_miss_tpot":
        return
    assert r.ttft_budget_s is not None
    chosen = next(e for e in eps if e.id == placed.decode[0])
    assert chosen.role.can_generate
    assert (chosen.pending_prefill_tokens + r.num_prompt_tokens) / (
        chosen.prefill_tokens_per_s
    ) <= r.ttft_budget_s
    assert placed.prefill == ()
    assert sorted(placed.decode) == sorted(e.id for e in eps if e.role is Role.DECODE)


@given(requests, workers, st.integers(0, 100_000), st.integers(1, 100_000))
def test_monotone_in_pull_time(
    r: RequestView, specs: list[dict[str, object]], pending: int, more: int
) -> None:
    """More pull queued on the decode workers never turns `pull_would_miss_tpot` into a split."""
    before = decider().place(r, _eps(specs, pending))
    after = decider().place(r, _eps(specs, pending + more))
    if before.reason == "pull_would_miss_tpot":
        assert after.reason == "pull_would_miss_tpot"
        assert after.decode == before.decode
