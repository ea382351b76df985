"""`RescaledModel`: a measured model carried to another GPU by the roofline's per-shape ratio."""

from __future__ import annotations

import pytest

from splitserve.core.perf import (
    HARDWARE,
    MODELS,
    BatchShape,
    DistServeModel,
    RescaledModel,
    RooflineModel,
    kv_link,
)

SHAPES = (
    BatchShape(((512, 0),)),
    BatchShape(((64, 300),), (400,) * 8),
    BatchShape((), (600,) * 16),
    BatchShape((), (1500,) * 96),
)


def _fit(tp: int = 1) -> DistServeModel:
    return DistServeModel("vllm", "opt-13b", tp, kv_link("nvlink-a100"))


def _roof(hw: str, tp: int = 1) -> RooflineModel:
    return RooflineModel(MODELS["opt-13b"], HARDWARE[hw], tp=tp)


def test_same_gpu_leaves_the_measurement_unchanged() -> None:
    a100 = _roof("a100-80g")
    model = RescaledModel(_fit(), a100, a100)
    for shape in SHAPES:
        assert model.step_s(shape) == pytest.approx(_fit().step_s(shape))


def test_each_step_scales_by_the_roofline_ratio_of_that_shape() -> None:
    src, dst = _roof("a100-80g", 2), _roof("v100-32g", 2)
    model = RescaledModel(_fit(2), src, dst)
    for shape in SHAPES:
        ratio = dst.step_s(shape) / src.step_s(shape)
        assert model.step_s(shape) == pytest.approx(_fit(2).step_s(shape) * ratio)
    # A memory-bound decode slows by about the bandwidth ratio (2.04 / 0.9 TB/s), a
    # compute-bound prefill by about the FLOP/s ratio (312 / 125 TFLOP/s): not one factor.
    decode, prefill = SHAPES[2], BatchShape(((2048, 0),))
    d = model.step_s(decode) / _fit(2).step_s(decode)
    p = model.step_s(prefill) / _fit(2).step_s(prefill)
    assert 1.6 < d < 2.3
    assert 2.0 < p < 2.6


def test_empty_step_and_kv_transfer_keep_the_base_model() -> None:
    model = RescaledModel(_fit(), _roof("a100-80g"), _roof("a100-40g"))
    assert model.step_s(BatchShape()) == 0.0
    assert model.kv_transfer_s(1 << 20) == _fit().kv_transfer_s(1 << 20)


def test_rooflines_of_different_models_or_tp_are_refused() -> None:
    with pytest.raises(ValueError, match="same model"):
        RescaledModel(_fit(), _roof("a100-80g", 1), _roof("v100-32g", 2))


def test_fixed_part_is_held_and_the_rest_scales() -> None:
    src, dst = _roof("a100-80g", 2), _roof("v100-32g", 2)
    fixed = 0.01
    model = RescaledModel(_fit(2), src, dst, fixed)
    for shape in SHAPES:
        base = _fit(2).step_s(shape)
        ratio = dst.step_s(shape) / src.step_s(shape)
        assert model.step_s(shape) == pytest.approx(fixed + (base - fixed) * ratio)
        # Slower GPU: dearer than the measurement, cheaper than scaling all of it.
        assert base < model.step_s(shape) < RescaledModel(_fit(2), src, dst).step_s(shape)
    assert model.step_s(BatchShape()) == 0.0
    with pytest.raises(ValueError, match="fixed_s"):
        RescaledModel(_fit(2), src, dst, -0.001)


def test_fixed_overhead_is_the_smallest_steps_residual_over_the_roofline() -> None:
    """vLLM's residual over the A100 roofline grows with TP (per-step CPU and RPC work), while
    DistServe's own engine leaves little; never negative."""
    src = {tp: _roof("a100-80g", tp) for tp in (1, 2, 4)}
    vllm = {tp: RescaledModel.fixed_overhead(_fit(tp), src[tp]) for tp in (1, 2, 4)}
    assert 0.0 < vllm[1] < vllm[2] < vllm[4]
    assert vllm[2] == pytest.approx(0.0146, abs=0.001)
    smallest = BatchShape((), (1,))
    assert vllm[2] == pytest.approx(_fit(2).step_s(smallest) - src[2].step_s(smallest))
    own = DistServeModel("distserve", "opt-13b", 2, kv_link("nvlink-a100"))
    assert 0.0 <= RescaledModel.fixed_overhead(own, src[2]) < vllm[2]
    # A model faster than the roofline at its smallest step holds nothing fixed.
    assert RescaledModel.fixed_overhead(_roof("h100-80g", 2), src[2]) == 0.0
