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
    check_read,
    cold_descs,
    thp_short,
    vllm_like,
)
from splitserve.worker.vllm_adapter.kvbench_runs import (
    cold_rows,
    read_like_vllm,
    report_single,
    xfer_rows,
)

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


# -- the cold destination (a ring of block slots, least recently written first) ---------------

COLD = 1 << 30  # the decode worker's KV cache in the bench (VLLM_CPU_KVCACHE_SPACE=1)


def _cold_method(blocks: int, regions: int = 8) -> ReadMethod:
    return ReadMethod(pieces=blocks * regions, regions=regions, prepped=True, cold=True)


def test_cold_read_writes_the_slot_written_longest_ago() -> None:
    m = _cold_method(16)  # 64 MiB of 512 KiB blocks in 8 regions of 128 MiB: 256 slots each
    n = 16 * 8 * 512 * 1024
    last_written: dict[int, int] = {}
    cursor = 0
    for k in range(40):  # 2.5 turns of the ring
        descs, cursor = cold_descs(0, COLD, n, m, cursor)
        assert len(descs) == 128
        assert {size for _, size, _ in descs} == {512 * 1024}
        assert all(a >= 0 and a + size <= COLD for a, size, _ in descs)
        addrs = {a for a, _, _ in descs}
        assert len(addrs) == 128  # no slot twice in one READ
        # every slot it writes is one nobody wrote, or one not written for a whole turn
        never = [a for a in addrs if a not in last_written]
        if k < 16:
            assert len(never) == 128
        else:
            assert not never
            assert all(k - last_written[a] == 16 for a in addrs)  # 256 slots / 16 per READ
        for a in addrs:
            last_written[a] = k
    assert len(last_written) == 8 * 256  # the whole destination, not a corner of it


