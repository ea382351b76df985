"""The vendored GPU models reproduce the published figures they come from.

Expected numbers are typed in from the published files (DistServe's
`profiler-a100-80g.{distserve,vllm}.json`; Vidur's `mlp.csv`, `send_recv.csv`, `all_reduce.csv`),
so a wrong reduction or a mis-keyed table fails here.
"""

from __future__ import annotations

import itertools
import math

import pytest

from splitserve.core.perf import (
    KV_LINKS,
    LATENCY_MODELS,
    BatchShape,
    DistServeModel,
    LinearLink,
    MeasuredLink,
    VidurModel,
    build_latency_model,
)
from splitserve.core.perf.distserve import distserve_fit, max_num_tokens
from splitserve.core.perf.kvlink import kv_link
from splitserve.core.perf.published import _nixl_loopback, _vidur

NVLINK = LinearLink(0.0, 1e12)


def test_distserve_opt13b_tp1_coefficients_are_the_published_ones() -> None:
    fit = distserve_fit("distserve", "opt-13b", 1)
    assert fit.threshold == 95
    assert fit.prefill == (18.10254647486372, 0.1019122572698738, 7.122264314252114e-06)
    assert fit.decode_small == (19.934702624895458, 0.0006269356524350583, 0.03850697740828398)
    assert fit.decode_large == (7.1661889468253595, 0.0005798000403396046, 0.15831096191764046)
    vllm = distserve_fit("vllm", "opt-13b", 1)
    assert vllm.prefill == (22.052204789310185, 0.14050923870128956, 8.076584822611088e-06)


def test_distserve_model_prices_a_prefill_batch_by_the_published_formula() -> None:
    m = DistServeModel("distserve", "opt-13b", 1, NVLINK)
    a, b, c = 18.10254647486372, 0.1019122572698738, 7.122264314252114e-06
    lens = (512, 300)
    want_ms = a + b * sum(lens) + c * sum(x * x for x in lens)
    got = m.step_s(BatchShape(prefill_chunks=tuple((n, 0) for n in lens)))
    assert got == pytest.approx(want_ms / 1000.0, rel=1e-12)


def test_distserve_model_prices_a_decode_step_by_the_published_formula() -> None:
    m = DistServeModel("distserve", "opt-13b", 1, NVLINK)
    contexts = (100, 200, 300)  # lengths including the token being decoded: 101, 201, 301
    a, b, c = 19.934702624895458, 0.0006269356524350583, 0.03850697740828398
    want_ms = a + b * (sum(contexts) + 3) + c * 3
    assert m.step_s(BatchShape(decode_contexts=contexts)) == pytest.approx(want_ms / 1000.0)
    # From the threshold on the large-batch triple applies (here above the small-batch one).
    big = (499,) * 200
    a2, b2, c2 = 7.1661889468253595, 0.0005798000403396046, 0.15831096191764046
    want_big = a2 + b2 * (sum(big) + 200) + c2 * 200
    assert m.step_s(BatchShape(decode_contexts=big)) == pytest.approx(want_big / 1000.0)


def test_distserve_decode_never_gets_cheaper_with_a_bigger_batch() -> None:
    for engine in ("distserve", "vllm"):
        m = DistServeModel(engine, "opt-13b", 1, NVLINK)
        times = [m.step_s(BatchShape(decode_contexts=(500,) * b)) for b in range(1, 300)]
        assert all(y >= x for x, y in itertools.pairwise(times))


def test_distserve_kv_capacity_is_the_published_one() -> None:
    assert max_num_tokens("opt-13b", 1) == 66144
    assert max_num_tokens("opt-66b", 2) == 11600
    assert max_num_tokens("opt-13b", 3) is None


def test_distserve_refuses_a_shape_it_did_not_publish() -> None:
    with pytest.raises(ValueError, match="no distserve fit for opt-175b"):
        DistServeModel("distserve", "opt-175b", 8, NVLINK)


@pytest.mark.parametrize(
    ("key", "tokens", "ops_ms", "emb_ms"),
    [
        # Vidur a100 Llama-2-7b-hf mlp.csv, TP 1, num_tokens 512: the nine per-layer medians.
        (
            ("a100", "llama-2-7b", 1),
            512,
            (0.012, 0.234, 0.022, 0.088, 0.012, 0.402, 0.0365, 0.229, 0.007),
            0.029,
        ),
        # Vidur h100 Llama-2-70b-hf mlp.csv, TP 4, num_tokens 64.
        (
            ("h100", "llama-2-70b", 4),
            64,
            (0.006, 0.021, 0.003, 0.017, 0.006, 0.087, 0.004, 0.045, 0.002),
            0.006,
        ),
    ],
)
def test_vidur_layer_time_is_the_sum_of_the_published_operator_medians(
    key: tuple[str, str, int], tokens: int, ops_ms: tuple[float, ...], emb_ms: float
) -> None:
    xs, layer, emb = _vidur.COMPUTE[key]
    i = xs.index(tokens)
    assert layer[i] == pytest.approx(sum(ops_ms), rel=1e-5)
    assert emb[i] == pytest.approx(emb_ms, rel=1e-5)
    gpu, model, tp = key
    m = VidurModel(gpu, model, tp, NVLINK)
    # The model holds the running maximum of the measurements (a few ops at small token counts
    # measure slower than at the next count up: timing noise), so it stays monotone.
    assert m.layer_ops_s(tokens) == pytest.approx(max(layer[: i + 1]) / 1000.0, rel=1e-5)
    assert max(layer[: i + 1]) <= sum(ops_ms) * 1.05


