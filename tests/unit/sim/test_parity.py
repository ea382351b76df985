"""Parity: the router's live placement pipeline and the simulator decide identically.

Invariant: for every request of a simulated run, feeding the same request and the same endpoint
views the simulator saw into the live router's placement step (`router.dispatch.Dispatch`, with
the router's default decider) yields exactly the simulator's placement: path, decode and
prefill candidates in order, and reason. Runs on a mixed (aggregated) and a disaggregated
cluster, including requests too short for P/D when the threshold is raised.
"""

from __future__ import annotations

from typing import cast

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from splitserve.api import v1alpha1 as v1
from splitserve.api.router import PlacementSettings, PoolSettings
from splitserve.core.clock import ManualClock
from splitserve.obs.metrics import RouterMetrics
from splitserve.policy.placement import EndpointView, Path, PdDeciderParams
from splitserve.router.dispatch import Dispatch, Dispatcher, default_decider
from splitserve.router.ledger import Ledger
from splitserve.router.pool_view import PoolView
from splitserve.sim.cluster import Cluster, ClusterSpec
from splitserve.sim.engine import Simulator
from splitserve.sim.entities import PlacementRecord
from splitserve.sim.workload import Poisson, Uniform, synthetic
from tests.unit.sim.builders import colocated, disaggregated


class RecordedPool:
    """Stands in for `PoolView`: serves the endpoint views the simulator recorded."""

    def __init__(self) -> None:
        self.current: list[EndpointView] = []
        self.ledger = Ledger()  # the live dispatcher reserves here; recorded views ignore it
        self.settings = PoolSettings()  # the dispatcher reads its worker-link kind here

    def views(self) -> list[EndpointView]:
        return list(self.current)

    def on_change(self, listener: object) -> None:
        pass

    def link_port(self, eid: str) -> int:
        return 0  # no stream link advertised: placement is all this test compares


def _records(spec: ClusterSpec, n: int) -> list[PlacementRecord]:
    items = synthetic(Poisson(200), Uniform(1, 400), Uniform(1, 40), n, np.random.default_rng(5))
    sim = Simulator()
    cluster = Cluster(spec, items, record_placements=True)
    cluster.start(sim)
    sim.run(cluster)
    assert cluster.router.records is not None
    return cluster.router.records


AGG, DIS = Path.AGGREGATED, Path.DISAGGREGATED


@pytest.mark.parametrize(
    ("spec", "min_pd", "paths"),
    [
        (colocated(3), 1, {AGG}),
        (disaggregated(2, 3), 1, {DIS}),
        (disaggregated(2, 2, num_blocks=64), 100, {AGG, DIS}),
    ],
    ids=["colocated", "disaggregated", "short-prompts-aggregated"],
)
def test_live_placement_matches_simulator(spec: ClusterSpec, min_pd: int, paths: set[Path]) -> None:
    spec = ClusterSpec(spec.pools, decider=PdDeciderParams(min_prompt_tokens_for_pd=min_pd))
    records = _records(spec, 150)
    pool = RecordedPool()
    dispatcher = Dispatcher(
        cast(PoolView, pool),
        clock=ManualClock(),
        metrics=RouterMetrics(CollectorRegistry()),
        decider=default_decider(
            PlacementSettings(
                min_prompt_tokens_for_pd=min_pd, profile=v1.PlacementProfile.LEAST_LOADED
            )
        ),
    )
    seen = set()
    for rec in records:
        pool.current = list(rec.endpoints)
        live = Dispatch(dispatcher, rec.request)._place()
        assert live == rec.placement, rec.request.id
        seen.add(live.path)
    assert len(records) == 150
    assert seen == paths
