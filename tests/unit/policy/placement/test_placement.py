"""Placement pipeline.

Invariants (hypothesis): filters never add endpoints; every scorer's scores stay in [0, 1]; the
ranking holds exactly the eligible endpoints; the decider never picks a fenced, draining or
unready endpoint, nor a prefill endpoint in the decode role or vice versa.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from splitserve.core.errors import ConfigError, NoEligibleEndpoint
from splitserve.core.ids import EndpointId, RequestId
from splitserve.core.roles import Role
from splitserve.policy.placement import (
    FILTERS,
    SCORERS,
    EndpointView,
    Path,
    PdDecider,
    PdDeciderParams,
    PluginSpec,
    ProfileSpec,
    RequestView,
    build_profile,
    default_decode_profile,
    default_prefill_profile,
)


def ep(name: str, role: Role = Role.DECODE, **kw: object) -> EndpointView:
    defaults: dict[str, object] = {"kv_free_blocks": 100, "kv_total_blocks": 100}
    defaults.update(kw)
    return EndpointView(EndpointId(name), role, **defaults)  # type: ignore[arg-type]


REQ = RequestView(RequestId("r"), num_prompt_tokens=100, max_tokens=10)


def decider(min_pd: int = 1) -> PdDecider:
    return PdDecider(
        build_profile(default_decode_profile()),
        build_profile(default_prefill_profile()),
        PdDeciderParams(min_prompt_tokens_for_pd=min_pd),
    )


def test_disaggregated_when_both_roles_available() -> None:
    p = decider().place(REQ, [ep("d1"), ep("p1", Role.PREFILL)])
    assert p.path is Path.DISAGGREGATED
    assert p.decode == ("d1",)
    assert p.prefill == ("p1",)


@pytest.mark.parametrize(
    ("endpoints", "reason"),
    [
        ([ep("d1")], "no_prefill_worker"),
        ([ep("d1"), ep("p1", Role.PREFILL, fenced=True)], "no_prefill_worker"),
        ([ep("d1"), ep("p1", Role.PREFILL, ready=False)], "no_prefill_worker"),
    ],
    ids=["no-prefill", "prefill-fenced", "prefill-unready"],
)
def test_aggregated_fallbacks(endpoints: list[EndpointView], reason: str) -> None:
    p = decider().place(REQ, endpoints)
    assert p.path is Path.AGGREGATED
    assert p.reason == reason


def test_short_prompts_run_aggregated() -> None:
    p = decider(min_pd=512).place(REQ, [ep("d1"), ep("p1", Role.PREFILL)])
    assert (p.path, p.reason) == (Path.AGGREGATED, "short_prompt")


def test_no_decode_worker_is_an_error() -> None:
    with pytest.raises(NoEligibleEndpoint):
        decider().place(REQ, [ep("p1", Role.PREFILL), ep("d1", draining=True)])


def test_least_loaded_decode_first_and_fallback_order() -> None:
    eps = [ep("d1", num_running=5), ep("d2", num_running=1), ep("m1", Role.MIXED, num_running=3)]
    assert decider().place(REQ, eps).decode == ("d2", "m1", "d1")


def test_prefill_prefers_fewest_pending_tokens() -> None:
    eps = [
        ep("d1"),
        ep("p1", Role.PREFILL, pending_prefill_tokens=5000),
        ep("p2", Role.PREFILL, pending_prefill_tokens=10),
    ]
    assert decider().place(REQ, eps).prefill[0] == "p2"


def test_workers_with_stale_reports_rank_after_every_fresh_one() -> None:
    """A frozen worker looks idle in the router's own view; it was ranked first and its
    requests waited the whole stall timeout. Now it is a last resort, never dropped."""
    eps = [
        ep("d1", num_running=5),
        ep("d2", stale=True),
        ep("p1", Role.PREFILL, stale=True),
        ep("p2", Role.PREFILL, pending_prefill_tokens=5000),
    ]
    p = decider().place(REQ, eps)
    assert p.decode == ("d1", "d2")
    assert p.prefill == ("p2", "p1")
    # Every worker stale (a machine starved of CPU): placement goes on from the own view.
    alone = decider().place(REQ, [ep("d2", stale=True), ep("d3", stale=True, num_running=1)])
    assert alone.decode == ("d2", "d3")


def test_ties_break_by_id_for_reproducibility() -> None:
    eps = [ep("d2"), ep("d1"), ep("d3")]
    assert decider().place(REQ, eps).decode == ("d1", "d2", "d3")


def test_bad_profile_specs_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="unknown placement scorer"):
        build_profile(ProfileSpec("x", (), (PluginSpec("nope"),)))
    with pytest.raises(ConfigError, match="weight > 0"):
        build_profile(ProfileSpec("x", (), (PluginSpec("least-loaded", weight=0),)))
    with pytest.raises(ConfigError, match="at least one scorer"):
        build_profile(ProfileSpec("x", (), ()))
    with pytest.raises(ConfigError, match="bad params"):
        build_profile(ProfileSpec("x", (), (PluginSpec("least-loaded", params={"x": 1}),)))


endpoints = st.lists(
    st.builds(
        EndpointView,
        id=st.sampled_from([EndpointId(f"e{i}") for i in range(8)]),
        role=st.sampled_from(list(Role)),
        ready=st.booleans(),
        fenced=st.booleans(),
        draining=st.booleans(),
        num_waiting=st.integers(0, 50),
        num_running=st.integers(0, 50),
        kv_free_blocks=st.integers(0, 100),
        kv_total_blocks=st.integers(0, 100),
        pending_prefill_tokens=st.integers(0, 10**6),
        inflight=st.integers(0, 20),
    ),
    max_size=8,
    unique_by=lambda e: e.id,
)
requests = st.builds(
    RequestView,
    id=st.just(RequestId("r")),
    num_prompt_tokens=st.integers(1, 4096),
    max_tokens=st.integers(1, 512),
)


@given(requests, endpoints)
def test_filters_never_add(req: RequestView, eps: list[EndpointView]) -> None:
    for name in FILTERS.names():
        out = FILTERS.get(name)().filter(req, eps)
        assert {e.id for e in out} <= {e.id for e in eps}


@given(requests, endpoints)
def test_scores_stay_in_unit_interval(req: RequestView, eps: list[EndpointView]) -> None:
    for name in SCORERS.names():
        scores = SCORERS.get(name)().score(req, eps)
        assert set(scores) <= {e.id for e in eps}
        assert all(0.0 <= s <= 1.0 for s in scores.values())


@given(requests, endpoints)
def test_decider_respects_roles_and_readiness(req: RequestView, eps: list[EndpointView]) -> None:
    by_id = {e.id: e for e in eps}
    try:
        p = decider().place(req, eps)
    except NoEligibleEndpoint:
        assert not any(e.accepts_work and e.role.can_decode for e in eps)
        return
    assert sorted(p.decode) == sorted(e.id for e in eps if e.accepts_work and e.role.can_decode)
    assert all(by_id[e].role is Role.PREFILL and by_id[e].accepts_work for e in p.prefill)
    assert (p.path is Path.DISAGGREGATED) == bool(p.prefill)
