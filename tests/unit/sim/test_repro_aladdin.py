"""Aladdin reproduction (quick) and its cluster set-up.

Invariants (docs/reproductions/aladdin.md explains every number):
1. rows: the quick reproduction reports each headline claim (four GPU reductions, three Table 3
   worker sizes, two model errors) with the paper's number;
2. direction + band, as measured on our roofline (the paper's GPU savings do not reproduce in
   size; the doc says why): in mixed mode Aladdin needs fewer GPUs than JSQ at its worker size
   and than default vLLM on TP-4 workers (the paper's directions, once the PCIe all-reduce is
   priced with NCCL's latency and the cross-socket bandwidth), the split-phase reductions lie in
   measured bands around 0 (never the paper's −49 % … −60 %), every deciding run meets P100,
   and no system goes below the planner's analytic lower bound; Eq 6 picks the paper's Table 3
   sizes (2/1/1) on the PCIe A100 preset; the fitted Eq 2/3 errors are small but above the
   paper's < 4 % / < 5 %;
3. the cluster: Aladdin's loads follow the requests routed to each decode worker, every request
   finishes, and at light load best fit leaves workers empty where JSQ spreads over all of them
   (the bins Aladdin would scale down);
4. Alg. 2's heartbeat runs to completion, and with the placement's (capped) predictions it
   never moves a request.
"""

from __future__ import annotations

import re

import numpy as np

from splitserve.core.ids import EndpointId
from splitserve.policy.placement.aladdin import AladdinPacking, ConditionalMeanLengths
from splitserve.sim.cluster import Cluster, ClusterSpec
from splitserve.sim.engine import Simulator
from splitserve.sim.reproductions import REPRODUCTIONS
from splitserve.sim.reproductions.aladdin import PREFILL_POLICY, _template, fitted_models, history
from splitserve.sim.reproductions.aladdin_cluster import (
    AladdinLoads,
    Rebalancer,
    simulate_aladdin,
    split_spec,
)
from splitserve.sim.workload import Fixed, Poisson, Uniform, synthetic

BANDS = {
    # Measured in quick mode (20 req/s, 30 s of arrivals; the doc has the full sweep). Mixed
    # mode: Aladdin needs 25 % fewer GPUs than JSQ at its worker size and than default vLLM
    # (9 vs 12 GPUs quick; one TP-4 worker either way is ±4 GPUs); split mode sits within about
    # one worker of 0.
    "mixed mode, GPUs: reduction vs default vLLM (TP4, JSQ)": (0.05, 0.5),
    "mixed mode, GPUs: reduction vs JSQ, optimal workers": (0.05, 0.45),
    "split-phase decode GPUs: reduction vs JSQ": (-0.4, 0.3),
    "split-phase decode GPUs: reduction vs power-of-two": (-0.3, 0.4),
}
TABLE3_OURS = {"llama-2-70b": 2.0, "llama-2-13b": 1.0, "llama-2-7b": 1.0}
"""Eq 6 on the PCIe A100 preset (NCCL all-reduce latency, 10 GB/s cross-socket ring): the paper's
sizes; with the bandwidth-only all-reduce of earlier versions it picked 4/2/2."""


def test_quick_reproduction_direction_and_band() -> None:
    rep = REPRODUCTIONS["aladdin"](True)
    assert rep.paper == "Aladdin"
    by_name = {c.name: c for c in rep.comparisons}
    for name, (lo, hi) in BANDS.items():
        c = by_name[name]
        assert c.paper > 0.25, name
        assert lo <= c.ours <= hi, (name, c.ours)
        assert c.ours < c.paper * 0.75, name  # documented miss: far below the paper's saving
    for model, ours in TABLE3_OURS.items():
        c = by_name[f"Table 3: GPUs per worker, {model} on A100"]
        assert c.ours == ours
        assert c.ours == c.paper  # Table 3 reproduces with the PCIe all-reduce cost
    for name in (
        "Eq 2 prefill model max error (13B, TP1)",
        "Eq 3 decode model max error (13B, TP1)",
    ):
        assert 0 < by_name[name].ours < 0.25, name
    runs = [n for n in rep.notes if "GPUs (attainment" in n]
    assert len(runs) == 6
    for note in runs:
        m = re.search(r"(\d+) × TP\d .*attainment ([\d.]+).*analytic bound (\d+)", note)
        assert m is not None, note
        workers, att, bound = int(m.group(1)), float(m.group(2)), int(m.group(3))
        assert att == 1.0, note  # P100 in every deciding run
        assert workers >= bound, note  # nothing beats the analytic lower bound
    assert "Aladdin" in rep.markdown()


def _split(placement: str, num_decode: int, loads: AladdinLoads | None) -> ClusterSpec:
    perf = fitted_models()[1].model
    aladdin = {"perf": perf, "lengths": loads.lengths if loads else None}
    return split_spec(
        _template(1, PREFILL_POLICY),
        1,
        _template(1, {}),
        num_decode,
        placement,
        aladdin,
        loads,
    )


def test_loads_follow_routed_requests_and_best_fit_leaves_workers_empty() -> None:
    rng = np.random.default_rng(3)
    items = synthetic(Poisson(4.0), Fixed(200), Fixed(150), 40, rng)
    loads = AladdinLoads(ConditionalMeanLengths.of(history(500)))
    spec = _split("aladdin", 4, loads)
    sim = Simulator()
    cluster = Cluster(spec, items)
    loads.bind(cluster, sim)
    cluster.start(sim)
    sim.run(cluster, until_s=items[-1].arrival_s)
    decode_ids = [EndpointId(w.id) for w in cluster.workers if w.role.value == "decode"]
    held = sum(len(loads(e).requests) for e in decode_ids)
    assert held == cluster.num_in_flight > 0
    for e in decode_ids:
        for r in loads(e).requests:
            assert 0 <= r.num_generated_tokens <= 150
            assert r.predicted_output_tokens >= 1
    sim.run(cluster)
    result = cluster.result(sim)
    assert result.num_finished == len(items)
    used = sum(1 for w in result.workers if w.role == "decode" and w.num_steps > 0)

    jsq = simulate_aladdin(_split("jsq", 4, None), items)
    assert jsq.num_finished == len(items)
    jsq_used = sum(1 for w in jsq.workers if w.role == "decode" and w.num_steps > 0)
    assert used < jsq_used == 4  # best fit packs; JSQ spreads over every worker


def test_alg2_heartbeat_runs_and_moves_nothing_with_capped_predictions() -> None:
    """Alg. 2 each 100 ms: every request finishes either way; with the placement's predictions
    (capped at max_tokens = the true length) no request finishes before its prediction, so no
    worker under-runs and no move lowers the error (the doc's measured finding)."""
    rng = np.random.default_rng(5)
    items = synthetic(Poisson(8.0), Uniform(50, 400), Uniform(2, 300), 80, rng)
    perf = fitted_models()[1].model
    lengths = ConditionalMeanLengths.of(history(500))
    for capped in (True, False):
        loads = AladdinLoads(lengths)
        spec = _split("aladdin", 4, loads)
        packing = AladdinPacking(perf=perf, lengths=lengths)
        rb = Rebalancer(packing, loads, 0.1, capped=capped)
        result = simulate_aladdin(spec, items, loads, rebalance=rb)
        assert result.num_finished == len(items)
        assert rb.num_heartbeats >= items[-1].arrival_s / 0.1
        if capped:
            assert rb.num_moves == 0
