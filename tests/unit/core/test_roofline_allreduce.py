"""Tensor-parallel all-reduce cost in the roofline: opt-in latency and ring traffic.

Invariants:
1. off by default: every built-in hardware preset leaves the all-reduce latency at 0 and the
   ring factor off, so their step times are the bandwidth-only ones (the golden digests in
   tests/unit/sim/test_speed_golden.py pin that bit for bit);
2. the latency adds exactly 2·layers·(α + 2(N−1)·β) to a TP step, whatever the batch, and
   nothing at TP 1;
3. the ring factor scales the bandwidth term by 2(N−1)/N: unchanged at TP 2, ×1.5 at TP 4;
4. the Aladdin reproduction's PCIe A100 uses both, with the documented constants.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from splitserve.core.perf import HARDWARE, MODELS, BatchShape, HardwareSpec, RooflineModel
from splitserve.sim.reproductions.aladdin import A100_80G_PCIE

BASE = HARDWARE["a100-80g"]
LAT = replace(BASE, tp_allreduce_latency_s=6.6e-6, tp_allreduce_hop_latency_s=1.0e-6)
RING = replace(BASE, tp_ring_allreduce=True)
BATCHES = (
    BatchShape(decode_contexts=(512,) * 32),
    BatchShape(prefill_chunks=((1024, 0),)),
    BatchShape(prefill_chunks=((256, 128),), decode_contexts=(300, 900)),
)


def test_presets_leave_the_all_reduce_extras_off() -> None:
    spec = HardwareSpec("x", 1e12, 1e12, 1e9)
    assert spec.tp_allreduce_latency_s == 0.0
    assert spec.tp_allreduce_hop_latency_s == 0.0
    assert spec.tp_ring_allreduce is False
    for hw in HARDWARE.values():
        assert hw.tp_allreduce_latency_s == hw.tp_allreduce_hop_latency_s == 0.0, hw.name
        assert not hw.tp_ring_allreduce, hw.name


@pytest.mark.parametrize("tp", [2, 4, 8])
@pytest.mark.parametrize("batch", BATCHES)
def test_latency_adds_two_all_reduces_per_layer(tp: int, batch: BatchShape) -> None:
    shape = MODELS["llama-2-13b"]
    plain = RooflineModel(shape, BASE, tp).step_s(batch)
    with_lat = RooflineModel(shape, LAT, tp).step_s(batch)
    expected = 2 * shape.num_layers * (6.6e-6 + 2 * (tp - 1) * 1.0e-6)
    assert with_lat - plain == pytest.approx(expected, rel=1e-9)


def test_latency_scales_with_time_scale_and_spares_tp1() -> None:
    shape = MODELS["llama-2-7b"]
    batch = BATCHES[0]
    assert RooflineModel(shape, LAT, 1).step_s(batch) == RooflineModel(shape, BASE, 1).step_s(batch)
    fast = RooflineModel(shape, LAT, 2, time_scale=0.5).step_s(batch)
    assert fast == pytest.approx(0.5 * RooflineModel(shape, LAT, 2).step_s(batch), rel=1e-12)


@pytest.mark.parametrize(("tp", "factor"), [(2, 1.0), (4, 1.5), (8, 1.75)])
def test_ring_factor_scales_the_bandwidth_term(tp: int, factor: float) -> None:
    shape = MODELS["llama-2-13b"]
    batch = BATCHES[1]
    no_tp_cost = RooflineModel(shape, replace(BASE, tp_link_bw_bytes_s=1e300), tp).step_s(batch)
    plain = RooflineModel(shape, BASE, tp).step_s(batch) - no_tp_cost
    ring = RooflineModel(shape, RING, tp).step_s(batch) - no_tp_cost
    assert plain > 0
    assert ring == pytest.approx(factor * plain, rel=1e-6)


def test_aladdin_pcie_preset_prices_a_tp4_decode_step() -> None:
    hw = A100_80G_PCIE
    assert hw.tp_ring_allreduce
    assert hw.tp_link_bw_bytes_s == 10e9
    assert (hw.tp_allreduce_latency_s, hw.tp_allreduce_hop_latency_s) == (6.6e-6, 1.0e-6)
    shape = MODELS["llama-2-13b"]
    batch = BatchShape(decode_contexts=(300,) * 60)
    lat = RooflineModel(shape, hw, 4)
    free = RooflineModel(
        shape,
        replace(
            hw, tp_link_bw_bytes_s=1e300, tp_allreduce_latency_s=0.0, tp_allreduce_hop_latency_s=0.0
        ),
        4,
    )
    # 80 all-reduces × (6.6 + 6 × 1.0) µs = 1.008 ms of latency; 80 × 60 tokens × 5120 × 2 B
    # × 1.5 (ring) / 10 GB/s = 7.4 ms of traffic.
    comm = lat.step_s(batch) - free.step_s(batch)
    assert comm == pytest.approx(1.008e-3 + 80 * 60 * 5120 * 2 * 1.5 / 10e9, rel=1e-6)
