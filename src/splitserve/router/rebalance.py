"""Aladdin's re-balancing (Alg. 2) live in the router, with the placement profile `aladdin`.

Each heartbeat (at most every `interval_s`, driven by the pool's changes: load reports, requests
placed and finished) the router runs `policy.placement.aladdin.plan_rebalance`, the very
function the simulator's Aladdin cluster runs each heartbeat, over its own ledger:

* ongoing, per decode worker: the decode shares placed there (their prompt, tokens generated so
  far, predicted output);
* pending (movable): decode shares of disaggregated requests whose prefill still runs on a
  prefill worker, so nothing of them is on the decode worker yet;
* finished: requests that ended before their predicted length, counted for as long as their
  prediction would have kept them (Alg. 2's negative error), as in the simulator.

A move re-targets the pending decode share in the ledger (`Ledger.move`); the request's dispatch
reads it (`Ledger.moved_to`) when its prefill returns and sends the decode there. Moves and
refused moves are counted on the object (`num_moves`, `num_refused`) and logged.
"""

from __future__ import annotations

import logging

from splitserve.core.clock import Clock
from splitserve.core.ids import EndpointId
from splitserve.policy.placement.aladdin import (
    AladdinPacking,
    OngoingRequest,
    RebalanceOutcome,
    plan_rebalance,
)
from splitserve.router.ledger import Ledger
from splitserve.router.pool_view import PoolView

log = logging.getLogger(__name__)


class LiveRebalancer:
    def __init__(
        self,
        packing: AladdinPacking,
        pool: PoolView,
        clock: Clock,
        interval_s: float = 0.1,
    ) -> None:
        if interval_s <= 0:
            raise ValueError("interval_s must be > 0")
        self.packing = packing
        self.pool = pool
        self.clock = clock
        self.interval_s = interval_s
        self.num_heartbeats = 0
        self.num_moves = 0
        self.num_refused = 0
        self._last_s = float("-inf")
        self._early: list[tuple[float, EndpointId, int, int]] = []
        """Finished before their prediction: (counts until, worker, real, predicted)."""
        pool.on_change(self.maybe_heartbeat)

    def finished(self, eid: EndpointId, real: int, predicted: int) -> None:
        """A request's decode on `eid` ended after `real` tokens (predicted: `predicted`)."""
        if real < predicted:
            until = self.clock.now_s() + (predicted - real) * self.packing.atgt_slo_s
            self._early.append((until, eid, real, predicted))

    def maybe_heartbeat(self) -> None:
        now_s = self.clock.now_s()
        if now_s - self._last_s >= self.interval_s:
            self._last_s = now_s
            self.heartbeat()

    def heartbeat(self) -> RebalanceOutcome:
        self.num_heartbeats += 1
        now_s = self.clock.now_s()
        self._early = [e for e in self._early if e[0] > now_s]
        ledger: Ledger = self.pool.ledger
        views = {v.id: v for v in self.pool.views() if v.accepts_work and v.role.can_decode}
        ongoing: dict[EndpointId, list[OngoingRequest]] = {}
        pending: dict[str, tuple[EndpointId, OngoingRequest]] = {}
        for eid in views:
            for e in ledger.entries(eid):
                if e.prefill:
                    continue
                pred = max(1, e.predicted_output_tokens)
                if e.movable and not e.started:
                    pending[e.request_id] = (eid, OngoingRequest(e.num_prompt_tokens, 0, pred))
                    ongoing.setdefault(eid, [])
                    continue
                ongoing.setdefault(eid, []).append(
                    OngoingRequest(
                        e.num_prompt_tokens, e.num_generated_tokens, pred, prefilled=e.started
                    )
                )
        finished: dict[EndpointId, list[tuple[int, int]]] = {}
        for _, eid, real, pred in self._early:
            if eid in views:
                finished.setdefault(eid, []).append((real, pred))

        def capacity(eid: EndpointId) -> float:
            v = views[eid]
            return float(v.kv_total_blocks * v.kv_block_size)

        def apply(rid: str, dst: EndpointId) -> bool:
            src = pending[rid][0]
            return ledger.move(rid, src, dst, views[dst].kv_block_size)

        outcome = plan_rebalance(
            self.packing, ongoing, finished, pending, capacity, apply, self.packing.lengths
        )
        self.num_moves += len(outcome.moved)
        self.num_refused += len(outcome.refused)
        for rid, dst in outcome.moved:
            log.info("aladdin re-balancing: request %s's decode moves to %s", rid, dst)
        return outcome
