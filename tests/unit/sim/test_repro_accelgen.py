"""AccelGen reproduction (quick) and its single-engine driver.

Invariants:
1. direction: on the quick workload AccelGen's goodput is higher and its mean JCT lower than
   vLLM's and Sarathi's, and its throughput is not lower (but within 1.2x: KV-bound);
2. band: goodput and JCT ratios vs both baselines land within ±25 % of the paper's ranges; the
   iteration-attainment and GPU-utilisation rows miss, for the measured reason
   docs/reproductions/accelgen.md gives (our baselines' iterations are almost all within
   0.1875 s and every system meets > 95 % of its iteration SLOs, so no +37-point gain exists);
3. Fig. 6 (2 long + 20 short prompts): AccelGen beats Sarathi's spread allocation (per-chunk
   admission) on mean JCT in the 12 GB cache, and ERA beats AccelGen without ERA: lower mean JCT,
   and with room for both long prompts the first one's TTFT drops by a third or more;
4. the driver runs every request to completion and its metrics follow their definitions.
"""

from __future__ import annotations

from itertools import pairwise

import pytest

from splitserve.core.ids import SloClassName
from splitserve.core.request import SloClass
from splitserve.policy.batching.accelgen import AccelGenParams, AccelGenPolicy
from splitserve.policy.batching.fcfs import FcfsPolicy
from splitserve.sim.reproductions import REPRODUCTIONS, Reproduction
from splitserve.sim.reproductions.accelgen import (
    BLOCK_SIZE,
    MODEL,
    NUM_BLOCKS,
    QUICK_SYSTEMS,
    run_system,
)
from splitserve.sim.reproductions.accelgen_cluster import run_engine
from splitserve.sim.workload import WorkItem


@pytest.fixture(scope="module")
def quick() -> Reproduction:
    return REPRODUCTIONS["accelgen"](True)


def test_quick_reproduction_direction_and_band(quick: Reproduction) -> None:
    assert quick.paper == "AccelGen"
    by = {c.name: c for c in quick.comparisons}
    for base in ("vLLM", "Sarathi"):
        goodput = by[f"goodput vs {base} (×)"]
        jct = by[f"JCT reduction vs {base} (× lower)"]
        tput = by[f"throughput (tokens/s) vs {base} (×)"]
        assert goodput.ours > 1.0, base
        assert jct.ours > 1.0, base
        for row in (goodput, jct):
            assert row.within_band, (row.name, row.ours)
        # Throughput: the 12 GB cache bounds every system to the same work rate, so ours stays
        # near 1x (the full run gives 1.01x, a miss; docs/reproductions/accelgen.md).
        assert 1.0 <= tput.ours <= 1.2, base
    assert "AccelGen" in quick.markdown()


def test_attainment_rows_miss_for_the_documented_reason(quick: Reproduction) -> None:
    by = {c.name: c for c in quick.comparisons}
    for base in ("vLLM", "Sarathi"):
        assert not by[f"iteration SLO attainment gain vs {base} (points)"].within_band
        # Why: almost every iteration of the baselines is within 0.1875 s (paper: 16-34 %), so
        # iteration attainment is saturated for every system and the gain is about zero.
        assert by[f"§3: iterations within 0.1875 s, {base} (%)"].ours > 90.0
        assert abs(by[f"iteration SLO attainment gain vs {base} (points)"].ours) < 5.0


def _fig6() -> tuple[tuple[WorkItem, ...], dict[str, SloClass]]:
    slo = SloClass(SloClassName("fig6"), ttft_ms=60_000.0, tpot_ms=1000.0)
    longs = [WorkItem(0.0, 10_214, 32, slo.name), WorkItem(0.0, 10_252, 32, slo.name)]
    shorts = [WorkItem(0.01 * i, 128 + 13 * i, 32, slo.name) for i in range(20)]
    return tuple(longs + shorts), {slo.name: slo}


def test_fig6_era_beats_spread_allocation() -> None:
    items, slos = _fig6()
    era = run_system("AccelGen", items, slos)
    spread = run_system("Sarathi (V1 admission)", items, slos)
    assert era.jct_s < spread.jct_s
    assert era.preemptions <= spread.preemptions
    assert era.throughput_tok_s >= spread.throughput_tok_s


@pytest.mark.parametrize("num_blocks", [NUM_BLOCKS, 800])
def test_fig6_era_on_vs_off(num_blocks: int) -> None:
    """ERA vs AccelGen's own spread allocation (era=False): lower mean JCT; with room for both
    long prompts (800 blocks = 25.6K tokens) the first long prompt's TTFT drops by a third or
    more, as Fig. 6 shows."""
    items, slos = _fig6()
    runs = {}
    for era in (True, False):
        policy = AccelGenPolicy(
            AccelGenParams(latency=MODEL, slo_classes=tuple(slos.values()), era=era)
        )
        runs[era] = run_engine(items, policy, MODEL, num_blocks, BLOCK_SIZE, lambda: 1)
    assert runs[True].num_finished == runs[False].num_finished == len(items)
    assert runs[True].mean_jct_s() < runs[False].mean_jct_s()
    if num_blocks == 800:
        first = {era: min(r.token_times[0][0], r.token_times[1][0]) for era, r in runs.items()}
        assert first[True] < 0.67 * first[False]


def test_driver_finishes_everything_and_measures_by_definition() -> None:
    items = tuple(WorkItem(0.05 * i, 200 + 50 * i, 20, SloClassName("default")) for i in range(10))
    run = run_engine(items, FcfsPolicy(), MODEL, NUM_BLOCKS, BLOCK_SIZE, lambda: 768)
    assert run.num_finished == len(items)
    assert [len(t) for t in run.token_times] == [20] * 10
    assert run.output_tokens() == 200
    loose = {"default": SloClass(SloClassName("default"), ttft_ms=1e6, tpot_ms=1e6)}
    tight = {"default": SloClass(SloClassName("default"), ttft_ms=1e-3, tpot_ms=1e-3)}
    assert run.iteration_attainment(loose) == 1.0
    assert run.iteration_attainment(tight) == 0.0
    assert run.good_requests(loose) == 10
    assert run.good_requests(tight) == 0
    assert 0.0 < run.gpu_utilisation() <= 1.0
    assert 0.0 < run.kv_utilisation() <= 1.0
    assert 0.0 <= run.share_steps_within(0.1875) <= 1.0
    assert all(a.end_s <= b.start_s + 1e-12 for a, b in pairwise(run.steps))
    assert set(QUICK_SYSTEMS) == {"vLLM", "Sarathi", "AccelGen"}
