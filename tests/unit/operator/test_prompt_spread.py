"""The prompts' spread read from the router's length histogram (`histogram_cv2`): a heavy tail is
not underestimated (the prefill pool's tail sizing depends on it), a light one is not blown up.

The histograms are built as the router exports them (its token buckets, cumulative counts,
`_sum`, `_count`) from lengths drawn with numpy; the exact spread is the sample's own."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from splitserve.operator.control.signals import Samples, histogram_cv2

NAME = "splitserve_router_prompt_length_tokens"
BUCKETS = (1, 4, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
"""The router's (obs.metrics `_TOKEN_BUCKETS`)."""


def _histogram(lengths: np.ndarray, classes: int = 1) -> Samples:
    """The router's exposition of `lengths`, split over `classes` label sets."""
    out: Samples = {}
    for k, part in enumerate(np.array_split(lengths, classes)):
        labels = (("slo_class", f"c{k}"),)
        for le in (*BUCKETS, math.inf):
            key = (NAME + "_bucket", tuple(sorted((*labels, ("le", str(le))))))
            out[key] = float((part <= le).sum())
        out[(NAME + "_sum", labels)] = float(part.sum())
        out[(NAME + "_count", labels)] = float(part.size)
    return out


def _exact(x: np.ndarray) -> float:
    return float(x.var() / x.mean() ** 2)


def _midpoint_cv2(samples: Samples) -> float:
    """The reading this replaces: every observation at its bucket's midpoint, the +Inf bucket
    at its lower bound (kept here to show what it missed)."""
    counts: dict[float, float] = {}
    for (n, labels), v in samples.items():
        if n == NAME + "_bucket":
            le = float(dict(labels)["le"])
            counts[le] = counts.get(le, 0.0) + v
    first = second = lo = below = 0.0
    for le, cum in sorted(counts.items()):
        mid = lo if math.isinf(le) else (lo + le) / 2
        first += (cum - below) * mid
        second += (cum - below) * mid * mid
        lo, below = (lo if math.isinf(le) else le), cum
    total = below
    return second / total / (first / total) ** 2 - 1


def _lengths(seed: int, mu: float, sigma: float, tail: float, mu2: float, n: int = 2000) -> Any:
    """Lognormal lengths, a share `tail` of them from a second lognormal (a mix of short and
    long prompts), within the router's buckets (1-32,000 tokens)."""
    rng = np.random.default_rng(seed)
    body = rng.lognormal(mu, sigma, n)
    long = rng.lognormal(mu2, 0.5, n)
    return np.clip(np.where(rng.random(n) < tail, long, body), 1, 32_000)


@settings(max_examples=150, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    mu=st.floats(3, 9),
    sigma=st.floats(0.05, 2.5),
    tail=st.sampled_from([0.0, 0.01, 0.05, 0.2]),
    mu2=st.floats(7, 10),
)
@example(seed=21360, mu=3.0, sigma=1.625, tail=0.0, mu2=7.0)  # 0.69x: the corner (below)
@example(seed=1070, mu=7.0, sigma=0.0625, tail=0.01, mu2=10.0)  # 0.59x: the second corner
def test_spread_is_not_underestimated_within_the_buckets(
    seed: int, mu: float, sigma: float, tail: float, mu2: float
) -> None:
    x = _lengths(seed, mu, sigma, tail, mu2)
    est = histogram_cv2(_histogram(x, classes=2), NAME)
    assert est is not None
    exact = _exact(x)
    # 0.5: two corners read low (`histogram_cv2`'s docstring): a ~20-token body with a very
    # wide spread, down to 0.67x (seed 21360, mu 3.0, sigma 1.625: 43.3 for 62.7), and a narrow
    # body just above a bucket's lower bound with 1 % far outliers, down to 0.55x in a grid of
    # that corner (seed 1070, mu 7.0, sigma 0.0625, tail 0.01, mu2 10: 1.14 for 1.93; found by
    # hypothesis in a helper's run, 2026-11-28).
    assert est >= 0.5 * exact - 0.01, (est, exact)
    # Conservative, not absurd (the most seen: 2.1x, a narrow body with 1 % far outliers).
    assert est <= 2.5 * exact + 0.4, (est, exact)


@pytest.mark.parametrize(
    ("mu", "sigma", "tail", "mu2"),
    [
        (7.0, 1.5, 0.0, 0.0),  # heavy lognormal: exact 3.17, midpoints 2.77, now 3.19
        (6.0, 2.0, 0.0, 0.0),  # exact 5.79, midpoints 4.90, now 5.56
        (5.5, 0.4, 0.03, 9.5),  # 3 % of ~13k-token prompts among ~250-token ones: 15.4, 14.8, 16.5
    ],
)
def test_heavy_tailed_mixes_read_at_least_their_spread_where_midpoints_read_low(
    mu: float, sigma: float, tail: float, mu2: float
) -> None:
    x = _lengths(0, mu, sigma, tail, mu2, n=4000)
    samples = _histogram(x)
    exact = _exact(x)
    assert _midpoint_cv2(samples) < exact  # what the old reading gave: low
    est = histogram_cv2(samples, NAME)
    assert est is not None
    assert est >= 0.95 * exact


def test_the_tail_beyond_the_last_bucket_is_read_from_the_exact_sum() -> None:
    """Prompts past 32,768 tokens (a 128k-context model): the +Inf bucket's mean comes from the
    histogram's `_sum`, not its lower bound."""
    rng = np.random.default_rng(0)
    x = np.clip(rng.lognormal(7.0, 1.5, 4000), 1, 131_072)
    samples = _histogram(x)
    exact = _exact(x)
    est = histogram_cv2(samples, NAME)
    assert est is not None
    old = _midpoint_cv2(samples)
    assert old < 0.65 * exact
    assert est > old
    assert est >= 0.7 * exact
    # Without the `_sum` the +Inf bucket falls back to its lower bound (never a zero or a crash).
    no_sum = {k: v for k, v in samples.items() if k[0] != NAME + "_sum"}
    fallback = histogram_cv2(no_sum, NAME)
    assert fallback is not None
    assert 0 < fallback < est


def test_light_spreads_stay_light_and_empty_is_unknown() -> None:
    const = histogram_cv2(_histogram(np.full(1000, 1000.0)), NAME)
    assert const is not None
    assert const < 0.15
    uniform = np.random.default_rng(0).uniform(500, 1500, 2000)
    est = histogram_cv2(_histogram(uniform), NAME)
    assert est is not None
    assert _exact(uniform) <= est < 0.3
    assert histogram_cv2({}, NAME) is None
    assert histogram_cv2(_histogram(np.array([], dtype=float)), NAME) is None
