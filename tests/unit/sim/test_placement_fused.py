"""`Profile.rank`'s inlined path for built-in plugins (the simulator's hot path, issue 4) ranks
exactly as the plugins do: same order, for every mix of built-in filters and scorers, weights,
ties, odd reports (free > total, negative free, zero total) and repeated endpoint ids."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from splitserve.core.ids import EndpointId, RequestId
from splitserve.core.roles import Role
from splitserve.policy.placement import (
    EndpointView,
    PluginSpec,
    ProfileSpec,
    RequestView,
    build_profile,
    default_decode_profile,
    default_prefill_profile,
)
from splitserve.policy.placement.profile import Profile
from splitserve.policy.placement.scorers import LeastLoaded

_FILTERS = [
    PluginSpec("accepts-work"),
    PluginSpec("role", params={"roles": frozenset({Role.DECODE, Role.MIXED})}),
    PluginSpec("role", params={"roles": frozenset({Role.PREFILL})}),
    PluginSpec("kv-fits"),
]
_SCORERS = ["least-loaded", "kv-headroom", "pending-prefill-tokens"]


def _plugin_rank(profile: Profile, req: RequestView, eps: list[EndpointView]) -> list[EndpointId]:
    """`rank` through the plugin objects (the reference)."""
    eligible = profile.eligible(req, eps)
    return profile.picker.order(profile.totals(req, eligible)) if eligible else []


_endpoint = st.builds(
    EndpointView,
    id=st.sampled_from([EndpointId(f"w{i}") for i in range(12)]),
    role=st.sampled_from(list(Role)),
    ready=st.booleans(),
    fenced=st.sampled_from([False, False, True]),
    draining=st.sampled_from([False, False, True]),
    num_waiting=st.integers(0, 4),
    num_running=st.integers(0, 4),
    kv_free_blocks=st.integers(-3, 120),
    kv_total_blocks=st.sampled_from([0, 50, 100, 100]),
    kv_block_size=st.sampled_from([1, 16]),
    pending_prefill_tokens=st.integers(0, 3) | st.integers(0, 5000),
    inflight=st.integers(0, 3),
)


@settings(max_examples=400, deadline=None)
@given(
    filters=st.lists(st.sampled_from(range(len(_FILTERS))), max_size=3),
    scorers=st.lists(
        st.tuples(
            st.sampled_from(_SCORERS),
            st.sampled_from([1.0, 0.5, 0.3, 1e-9, 7.25, float("inf")]),
        ),
        min_size=1,
        max_size=3,
    ),
    eps=st.lists(_endpoint, max_size=16),
    prompt=st.integers(0, 3000),
)
def test_fused_rank_matches_plugins(
    filters: list[int],
    scorers: list[tuple[str, float]],
    eps: list[EndpointView],
    prompt: int,
) -> None:
    spec = ProfileSpec(
        name="p",
        filters=tuple(_FILTERS[i] for i in filters),
        scorers=tuple(PluginSpec(kind, weight) for kind, weight in scorers),
    )
    profile = build_profile(spec)
    assert profile._fused is not None
    req = RequestView(RequestId("r"), num_prompt_tokens=prompt, max_tokens=10)
    assert profile.rank(req, eps) == _plugin_rank(profile, req, eps)


@given(eps=st.lists(_endpoint, max_size=16))
def test_default_profiles_take_the_fused_path_and_match(eps: list[EndpointView]) -> None:
    req = RequestView(RequestId("r"), num_prompt_tokens=512, max_tokens=10)
    for spec in (default_decode_profile(), default_prefill_profile()):
        profile = build_profile(spec)
        assert profile._fused is not None
        assert profile.rank(req, eps) == _plugin_rank(profile, req, eps)


class _MyLeastLoaded(LeastLoaded):
    __slots__ = ()


def test_subclassed_or_unknown_plugins_use_the_plugin_path() -> None:
    profile = build_profile(default_decode_profile())
    custom = replace(profile, scorers=(replace(profile.scorers[0], scorer=_MyLeastLoaded()),))
    assert custom._fused is None
    tetri = build_profile(
        ProfileSpec("t", (PluginSpec("accepts-work"),), (PluginSpec("tetriinfer-p2c"),))
    )
    assert tetri._fused is None
