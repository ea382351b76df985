"""The Past-Future Table-1 reproduction (`splitserve sim reproduce pastfuture --quick`).

Invariants:
1. direction: Past-Future evicts far less than aggressive admission at about the optimum's decode
   steps, and conservative admission needs far more decode steps than either;
2. band: every quick comparison is within ±25 % of the paper (or the artifact re-run);
3. the token-level driver is deterministic for a seed and frees every block;
4. the reproduction is registered as "pastfuture";
5. the registered "pastfuture" and "alise" step policies run the cluster simulator to completion,
   colocated and disaggregated.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from splitserve.policy.batching.pastfuture import PastFutureParams, PastFuturePolicy
from splitserve.sim.cluster import ClusterSpec, simulate
from splitserve.sim.reproductions import REPRODUCTIONS, Reproduction
from splitserve.sim.reproductions.pastfuture import DATASETS, lengths, pastfuture
from splitserve.sim.reproductions.pastfuture_cluster import run_token_level
from splitserve.sim.workload import Fixed, Poisson, synthetic
from tests.unit.sim.builders import colocated, disaggregated


@pytest.fixture(scope="module")
def quick() -> Reproduction:
    return pastfuture(quick=True)


def _ours(rep: Reproduction, fragment: str) -> float:
    (match,) = [c for c in rep.comparisons if fragment in c.name]
    return match.ours


def test_direction(quick: Reproduction) -> None:
    pf_evicted = _ours(quick, "pastfuture 3% evicted")
    agg_evicted = _ours(quick, "aggressive 99% evicted")
    assert pf_evicted * 5 < agg_evicted
    assert agg_evicted > 50
    pf_steps = _ours(quick, "pastfuture 3% decode steps")
    cons_steps = _ours(quick, "conservative decode steps")
    assert 1.0 <= pf_steps < 1.05
    assert cons_steps > 1.4 * pf_steps


def test_within_band(quick: Reproduction) -> None:
    assert len(quick.comparisons) == 4
    missed = [c.name for c in quick.comparisons if not c.within_band]
    assert not missed
    assert "Past-Future" in quick.markdown()


def test_driver_deterministic() -> None:
    pairs = lengths(DATASETS[0], 120, 32)

    def run() -> tuple[int, int]:
        params = PastFutureParams(max_output_tokens=128, window_requests=50, reserve_fraction=0.03)
        r = run_token_level(PastFuturePolicy(params), pairs, 120_000 // 32)
        return r.decode_steps, r.preemptions

    assert run() == run()


def test_registered() -> None:
    assert "pastfuture" in REPRODUCTIONS


@pytest.mark.parametrize("policy", ["pastfuture", "alise"])
@pytest.mark.parametrize("disagg", [False, True])
def test_policies_run_in_the_cluster_simulator(policy: str, disagg: bool) -> None:
    base = disaggregated(num_blocks=64) if disagg else colocated(num_blocks=64)
    spec = ClusterSpec(
        tuple(
            replace(
                p,
                worker=replace(p.worker, policy=policy, policy_params={"max_output_tokens": 64}),
            )
            for p in base.pools
        )
    )
    items = synthetic(Poisson(20.0), Fixed(40), Fixed(30), 40, np.random.default_rng(0))
    assert simulate(spec, items).num_finished == 40
