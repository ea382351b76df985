"""`TailRatios`: a point prediction turned into one at a class's percentile."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from splitserve.policy.predict.tail import TailRatios


def test_one_until_enough_samples_then_the_empirical_quantile() -> None:
    t = TailRatios(min_samples=20)
    for i in range(19):
        t.observe(1.0, 0.5 + i * 0.1)
    assert t.factor(0.5) == 1.0
    assert t.factor(0.99) == 1.0
    t.observe(1.0, 2.4)  # ratios 0.5, 0.6, ..., 2.4
    assert t.factor(0.5) == 1.4
    assert t.factor(0.9) == 2.2
    assert t.factor(0.99) == 2.4


def test_window_forgets_old_ratios() -> None:
    t = TailRatios(window=50, min_samples=10)
    for _ in range(50):
        t.observe(1.0, 5.0)
    for _ in range(50):
        t.observe(1.0, 1.0)
    assert t.factor(0.99) == 1.0


@given(
    st.lists(st.tuples(st.floats(1e-3, 10), st.floats(0, 100)), min_size=20, max_size=200),
    st.floats(0.01, 1.0),
    st.floats(0.01, 1.0),
)
def test_monotone_in_percentile_and_bounded(
    pairs: list[tuple[float, float]], q1: float, q2: float
) -> None:
    t = TailRatios()
    for p, a in pairs:
        t.observe(p, a)
    lo, hi = sorted((q1, q2))
    assert t.min_factor <= t.factor(lo) <= t.factor(hi) <= t.max_factor
