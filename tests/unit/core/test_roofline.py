"""The roofline model: positive, monotone in work, and in the right ballpark for known shapes."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from splitserve.core.perf import HARDWARE, MODELS, BatchShape, LatencyModel, RooflineModel

MODEL = RooflineModel(MODELS["llama-2-7b"], HARDWARE["a100-80g"])
_conforms: LatencyModel = MODEL


def test_decode_step_is_weight_read_bound() -> None:
    # 13.5 GB of weights at 0.8 x 2 TB/s is ~8 ms, plus overhead: a 7B decode step is ~10 ms.
    t = MODEL.step_s(BatchShape(decode_contexts=(512,)))
    assert 0.006 < t < 0.015


def test_prefill_512_tokens_is_compute_bound() -> None:
    # 2 x 512 x 6.7 G FLOPs at 0.55 x 312 TFLOP/s is ~40 ms.
    t = MODEL.step_s(BatchShape(prefill_chunks=((512, 0),)))
    assert 0.025 < t < 0.06


def test_empty_batch_costs_nothing() -> None:
    assert MODEL.step_s(BatchShape()) == 0.0


def test_time_scale_scales() -> None:
    fast = RooflineModel(MODELS["llama-2-7b"], HARDWARE["a100-80g"], time_scale=0.5)
    batch = BatchShape(prefill_chunks=((128, 0),))
    assert fast.step_s(batch) == MODEL.step_s(batch) * 0.5


def test_kv_transfer_grows_with_bytes() -> None:
    assert MODEL.kv_transfer_s(0) == 0.0
    assert MODEL.kv_transfer_s(10**6) < MODEL.kv_transfer_s(10**9)


chunks = st.lists(st.tuples(st.integers(1, 2048), st.integers(0, 4096)), max_size=4)
contexts = st.lists(st.integers(1, 8192), max_size=64)


@given(chunks, contexts, st.integers(1, 512), st.integers(1, 4096))
def test_monotone_in_work(
    pre: list[tuple[int, int]], dec: list[int], extra_tokens: int, extra_ctx: int
) -> None:
    base = BatchShape(tuple(pre), tuple(dec))
    more_prefill = BatchShape((*pre, (extra_tokens, 0)), tuple(dec))
    more_decode = BatchShape(tuple(pre), (*dec, extra_ctx))
    t = MODEL.step_s(base)
    assert t >= 0
    assert MODEL.step_s(more_prefill) >= t
    assert MODEL.step_s(more_decode) >= t
