"""How `make bench-kv`'s raw NIXL READ lays out its descriptors (the run needs NIXL; the layout
and the report's arithmetic do not)."""

from __future__ import annotations

import itertools

import pytest

from splitserve.worker.vllm_adapter.kvbench import (
    ONE_DESCRIPTOR,
    MiB,
    ReadMethod,
    Timing,
    _descs,
    vllm_like,
)
from splitserve.worker.vllm_adapter.kvbench_runs import read_like_vllm, report_single

BLOCK = 256 * 1024


def test_one_descriptor_is_the_whole_read() -> None:
    assert _descs(1000, 128 * MiB, 64 * MiB, ONE_DESCRIPTOR) == [(1000, 64 * MiB, 0)]


def test_vllm_layout_one_descriptor_per_block_and_region_regions_apart() -> None:
    m = vllm_like(64 * MiB, 16, BLOCK)
    assert (m.pieces, m.regions, m.prepped, m.notify, m.merge) == (256, 16, True, True, True)
    d = _descs(0, 128 * MiB, 64 * MiB, m)
    assert len(d) == 256
    assert {size for _, size, _ in d} == {BLOCK}
    assert sum(size for _, size, _ in d) == 64 * MiB
    starts = sorted(a for a, _, _ in d)
    # 16 blocks back to back per region, the regions 8 MiB apart: 16 mergeable runs, not one.
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert gaps.count(BLOCK) == 256 - 16
    assert all(g == 8 * MiB - 15 * BLOCK for g in gaps if g != BLOCK)
    assert max(a + s for a, s, _ in d) <= 128 * MiB


def test_runs_leave_a_block_between_them() -> None:
    m = ReadMethod(pieces=8, regions=2, prepped=True, runs=2)
    d = _descs(0, 64 * MiB, 8 * BLOCK, m)
    region0 = sorted(a for a, _, _ in d if a < 32 * MiB)
    assert region0 == [0, BLOCK, 3 * BLOCK, 4 * BLOCK]
    # every block its own run: nothing left for NIXL to merge
    d = _descs(0, 64 * MiB, 8 * BLOCK, ReadMethod(pieces=8, regions=2, runs=9))
    starts = sorted(a for a, _, _ in d if a < 32 * MiB)
    assert [b - a for a, b in itertools.pairwise(starts)] == [2 * BLOCK] * 3


def test_a_layout_that_does_not_fit_is_refused() -> None:
    with pytest.raises(ValueError, match="do not fit"):
        _descs(0, 2 * BLOCK, 2 * BLOCK, ReadMethod(pieces=2, regions=2))


def test_read_like_vllm_counts_blocks_and_their_runs() -> None:
    m = read_like_vllm(
        16 * 16 * BLOCK, [[5, 6, 7, 9, 10, 2, 3, 4, 11, 12, 13, 14, 15, 16, 17, 18]], 16
    )
    assert (m.pieces, m.regions, m.runs) == (256, 16, 2)  # 2..7 and 9..18
    assert read_like_vllm(16 * BLOCK, [[40]], 16).pieces == 16
    assert read_like_vllm(16 * BLOCK, [], 16) == ReadMethod(16, 16, True, True, True, 1)
    assert "256 descriptor(s) in 16 region(s) (2 contiguous runs each)" in m.describe()


def _pd(xfer_ms: float, raw_ms: float, like_ms: float) -> Timing:
    t = Timing("pd", 2048, 0.1, 0.05, [1, 2], 0.2)
    t.kv_bytes = 64 * MiB
    t.xfer_s = xfer_ms / 1000
    t.raw_s = [raw_ms / 1000]
    t.raw_vllm_s = [like_ms / 1000]
    t.kv_blocks = [list(range(1, 17))]
    return t


def test_report_ratio_uses_the_raw_read_made_as_vllm_makes_it() -> None:
    res = {
        "timings": {"pd": [_pd(10, 5, 8)], "control": [], "agg": []},
        "regions": 16,
        "huge_kib": {"prefill": 1024, "decode": 0},
        "idle_cpu": {"prefill": 0.01},
        "idle_cpu_after": {"prefill": 0.01},
    }
    text = report_single(res, [2048])
    row = next(line for line in text.splitlines() if line.startswith("| 2048 | pd"))
    assert "| 5.0 (best 5.0) | 8.0 (best 8.0) |" in row
    assert "(80 %)" in row  # 8 ms raw vLLM-like / 10 ms vLLM, not 5 / 10
    assert "256 descriptor(s) in 16 region(s)" in text
    assert "prefill 1024, decode 0" in text
