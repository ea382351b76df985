"""TetriInfer's decode selection: power-of-two over α, balancing heavy:light decodes.

Invariants (research/seed-splitwise-tetriinfer.md B8.7 and the module docstring):
1. scores lie in [0, 1] (hypothesis);
2. with α non-empty the first-ranked endpoint is in α, and it is one of the two sampled
   candidates; an endpoint without free KV is never chosen while α is non-empty;
3. of candidates with heavy:light 3:1 and 1:3, a request goes to the 1:3 one: heavy decodes spread
   out, and a light decode avoids the instance where heavy ones would slow it (paper Fig. 5);
4. picks are deterministic for a seed and request, and the seed matters;
5. with α empty the β endpoint with the most free KV ranks first;
6. it is registered as "tetriinfer-p2c" and builds in a profile.
"""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from hypothesis import given
from hypothesis import strategies as st

from splitserve.core.ids import EndpointId, RequestId
from splitserve.core.roles import Role
from splitserve.policy.placement import SCORERS, PluginSpec, ProfileSpec, build_profile
from splitserve.policy.placement.base import EndpointView, RequestView
from splitserve.policy.placement.tetriinfer import HeavyLightMix, TetriPowerOfTwo


def ep(name: str, free: int = 1000, total: int = 1000) -> EndpointView:
    return EndpointView(EndpointId(name), Role.DECODE, kv_free_blocks=free, kv_total_blocks=total)


def req(rid: str = "r", prompt: int = 100, out: int = 50) -> RequestView:
    return RequestView(RequestId(rid), prompt, out)


def mixes(table: Mapping[str, tuple[int, int]]) -> TetriPowerOfTwo:
    return TetriPowerOfTwo(
        length_granularity_tokens=1,
        mix_of=lambda eid: HeavyLightMix(*table.get(str(eid), (0, 0))),
    )


def best(scores: Mapping[EndpointId, float]) -> str:
    return str(max(sorted(scores), key=lambda e: scores[e]))


@pytest.mark.parametrize(
    ("out_tokens", "expected"),
    [(500, "b"), (20, "b")],
    ids=["heavy", "light"],
)
def test_balances_heavy_and_light(out_tokens: int, expected: str) -> None:
    scorer = mixes({"a": (3, 1), "b": (1, 3)})
    assert best(scorer.score(req(out=out_tokens), [ep("a"), ep("b")])) == expected


def test_full_endpoint_never_chosen_while_alpha_nonempty() -> None:
    eps = [ep("full", free=0), ep("d1"), ep("d2"), ep("d3")]
    scorer = TetriPowerOfTwo()
    picks = {best(scorer.score(req(f"r{i}"), eps)) for i in range(200)}
    assert "full" not in picks
    assert picks == {"d1", "d2", "d3"}  # the random pair varies across requests


def test_pick_is_one_of_the_two_candidates_and_deterministic() -> None:
    eps = [ep(f"d{i}") for i in range(6)]
    scorer = TetriPowerOfTwo(seed=7)
    for i in range(50):
        r = req(f"r{i}")
        chosen = best(scorer.score(r, eps))
        assert chosen in {str(e.id) for e in scorer.candidates(r, scorer.alpha(r, eps))}
        assert chosen == best(TetriPowerOfTwo(seed=7).score(r, list(reversed(eps))))
    seeds = [
        [best(TetriPowerOfTwo(seed=s).score(req(f"r{i}"), eps)) for i in range(20)] for s in (1, 2)
    ]
    assert seeds[0] != seeds[1]


def test_empty_alpha_falls_back_to_most_free_kv() -> None:
    eps = [ep("a", free=3), ep("b", free=5), ep("c", free=1)]
    assert best(TetriPowerOfTwo().score(req(prompt=1000, out=1000), eps)) == "b"


def test_alpha_uses_the_predicted_lower_bucket() -> None:
    # 100 prompt + 399 predicted -> lower end of the 200-bucket is 200: 300 tokens = 19 blocks.
    scorer = TetriPowerOfTwo(length_granularity_tokens=200)
    eps = [ep("fits", free=19), ep("short", free=18)]
    assert [str(e.id) for e in scorer.alpha(req(out=399), eps)] == ["fits"]
    assert scorer.is_heavy(req(out=399))
    assert not scorer.is_heavy(req(out=199))


def test_mix_validates() -> None:
    with pytest.raises(ValueError, match="num_heavy and num_light"):
        HeavyLightMix(-1, 0)
    with pytest.raises(ValueError, match="heavy_threshold_tokens"):
        TetriPowerOfTwo(heavy_threshold_tokens=0)


def test_registered_and_builds_in_a_profile() -> None:
    assert SCORERS.get("tetriinfer-p2c") is TetriPowerOfTwo
    profile = build_profile(
        ProfileSpec("d", (), (PluginSpec("tetriinfer-p2c", params={"seed": 3}),))
    )
    assert profile.rank(req(), [ep("x", free=0), ep("y")])[0] == EndpointId("y")


@given(
    st.lists(
        st.tuples(st.integers(0, 500), st.integers(0, 500), st.integers(0, 9), st.integers(0, 9)),
        min_size=1,
        max_size=8,
    ),
    st.integers(1, 4000),
    st.integers(1, 4000),
    st.integers(0, 3),
)
def test_scores_in_unit_interval_and_alpha_first(
    raw: list[tuple[int, int, int, int]], prompt: int, out: int, seed: int
) -> None:
    eps = [ep(f"d{i}", free=min(f, t), total=t) for i, (f, t, _, _) in enumerate(raw)]
    table = {f"d{i}": (h, light) for i, (_, _, h, light) in enumerate(raw)}
    scorer = TetriPowerOfTwo(
        seed=seed, mix_of=lambda eid: HeavyLightMix(*table.get(str(eid), (0, 0)))
    )
    r = req("q", prompt, out)
    scores = scorer.score(r, eps)
    assert set(scores) == {e.id for e in eps}
    assert all(0.0 <= s <= 1.0 for s in scores.values())
    alpha = scorer.alpha(r, eps)
    if alpha:
        picked = {e.id for e in scorer.candidates(r, alpha)}
        top = max(scores.values())
        assert {e for e, s in scores.items() if s == top} <= picked
