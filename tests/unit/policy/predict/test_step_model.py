"""`OnlineStepModel`: the step-latency model fitted from step reports tracks a known engine."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from splitserve.core.perf import HARDWARE, MODELS, BatchShape, RooflineModel
from splitserve.core.perf.protocol import LatencyModel
from splitserve.policy.predict.step_model import OnlineStepModel

ROOFLINE = RooflineModel(MODELS["llama-2-7b"], HARDWARE["a100-80g"], time_scale=0.05)


def _decode(rng: random.Random) -> BatchShape:
    return BatchShape(
        decode_contexts=tuple(rng.randint(50, 1500) for _ in range(rng.randint(1, 32)))
    )


def _prefill(rng: random.Random) -> BatchShape:
    return BatchShape(
        prefill_chunks=tuple((rng.randint(20, 1000), 0) for _ in range(rng.randint(1, 3)))
    )


def _mixed(rng: random.Random) -> BatchShape:
    return BatchShape(_prefill(rng).prefill_chunks, _decode(rng).decode_contexts)


def _feed(model: OnlineStepModel, engine: LatencyModel, shapes: list[BatchShape]) -> None:
    for b in shapes:
        model.observe(b, engine.step_s(b))


def _mape(model: OnlineStepModel, engine: LatencyModel, shapes: list[BatchShape]) -> float:
    fitted = model.fitted
    assert fitted is not None
    return sum(abs(fitted.step_s(b) - engine.step_s(b)) / engine.step_s(b) for b in shapes) / len(
        shapes
    )


def test_not_ready_until_enough_steps() -> None:
    m = OnlineStepModel(min_samples=24)
    rng = random.Random(0)
    _feed(m, ROOFLINE, [_decode(rng) for _ in range(23)])
    assert m.fitted is None
    assert m.decode_step() == (0.0, 0.0)
    _feed(m, ROOFLINE, [_decode(rng)])
    assert m.fitted is not None


def test_tracks_the_simulated_engines_step_costs_on_held_out_batches() -> None:
    """Per role, as a P/D worker runs them: prefill steps on a prefill worker, decode steps on
    a decode worker; a mixed worker runs all kinds."""
    rng = random.Random(1)
    for kind in (_decode, _prefill):
        m = OnlineStepModel()
        _feed(m, ROOFLINE, [kind(rng) for _ in range(200)])
        assert _mape(m, ROOFLINE, [kind(rng) for _ in range(100)]) < 0.05
    m = OnlineStepModel()
    kinds = (_decode, _prefill, _mixed)
    _feed(m, ROOFLINE, [kinds[i % 3](rng) for i in range(300)])
    # A mixed step on the roofline costs max(compute, memory), not the A.4 forms' sum: on a
    # mixed worker the fit is an approximation (within 15 % here).
    assert _mape(m, ROOFLINE, [kinds[i % 3](rng) for i in range(150)]) < 0.15


def test_decode_only_worker_fits_its_half() -> None:
    """A disaggregated decode worker never runs a prefill chunk: its decode half is fitted."""
    rng = random.Random(2)
    m = OnlineStepModel()
    _feed(m, ROOFLINE, [_decode(rng) for _ in range(200)])
    assert _mape(m, ROOFLINE, [_decode(rng) for _ in range(100)]) < 0.05
    base, per = m.decode_step()
    assert base > 0
    assert per > 0
    assert m.prefill_tokens_per_s() == 0.0  # no prefill steps seen: no estimate
    ctx = 800
    one = ROOFLINE.step_s(BatchShape(decode_contexts=(ctx,) * 8))
    assert abs(base + 8 * per - one) / one < 0.25  # at the mean context, roughly


def test_prefill_rate_matches_the_engine() -> None:
    rng = random.Random(3)
    m = OnlineStepModel()
    shapes = [BatchShape(prefill_chunks=((rng.randint(200, 600), 0),)) for _ in range(100)]
    _feed(m, ROOFLINE, shapes)
    rate = m.prefill_tokens_per_s()
    truth = 400 / ROOFLINE.step_s(BatchShape(prefill_chunks=((400, 0),)))
    assert abs(rate - truth) / truth < 0.1


def test_follows_a_slowdown() -> None:
    """The window slides: after the engine gets 2x slower the fit follows."""
    rng = random.Random(4)
    m = OnlineStepModel(window=128, refit_every=16)
    _feed(m, ROOFLINE, [_decode(rng) for _ in range(200)])
    before, _ = m.decode_step()
    slow = RooflineModel(MODELS["llama-2-7b"], HARDWARE["a100-80g"], time_scale=0.1)
    _feed(m, slow, [_decode(rng) for _ in range(200)])
    assert _mape(m, slow, [_decode(rng) for _ in range(50)]) < 0.05
    after, _ = m.decode_step()
    assert after > 1.5 * before


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(1, 64), st.integers(1, 4000), st.floats(1e-4, 1.0)),
        min_size=30,
        max_size=60,
    )
)
def test_never_negative(steps: list[tuple[int, int, float]]) -> None:
    """Arbitrary (even nonsensical) timings never give a negative price or estimate."""
    m = OnlineStepModel(min_samples=10, max_mape=float("inf"))
    for b, ctx, s in steps:
        m.observe(BatchShape(decode_contexts=(ctx,) * b), s)
    assert m.fitted is not None
    base, per = m.decode_step()
    assert base >= 0
    assert per >= 0
    assert m.fitted.step_s(BatchShape(decode_contexts=(100,) * 3)) >= 0