def test_cold_read_uses_the_same_slot_in_every_region_and_wraps() -> None:
    region = COLD // 8
    m = _cold_method(16)
    n = 16 * 8 * 512 * 1024
    descs, nxt = cold_descs(1000, COLD, n, m, 250 * 512 * 1024)  # 6 slots left before the end
    slots = [((a - 1000) % region) // (512 * 1024) for a, _, _ in descs]
    assert slots[:16] == [*range(250, 256), *range(10)]  # across the ring's end
    assert all(slots[i::16] == [slots[i]] * 8 for i in range(16))  # every region alike
    assert [(a - 1000) // region for a, _, _ in descs[::16]] == list(range(8))
    assert nxt == 10 * 512 * 1024


def test_cold_ring_with_sizes_mixed_stays_a_ring() -> None:
    m8, m16 = _cold_method(8), _cold_method(16)
    cursor, seen = 0, []
    for k in range(10):
        m, n = (m8, 8 * 8 * 512 * 1024) if k % 2 else (m16, 16 * 8 * 512 * 1024)
        descs, cursor = cold_descs(0, COLD, n, m, cursor)
        seen += [a // (512 * 1024) for a, _, _ in descs[: m.pieces // 8]]
    assert seen == list(range(len(seen)))  # 24 slots per pair of READs, back to back


def test_a_cold_read_without_a_cold_buffer_or_too_big_is_refused() -> None:
    n = 16 * 8 * 512 * 1024
    check_read(n, _cold_method(16), 2 * n, COLD)  # fits
    with pytest.raises(ValueError, match="cold_bytes"):
        check_read(n, _cold_method(16), 2 * n, 0)
    with pytest.raises(ValueError, match="do not fit the cold buffer"):
        check_read(n, _cold_method(16), 2 * n, 8 * 8 * 512 * 1024)
    with pytest.raises(ValueError, match="registered"):
        check_read(4 * n, ReadMethod(), 2 * n, COLD)
    assert "least recently written" in _cold_method(16).describe()


def test_report_gives_vllm_against_warm_and_cold_raw_reads() -> None:
    a, b = _pd(10, 5, 8), _pd(20, 5, 8)
    a.raw_cold_s, b.raw_cold_s = [9 / 1000, 11 / 1000], [15 / 1000]
    a.raw_cold_age_s, b.raw_cold_age_s = [20.0, 24.0], [30.0]
    res = {
        "timings": {"pd": [a, b], "control": [], "agg": []},
        "regions": 8,
        "cold_bytes": COLD,
        "huge_kib": {},
        "idle_cpu": {"prefill": 0.01},
        "idle_cpu_after": {"prefill": 0.01},
    }
    rows = cold_rows(res, [2048])
    # vLLM 15 ms (median of 10, 20), warm 8, cold 11 (median of 9, 11, 15);
    # per request: 10 / 10 and 15 / 20
    assert rows[2] == "| 2048 | 64.0 | 15.0 | 8.0 | 11.0 | 53 % | 73 % | 75–100 % (2 requests) |"
    assert "1024 MiB destination" in rows[-1]
    assert "8 regions" in rows[-1]
    assert "last been written a median 24 s before (20–30 s)" in rows[-1]
    assert "| 2048 | 64.0 | 15.0 |" in report_single(res, [2048])
    # without cold READs there is no such table
    a.raw_cold_s = b.raw_cold_s = []
    assert cold_rows(res, [2048]) == []
    assert "into cold memory" not in report_single(res, [2048])


# -- checks on the method: the raw buffers' page size, vLLM's READ as its engine sees it -------


def test_raw_buffers_short_of_huge_pages_are_named() -> None:
    # reader: 2 x 68 MiB + the 1 GiB ring; target: 2 x 68 MiB (kB)
    assert thp_short((1_187_840, 139_264), 68 * MiB, COLD) is None
    assert thp_short((233_472, 0), 68 * MiB, COLD) == (
        "reader 233472 of 1187840 kB, target 0 of 139264 kB"
    )
    assert thp_short((1_187_840, 0), 68 * MiB, COLD) == "target 0 of 139264 kB"


def test_report_warns_when_the_raw_buffers_missed_huge_pages() -> None:
    res = {
        "timings": {"pd": [_pd(10, 5, 8)], "control": [], "agg": []},
        "regions": 16,
        "huge_kib": {},
        "idle_cpu": {"prefill": 0.01},
        "idle_cpu_after": {"prefill": 0.01},
    }
    assert "not all in huge pages" not in report_single(res, [2048])
    res["raw_thp_short"] = "target 0 of 139264 kB"
    assert "not all in huge pages** (target 0 of 139264 kB)" in report_single(res, [2048])


def test_xfer_rows_split_vllm_s_read_into_post_and_the_wait_for_its_check() -> None:
    def marks(xfer_ms: float, checks: float) -> dict[str, float]:
        return {
            "tel_xfer": xfer_ms / 1000,
            "tel_post": 7 / 1000,
            "tel_descs": 8,
            "xfer_checks": checks,
            "prepped_descs": 128,
            "local_runs": 9,
            "remote_runs": 8,
        }

    res = {
        "trace": {
            "pd-0-2048": {"transfer": 0.0, "transferred": 0.1, "xfer_seen": 0.2},  # round 0
            "pd-1-2048": {"transfer": 1.0, "transferred": 1.007, "xfer_seen": 1.009},
            "pd-2-2048": {"transfer": 2.0, "transferred": 2.007, "xfer_seen": 2.011},
        },
        "xfer_marks": {
            "pd-0-2048": marks(100, 5),
            "pd-1-2048": marks(9, 1),
            "pd-2-2048": marks(11, 1),
        },
    }
    rows = xfer_rows(res, [1024, 2048])
    assert len(rows) == 3  # header, rule, one length (no 1024-token requests)
    # medians of the counted rounds: xfer 10, post 7, wall 7, seen 2 / 4 ms after the return
    assert rows[2] == "| 2048 | 10.0 | 7.0 | 7.0 | 3.00 | 1 | 128 / 8 | 9 / 8 |"
    assert xfer_rows({"trace": {}, "xfer_marks": {}}, [2048]) == []
