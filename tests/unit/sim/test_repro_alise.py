"""The ALISE reproduction (`splitserve sim reproduce alise --quick`).

Invariants:
1. direction: ALISE sustains a higher rate than vLLM under the 200 ms/token bound, cuts mean
   end-to-end latency at vLLM's bound rate, and the KV policies rank Swap < Defer < Recompute in
   normalized latency at high rate (paper Fig. 8);
2. band: every quick comparison is within ±25 % of the paper;
3. the workload draws the same requests at every rate (common random numbers) and drops, rather
   than truncates, pairs longer than OPT's context;
4. `rate_at_bound` interpolates the first crossing;
5. the reproduction is registered as "alise".
"""

from __future__ import annotations

import pytest

from splitserve.sim.reproductions import REPRODUCTIONS, Reproduction
from splitserve.sim.reproductions.alise import (
    CONTEXT_TOKENS,
    SHAREGPT,
    alise,
    rate_at_bound,
    workload,
)


@pytest.fixture(scope="module")
def quick() -> Reproduction:
    return alise(quick=True)


def _ours(rep: Reproduction, fragment: str) -> float:
    (match,) = [c for c in rep.comparisons if fragment in c.name]
    return match.ours


def test_direction(quick: Reproduction) -> None:
    assert _ours(quick, "throughput at 200 ms/token") > 1.3
    assert 0.3 < _ours(quick, "mean response latency reduction") < 0.65
    defer = _ours(quick, "Defer / Swap")
    recompute = _ours(quick, "Recompute / Swap")
    assert 1.2 < defer < recompute  # Swap < Defer < Recompute


def test_within_band(quick: Reproduction) -> None:
    assert len(quick.comparisons) == 4
    missed = [c.name for c in quick.comparisons if not c.within_band]
    assert not missed
    assert "ALISE" in quick.markdown()


def test_workload_common_draw_and_context() -> None:
    slow, fast = workload(SHAREGPT, 1.0, 300), workload(SHAREGPT, 2.0, 200)
    assert [(i.num_prompt_tokens, i.num_output_tokens) for i in slow[:200]] == [
        (i.num_prompt_tokens, i.num_output_tokens) for i in fast
    ]
    assert fast[-1].arrival_s == pytest.approx(slow[199].arrival_s / 2)
    assert all(i.num_prompt_tokens + i.num_output_tokens <= CONTEXT_TOKENS for i in slow)


def test_rate_at_bound() -> None:
    assert rate_at_bound([(1.0, 0.1), (2.0, 0.3)], 0.2) == pytest.approx(1.5)
    assert rate_at_bound([(1.0, 0.1), (2.0, 0.15)], 0.2) == 2.0
    assert rate_at_bound([(1.0, 0.5), (2.0, 0.6)], 0.2) == 1.0


def test_registered() -> None:
    assert "alise" in REPRODUCTIONS
