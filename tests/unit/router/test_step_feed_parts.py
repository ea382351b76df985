"""The step feed's per-sample path (issue 17): `OnlineStepModel.observe_parts`, fed from the
protobuf samples without building a `BatchShape`, and the ring of regressor rows a refit reads,
give the same rows, the same fit and the same estimates as `core.perf.fit.features` over the
window's shapes."""

from __future__ import annotations

import random

import numpy as np
import pytest

from splitserve._gen.v1 import worker_pb2
from splitserve.core.ids import EndpointId
from splitserve.core.perf import BatchShape
from splitserve.core.perf.fit import features
from splitserve.policy.predict.step_model import OnlineStepModel
from splitserve.router.latency import LatencyBook


def _shapes(seed: int, n: int) -> list[tuple[BatchShape, float]]:
    rng = random.Random(seed)
    out: list[tuple[BatchShape, float]] = []
    for _ in range(n):
        kind = rng.random()
        chunks = (
            tuple((rng.randint(1, 600), rng.randint(0, 900)) for _ in range(rng.randint(1, 3)))
            if kind < 0.4
            else ()
        )
        decodes = (
            tuple(rng.randint(1, 3000) for _ in range(rng.randint(1, 40))) if kind > 0.3 else ()
        )
        batch = BatchShape(chunks, decodes)
        seconds = 0.001 + sum(
            c * f
            for c, f in zip((1e-3, 2e-5, 1e-9, 5e-4, 1e-7, 3e-5), features(batch), strict=True)
        )
        seconds *= rng.uniform(0.97, 1.03)
        if rng.random() < 0.03:
            seconds = rng.choice((0.0, -1.0, float("nan"), float("inf")))  # not usable
        out.append((batch, seconds))
    return out


def _pb(batch: BatchShape, seconds: float) -> worker_pb2.StepSample:
    return worker_pb2.StepSample(
        duration_s=seconds,
        prefill_chunks=[
            worker_pb2.PrefillChunk(new_tokens=n, context_tokens=c) for n, c in batch.prefill_chunks
        ],
        decode_context_tokens=list(batch.decode_contexts),
    )


@pytest.mark.parametrize(("seed", "window", "refit_every"), [(1, 512, 32), (2, 64, 8), (3, 16, 40)])
def test_the_window_rows_are_the_shapes_features(seed: int, window: int, refit_every: int) -> None:
    model = OnlineStepModel(window=window, refit_every=refit_every, min_samples=8)
    usable: list[tuple[float, ...]] = []
    for i, (batch, seconds) in enumerate(_shapes(seed, 1500)):
        model.observe_parts(batch.prefill_chunks, batch.decode_contexts, seconds)
        if not batch.is_empty and seconds > 0 and np.isfinite(seconds):
            usable.append(features(batch))
        if i % 97 == 0 or i > 1490:
            n = len(model._y)
            want = np.array(usable[-n:], dtype=float)
            assert np.array_equal(model._window_rows(n), want)


def test_the_protobuf_path_fits_as_the_shapes_do() -> None:
    """Every step through `LatencyBook._observe_steps` (protobuf samples, `observe_parts`) and the
    same steps through `observe(BatchShape)` on a second model: the same fits and estimates,
    exactly, after every message."""
    book = LatencyBook()
    eid = EndpointId("w:1")
    models = book._get(eid)
    reference = OnlineStepModel()
    steps = _shapes(4, 2000)
    for start in range(0, len(steps), 16):
        part = steps[start : start + 16]
        book._observe_steps(eid, models, [_pb(b, s) for b, s in part])
        for b, s in part:
            reference.observe(b, s)
        got, want = models.steps, reference
        assert (got.fitted is None) == (want.fitted is None)
        if got.fitted is not None and want.fitted is not None:
            assert got.fitted.coeffs == want.fitted.coeffs
            assert got.fitted.mape == want.fitted.mape
        assert got.prefill_tokens_per_s() == want.prefill_tokens_per_s()
        assert got.decode_step() == want.decode_step()
    assert models.steps.fitted is not None


def test_observe_parts_builds_the_regressors_of_features() -> None:
    """The inline regressors equal `features` value for value (types included: the attention
    work of a decode-only step is the int 0, as `sum` of nothing gives)."""
    for batch, _ in _shapes(5, 300):
        if batch.is_empty:
            continue
        model = OnlineStepModel()
        model.observe_parts(batch.prefill_chunks, batch.decode_contexts, 0.01)
        (row,) = model._pending
        assert row == features(batch)
        assert [type(v) for v in row] == [type(v) for v in features(batch)]