def test_vidur_network_tables_are_the_published_medians() -> None:
    # a100_dgx/send_recv.csv, two GPUs of one node: 2 KiB 0.008 ms, 64 MiB 0.294 ms.
    link = kv_link("nvlink-a100")
    assert link.transfer_s(2048) == pytest.approx(0.008e-3)
    assert link.transfer_s(67108864) == pytest.approx(0.294e-3)
    # h100_dgx/all_reduce.csv, 4 GPUs of one node: 2 KiB 0.038 ms, 64 MiB 0.318 ms.
    sizes, ms = _vidur.ALL_REDUCE[("h100", 4)]
    assert ms[sizes.index(2048)] == pytest.approx(0.038)
    assert ms[sizes.index(67108864)] == pytest.approx(0.318)


def test_vidur_step_adds_attention_and_tp_all_reduce() -> None:
    m1 = VidurModel("a100", "llama-2-70b", 4, NVLINK)
    ops = m1.layer_ops_s(512)
    prefill = m1.step_s(BatchShape(prefill_chunks=((512, 0),)))
    # More than the layers' non-attention operators alone: attention and 2 all-reduces a layer.
    assert prefill > m1.shape.num_layers * ops
    assert m1.allreduce_s(512) > 0
    assert VidurModel("a100", "llama-2-7b", 1, NVLINK).allreduce_s(512) == 0.0


def test_vidur_h100_is_faster_than_a100_for_the_same_batch() -> None:
    batch = BatchShape(prefill_chunks=((1024, 0),), decode_contexts=(800,) * 16)
    a100 = VidurModel("a100", "llama-2-7b", 1, NVLINK).step_s(batch)
    h100 = VidurModel("h100", "llama-2-7b", 1, NVLINK).step_s(batch)
    assert 0 < h100 < a100


@pytest.mark.parametrize("name", sorted(LATENCY_MODELS))
def test_every_named_model_is_positive_and_monotone(name: str) -> None:
    spec = LATENCY_MODELS[name]
    model, tp = ("llama-2-7b", 1) if spec.covers is None else spec.covers()[0]
    m = build_latency_model(name, model, spec.hardware or "a100-80g", tp)
    prev = 0.0
    for n in (1, 16, 128, 512, 2048, 4096, 8192):
        t = m.step_s(BatchShape(prefill_chunks=((n, 0),)))
        assert math.isfinite(t)
        assert t >= prev > -1
        prev = t
    prev = 0.0
    for b in (1, 8, 64, 256):
        t = m.step_s(BatchShape(decode_contexts=(700,) * b))
        assert t >= prev
        prev = t
    mixed = BatchShape(prefill_chunks=((256, 0),), decode_contexts=(700,) * 8)
    assert m.step_s(mixed) >= m.step_s(BatchShape(prefill_chunks=((256, 0),)))


def test_catalog_refuses_unknown_names_and_foreign_hardware() -> None:
    with pytest.raises(ValueError, match="unknown latency model 'tpu'"):
        build_latency_model("tpu", "opt-13b", "a100-80g")
    with pytest.raises(ValueError, match="measured on h100-80g"):
        build_latency_model("vidur-h100", "llama-2-7b", "a100-80g")
    with pytest.raises(ValueError, match="unknown KV link"):
        build_latency_model("roofline", "opt-13b", "a100-80g", kv_link_name="pigeon")


def test_kv_link_override_prices_the_transfer() -> None:
    m = build_latency_model("roofline", "opt-13b", "a100-80g", kv_link_name="infiniband-a100")
    assert m.kv_transfer_s(1 << 20) == KV_LINKS["infiniband-a100"].transfer_s(1 << 20)


def test_nixl_loopback_link_is_the_measurement_at_measured_sizes() -> None:
    link = kv_link("nixl-loopback-cpu")
    mono = 0.0
    for size, s in zip(_nixl_loopback.SIZES, _nixl_loopback.SECONDS, strict=True):
        mono = max(mono, s)
        assert link.transfer_s(size) == pytest.approx(mono)


def test_measured_link_interpolates_and_extrapolates() -> None:
    link = MeasuredLink("t", (1000, 2000, 3000), (1.0, 2.0, 3.0))
    assert link.transfer_s(0) == 0.0
    assert link.transfer_s(10) == 1.0  # latency floor
    assert link.transfer_s(1500) == pytest.approx(1.5)
    assert link.transfer_s(5000) == pytest.approx(5.0)  # tail bandwidth 1000 B/s
    with pytest.raises(ValueError, match="strictly increasing"):
        MeasuredLink("bad", (2, 1), (1.0, 1.0))
