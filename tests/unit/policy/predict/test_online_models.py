"""The router's online models: per-class length predictor, prefill rate, decode step fit."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from splitserve.core.ids import RequestId
from splitserve.policy.predict import LengthQuery
from splitserve.policy.predict.latency import PrefillRate, StepFit
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
