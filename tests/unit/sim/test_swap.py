"""Swap preemption and engine predictors in the cluster simulator.

Invariants:
1. a swap is priced as tokens x `KvLayout.bytes_per_token` over the host link, added to the step
   (or overlapped: the step takes the longer of the two);
2. ALISE with swap preemption runs a memory-tight cluster to completion, swapping; the host
   space is all returned; a slower host link makes the same run slower, while a recompute-only
   run does not depend on the link at all;
3. a worker given the "oracle" predictor shows each request's true length to its policy.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from splitserve.core.ids import PoolName, RequestId
from splitserve.core.perf import HARDWARE, MODELS, RooflineModel
from splitserve.core.roles import Role
from splitserve.policy.batching.base import StepDecision, StepView
from splitserve.sim.cluster import Cluster, ClusterSpec, simulate
from splitserve.sim.engine import Simulator
from splitserve.sim.entities import HOST_LINK_BYTES_PER_S, PoolSpec, WorkerTemplate
from splitserve.sim.workload import PRESETS, Poisson, synthetic

MODEL = RooflineModel(MODELS["opt-13b"], HARDWARE["a100-80g"])


def template(**kw: object) -> WorkerTemplate:
    base = WorkerTemplate(latency=MODEL, num_blocks=120, kv_layout=MODEL.shape.kv_layout)
    return replace(base, **kw)  # type: ignore[arg-type]


def test_swap_pricing() -> None:
    t = template()
    copy = 1000 * MODEL.shape.kv_layout.bytes_per_token / HOST_LINK_BYTES_PER_S
    assert t.swap_s(1000) == pytest.approx(copy) == pytest.approx(0.032768)  # 800 KiB, 25 GB/s
    assert t.swapped_step_s(0.01, 1000) == pytest.approx(0.01 + copy)
    overlapped = template(host_swap_overlap=True)
    assert overlapped.swapped_step_s(0.5, 1000) == 0.5
    assert overlapped.swapped_step_s(0.0, 1000) == pytest.approx(copy)


ALISE_SWAP = {"preemption": "swap", "displace_running": True, "max_output_tokens": 512}
ITEMS = synthetic(
    Poisson(6.0),
    PRESETS["sharegpt"].prompt,
    PRESETS["sharegpt"].output,
    60,
    np.random.default_rng(3),
)
ITEMS = tuple(
    replace(
        i,
        num_prompt_tokens=min(i.num_prompt_tokens, 400),
        num_output_tokens=min(i.num_output_tokens, 400),
    )
    for i in ITEMS
)


def run(t: WorkerTemplate) -> tuple[Cluster, Simulator]:
    spec = ClusterSpec((PoolSpec(PoolName("m"), Role.MIXED, 1, t),))
    sim = Simulator()
    cluster = Cluster(spec, ITEMS)
    cluster.start(sim)
    sim.run(cluster)
    return cluster, sim


def test_alise_swaps_to_completion_and_pays_for_it() -> None:
    fast_link = template(
        policy="alise", policy_params=ALISE_SWAP, predictor="oracle", host_swap_tokens=1 << 30
    )
    cluster, sim = run(fast_link)
    engine = cluster.workers[0].engine
    assert cluster.num_finished == len(ITEMS)
    assert engine.num_swaps_out > 0
    assert engine.num_swaps_in == engine.num_swaps_out
    assert engine.host_used_tokens == 0
    slow_cluster, slow_sim = run(replace(fast_link, host_link_bytes_per_s=1e9))
    assert slow_cluster.num_finished == len(ITEMS)
    assert slow_sim.now_s > sim.now_s
    # Without host space ALISE recomputes, and the link never matters.
    no_host = replace(fast_link, host_swap_tokens=0)
    a = simulate(ClusterSpec((PoolSpec(PoolName("m"), Role.MIXED, 1, no_host),)), ITEMS)
    b = simulate(
        ClusterSpec(
            (PoolSpec(PoolName("m"), Role.MIXED, 1, replace(no_host, host_link_bytes_per_s=1.0)),)
        ),
        ITEMS,
    )
    assert a == b
    assert a.num_finished == len(ITEMS)


def test_oracle_predictor_reaches_the_policy() -> None:
    spec = ClusterSpec((PoolSpec(PoolName("m"), Role.MIXED, 1, template(predictor="oracle")),))
    fresh = Cluster(spec, ITEMS)
    inner = fresh.workers[0].engine.policy
    seen: dict[RequestId, int | None] = {}

    class Spy:
        name = "spy"

        def decide(self, view: StepView) -> StepDecision:
            for s in (*view.running, *view.waiting):
                seen[s.id] = s.predicted_output_tokens
            return inner.decide(view)

    sim = Simulator()
    fresh.workers[0].engine.policy = Spy()
    fresh.start(sim)
    sim.run(fresh)
    truth = {r.id: r.item.num_output_tokens for r in fresh.requests}
    assert seen
    assert all(seen[k] == truth[k] for k in seen)
