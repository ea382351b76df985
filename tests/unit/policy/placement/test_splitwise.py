"""Splitwise's pools as placement plugins: JSQ per phase, overflow own → mixed → opposite pool.

Invariants (research/seed-splitwise-tetriinfer.md A9.1, A9.5-A9.7 and the module docstring):
1. scores lie in [0, 1]; the filter returns a subset, empty only when no endpoint accepts work
   (hypothesis);
2. the overflow scorer's top endpoint lies in the tier the filter keeps, and a prompt never goes
   to the opposite pool while its own or the mixed pool has a machine not overloaded (hypothesis);
3. JSQ: pending prompt tokens {4000, 1000, 2500} + a 1500-token prompt → the 1000 machine; the
   token phase goes to the machine with the least reserved KV;
4. overflow: all prompt machines over the 8192-token threshold → a mixed machine; with none, the
   least-loaded token machine is borrowed; token machines memory-full → a prompt machine;
5. the decider places prompt and token machines together, and runs a request whole when both
   picks coincide;
6. both plugins are registered and build with no params and from string params.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from splitserve.core.ids import EndpointId, RequestId
from splitserve.core.roles import Role
from splitserve.policy.placement import FILTERS, SCORERS, Path, PluginSpec, ProfileSpec
from splitserve.policy.placement.base import EndpointView, RequestView
from splitserve.policy.placement.decider import REASONS, PdDeciderParams
from splitserve.policy.placement.profile import build_profile
from splitserve.policy.placement.splitwise import (
    Phase,
    SplitwiseDecider,
    SplitwiseOverflow,
    SplitwisePoolFilter,
    SplitwisePools,
    Tier,
)


def ep(
    name: str,
    role: Role,
    pending: int = 0,
    waiting: int = 1,
    free: int = 1000,
    total: int = 1000,
    ready: bool = True,
) -> EndpointView:
    return EndpointView(
        EndpointId(name),
        role,
        ready=ready,
        num_waiting=waiting,
        pending_prefill_tokens=pending,
        kv_free_blocks=free,
        kv_total_blocks=total,
    )


def req(prompt: int = 1500, out: int = 100) -> RequestView:
    return RequestView(RequestId("r"), prompt, out)


def best(scores: Mapping[EndpointId, float]) -> str:
    return str(max(sorted(scores), key=lambda e: scores[e]))


def kept(f: SplitwisePoolFilter, r: RequestView, eps: Sequence[EndpointView]) -> set[str]:
    return {str(e.id) for e in f.filter(r, eps)}


def test_prompt_jsq_on_pending_tokens() -> None:
    eps = [ep(f"p{i}", Role.PREFILL, pending=n) for i, n in enumerate((4000, 1000, 2500))]
    scorer = SplitwiseOverflow()
    assert best(scorer.score(req(1500), eps)) == "p1"
    assert kept(SplitwisePoolFilter(), req(1500), eps) == {"p0", "p1", "p2"}


def test_token_jsq_on_reserved_kv() -> None:
    eps = [ep("t0", Role.DECODE, free=300), ep("t1", Role.DECODE, free=700)]
    assert best(SplitwiseOverflow(phase=Phase.TOKEN).score(req(), eps)) == "t1"
    reserved = {"t0": 100, "t1": 600}
    owner = SplitwiseOverflow(phase=Phase.TOKEN, reserved_of=lambda e: reserved[str(e)])
    assert best(owner.score(req(), eps)) == "t0"


def test_prompt_overflows_to_mixed_then_borrows_token_machine() -> None:
    full = [ep(f"p{i}", Role.PREFILL, pending=8000) for i in range(2)]
    tokens = [ep("t0", Role.DECODE, pending=300), ep("t1", Role.DECODE, pending=0)]
    f = SplitwisePoolFilter()
    # no mixed pool: the token machines are borrowed, least pending first
    assert kept(f, req(1500), full + tokens) == {"t0", "t1"}
    assert best(SplitwiseOverflow().score(req(1500), full + tokens)) == "t1"
    # t0 already borrowed into the mixed pool: it takes the prompt before the others
    borrowed = SplitwisePoolFilter(in_mixed=lambda e: str(e) == "t0")
    assert kept(borrowed, req(1500), full + tokens) == {"t0"}
    # a prompt machine with no queue is never overloaded, whatever its pending tokens
    idle = [ep("p2", Role.PREFILL, pending=9000, waiting=0)]
    assert kept(f, req(1500), full + tokens + idle) == {"p2"}


def test_token_phase_borrows_prompt_machine_when_memory_full() -> None:
    eps = [
        ep("t0", Role.DECODE, free=10),
        ep("t1", Role.DECODE, free=5),
        ep("p0", Role.PREFILL, free=900),
        ep("m0", Role.MIXED, free=0),
    ]
    f = SplitwisePoolFilter(phase=Phase.TOKEN)
    assert kept(f, req(1500, 100), eps) == {"p0"}
    assert best(SplitwiseOverflow(phase=Phase.TOKEN).score(req(1500, 100), eps)) == "p0"
    # watermark: 0.5 of capacity counts a half-full machine as overloaded
    half = [ep("t0", Role.DECODE, free=480), ep("p0", Role.PREFILL)]
    assert kept(
        SplitwisePoolFilter(phase=Phase.TOKEN, token_memory_watermark=0.5), req(), half
    ) == {"p0"}


def test_everything_full_keeps_every_live_machine_and_none_when_none_live() -> None:
    f = SplitwisePoolFilter()
    only_prompt = [ep("p0", Role.PREFILL, pending=9000), ep("p1", Role.PREFILL, pending=9000)]
    assert kept(f, req(1500), only_prompt) == {"p0", "p1"}
    assert kept(f, req(), [ep("p0", Role.PREFILL, ready=False)]) == set()


def _profiles(phase: str) -> ProfileSpec:
    return ProfileSpec(
        name=phase,
        filters=(PluginSpec("splitwise-pool", params={"phase": phase}),),
        scorers=(PluginSpec("splitwise-overflow", 1.0, {"phase": phase}),),
    )


def test_decider_picks_both_machines_and_runs_whole_when_they_coincide() -> None:
    decider = SplitwiseDecider(
        build_profile(_profiles("token")),
        build_profile(_profiles("prompt")),
        PdDeciderParams(min_prompt_tokens_for_pd=1),
    )
    eps = [ep("p0", Role.PREFILL, pending=0), ep("t0", Role.DECODE, free=1000)]
    placed = decider.place(req(), eps)
    assert placed.path is Path.DISAGGREGATED
    assert (placed.prefill[0], placed.decode[0]) == ("p0", "t0")
    # one mixed machine only: prompt and token machine coincide -> whole request there
    placed = decider.place(req(), [ep("m0", Role.MIXED)])
    assert placed.path is Path.AGGREGATED
    assert placed.decode[0] == "m0"
    # a bounded metric label (`splitserve_router_placements_total{reason}`); it was the
    # sentence "prompt and token machine coincide" on the live router's /metrics
    assert placed.reason == "same_worker"
    assert placed.reason in REASONS


def test_registered_and_buildable() -> None:
    assert isinstance(FILTERS.get("splitwise-pool")(), SplitwisePoolFilter)
    assert isinstance(SCORERS.get("splitwise-overflow")(), SplitwiseOverflow)
    built = build_profile(_profiles("token")).filters[0]
    assert isinstance(built, SplitwisePoolFilter)
    assert built.phase is Phase.TOKEN  # a string param from a spec becomes the enum
    with pytest.raises(ValueError, match="threshold"):
        SplitwisePools(prompt_queue_threshold_tokens=0)


roles = st.sampled_from([Role.PREFILL, Role.DECODE, Role.MIXED])
endpoints = st.lists(
    st.builds(
        lambda i, role, pending, waiting, free, ready: ep(
            f"e{i}", role, pending, waiting, free, 1000, ready
        ),
        st.integers(0, 10_000),
        roles,
        st.integers(0, 20_000),
        st.integers(0, 3),
        st.integers(0, 1000),
        st.booleans(),
    ),
    max_size=8,
    unique_by=lambda e: e.id,
)
phases = st.sampled_from([Phase.PROMPT, Phase.TOKEN])
requests = st.builds(req, st.integers(1, 9000), st.integers(1, 2000))


@given(endpoints, phases, requests, st.sets(st.integers(0, 10_000)))
def test_invariants(
    eps: list[EndpointView], phase: Phase, r: RequestView, borrowed: set[int]
) -> None:
    in_mixed = {EndpointId(f"e{i}") for i in borrowed}.__contains__
    f = SplitwisePoolFilter(phase=phase, in_mixed=in_mixed)
    s = SplitwiseOverflow(phase=phase, in_mixed=in_mixed)
    out = f.filter(r, eps)
    assert {e.id for e in out} <= {e.id for e in eps}
    assert bool(out) == any(e.accepts_work for e in eps)
    scores = s.score(r, eps)
    assert all(0.0 <= v <= 1.0 for v in scores.values())
    live = [e for e in eps if e.accepts_work]
    if not live:
        return
    pools = f.pools
    live_scores = {e.id: scores[e.id] for e in live}
    top = next(e for e in live if e.id == best(live_scores))
    assert top.id in {e.id for e in out}
    usable = [e for e in live if pools.effective_tier(r, e) in (Tier.OWN, Tier.MIXED)]
    if usable:
        assert pools.effective_tier(r, top) in (Tier.OWN, Tier.MIXED)
        assert all(pools.tier(e) is not Tier.OPPOSITE for e in out)
