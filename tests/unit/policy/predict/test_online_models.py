"""The router's online models: per-class length predictor, prefill rate, decode step fit, KV
pull rate."""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from splitserve.core.ids import RequestId
from splitserve.policy.predict import LengthQuery
from splitserve.policy.predict.latency import PrefillRate, PullRate, SmoothedRate, StepFit
from splitserve.policy.predict.per_class import PerClassPredictor


def _q(prompt: int, max_tokens: int = 1000) -> LengthQuery:
    return LengthQuery(RequestId("r"), prompt, 0, max_tokens)


def test_per_class_tables_do_not_mix() -> None:
    p = PerClassPredictor(["chat", "batch"])
    for _ in range(20):
        p.observe("chat", 100, 20)
        p.observe("batch", 100, 600)
    assert p.predict("chat", _q(100)) < 64
    assert p.predict("batch", _q(100)) > 512
    assert p.predict("unknown", _q(100)) == 1000  # `other` has seen nothing: the cap


@given(st.text(max_size=5), st.integers(0, 5000), st.integers(1, 4000))
def test_predictions_within_cap(cls: str, prompt: int, cap: int) -> None:
    p = PerClassPredictor(["a"])
    p.observe("a", 10, 3000)
    assert 1 <= p.predict(cls, _q(prompt, cap)) <= cap


def test_prefill_rate_needs_samples_then_tracks() -> None:
    r = PrefillRate(min_samples=3)
    r.observe(1000, 0.1)
    r.observe(1000, 0.1)
    assert r.tokens_per_s == 0.0
    r.observe(1000, 0.1)
    assert r.tokens_per_s == 10_000.0
    r.observe(0, 1.0)  # ignored
    r.observe(10, 0.0)  # ignored
    assert r.tokens_per_s == 10_000.0


def test_smoothed_rate_is_the_first_sample_then_an_ewma() -> None:
    r = SmoothedRate(alpha=0.25, min_samples=2)
    r.add(100.0)
    assert r.tokens_per_s == 0.0  # one sample: no estimate yet
    r.add(200.0)
    assert r.tokens_per_s == pytest.approx(0.75 * 100 + 0.25 * 200)
    r.add(50.0)
    assert r.tokens_per_s == pytest.approx(0.75 * (0.75 * 100 + 0.25 * 200) + 0.25 * 50)


@given(
    st.lists(
        st.tuples(st.integers(1, 10_000), st.floats(1e-6, 10, allow_nan=False)),
        max_size=20,
    )
)
def test_prefill_and_pull_rates_keep_the_same_mean(samples: list[tuple[int, float]]) -> None:
    """Both rates are a `SmoothedRate` fed their own samples (one shared update): fed the same
    (tokens, seconds) samples, each equals the base fed tokens / seconds."""
    for cls, alpha, k in ((PrefillRate, 0.2, 3), (PullRate, 0.3, 2)):
        rate = cls()
        assert isinstance(rate, SmoothedRate)
        assert (rate.alpha, rate.min_samples) == (alpha, k)  # the defaults as before
        base = SmoothedRate(alpha=alpha, min_samples=k)
        tokens, seconds = 0, 0.0
        if isinstance(rate, PullRate):
            rate.observe_totals(tokens, seconds)
        for t, s in samples:
            if isinstance(rate, PullRate):
                tokens, seconds = tokens + t, seconds + s
                rate.observe_totals(tokens, seconds)
            else:
                rate.observe(t, s)
            base.add(t / s)
        assert rate.tokens_per_s == pytest.approx(base.tokens_per_s)


def test_step_fit_recovers_a_line() -> None:
    f = StepFit(lam=1.0)
    for b in (1, 2, 4, 8, 16, 32) * 5:
        f.observe(b, 0.01 + 0.002 * b)
    base, per = f.params
    assert abs(base - 0.01) < 1e-3
    assert abs(per - 0.002) < 1e-4


@given(st.lists(st.tuples(st.integers(1, 256), st.floats(1e-4, 10)), max_size=30))
def test_step_fit_params_never_negative(points: list[tuple[int, float]]) -> None:
    f = StepFit()
    for b, t in points:
        f.observe(b, t)
    base, per = f.params
    assert base >= 0
    assert per >= 0


def test_pull_rate_from_report_totals() -> None:
    r = PullRate(min_samples=2)
    r.observe_totals(5000, 1.0)  # the first totals seen: a baseline only
    assert r.tokens_per_s == 0.0
    r.observe_totals(7000, 1.1)  # 2000 tokens in 0.1 s
    assert r.tokens_per_s == 0.0  # one sample: no estimate yet
    r.observe_totals(7000, 1.1)  # no pull since: nothing
    r.observe_totals(8000, 1.2)  # 1000 tokens in 0.1 s
    assert r.tokens_per_s == pytest.approx(0.7 * 20_000 + 0.3 * 10_000)
    before = r.tokens_per_s
    r.observe_totals(100, 0.01)  # the worker restarted: a new baseline, no sample
    assert r.tokens_per_s == before
    r.observe_totals(300, 0.03)  # 200 tokens in 0.02 s, from the new baseline
    assert r.tokens_per_s == pytest.approx(0.7 * before + 0.3 * 10_000)


def test_pull_rate_of_several_pulls_in_one_report_weighs_them_by_tokens() -> None:
    r = PullRate(min_samples=1)
    r.observe_totals(0, 0.0)
    r.observe_totals(1000 + 100, 0.1 + 0.1)  # a 1000-token pull in 0.1 s, a 100-token in 0.1 s
    assert r.tokens_per_s == pytest.approx(1100 / 0.2)


@given(
    st.lists(
        st.tuples(st.integers(0, 10_000), st.floats(0, 10, allow_nan=False)),
        min_size=1,
        max_size=30,
    )
)
@example([(0, 1.0), (1, 5e-324)])
def test_pull_rate_stays_within_its_samples(steps: list[tuple[int, float]]) -> None:
    """Whatever the reports (growing, flat, restarting), the estimate is 0 or lies between the
    slowest and the fastest sample it took."""
    r = PullRate(min_samples=1)
    tokens, seconds = 0, 0.0
    r.observe_totals(tokens, seconds)
    rates: list[float] = []
    for d_tokens, d_seconds in steps:
        before = seconds
        tokens, seconds = tokens + d_tokens, seconds + d_seconds
        r.observe_totals(tokens, seconds)
        # The sample is what the totals show: a step below the total's float resolution
        # (1.0 + 5e-324 == 1.0) adds no time, so it is no sample (it read as an infinite rate).
        if d_tokens > 0 and seconds - before > 0:
            rates.append(d_tokens / (seconds - before))
    if not rates:
        assert r.tokens_per_s == 0.0
    else:
        assert min(rates) * (1 - 1e-9) <= r.tokens_per_s <= max(rates) * (1 + 1e-9)
