"""A single-engine driver that records every iteration, for AccelGen's iteration-level metrics.

Owns: `run_engine`, which runs a workload on one colocated engine (`EngineModel` + a step policy,
priced by a `LatencyModel`) step by step, and `EngineRun`, which keeps what AccelGen's metrics
need and the cluster's `SimResult` does not: the time of every token (iteration-level SLO
attainment counts each TTFT and each time-between-tokens) and, per step, the forward size S_f, the
token budget S_b and the KV blocks in use (GPU compute utilisation = S_f / S_b, KVC utilisation).

Same engine model as `sim.cluster` (one worker, no router): requests arriving during a step join
the next one, a step lasts `latency.step_s(batch)`, decode steps are never fused (AccelGen's
policy is consulted every step). Pure: no I/O, no wall time.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise

from splitserve.core.ids import RequestId
from splitserve.core.kv import BlockManager
from splitserve.core.perf import LatencyModel
from splitserve.core.request import SloClass
from splitserve.policy.batching.base import BatchingPolicy
from splitserve.policy.batching.engine import EngineModel, RequestMode
from splitserve.sim.entities import SimRequest
from splitserve.sim.workload import WorkItem


@dataclass(frozen=True, slots=True)
class StepRecord:
    start_s: float
    end_s: float
    forward_tokens: int
    """S_f: new tokens computed by the step."""
    budget_tokens: int
    """S_b: the policy's token budget for the step."""
    used_blocks: int
    """KV blocks allocated while the step runs."""


@dataclass(frozen=True, slots=True)
class EngineRun:
    items: tuple[WorkItem, ...]
    token_times: tuple[tuple[float, ...], ...]
    """Per item (same order), when each of its output tokens came out."""
    steps: tuple[StepRecord, ...]
    total_blocks: int
    num_preemptions: int

    @property
    def num_finished(self) -> int:
        return sum(
            1
            for it, ts in zip(self.items, self.token_times, strict=True)
            if len(ts) == it.num_output_tokens
        )

    @property
    def end_s(self) -> float:
        return self.steps[-1].end_s if self.steps else 0.0

    def iteration_attainment(self, slos: Mapping[str, SloClass]) -> float:
        """Share of iterations (first tokens and gaps between tokens) within their SLO; a token
        never produced counts as a miss."""
        met = total = 0
        for it, ts in zip(self.items, self.token_times, strict=True):
            slo = slos[it.slo_class]
            ttft, tbt = slo.ttft_ms / 1000.0, slo.tpot_ms / 1000.0
            total += it.num_output_tokens
            prev = it.arrival_s
            for i, t in enumerate(ts):
                if t - prev <= (ttft if i == 0 else tbt) + 1e-12:
                    met += 1
                prev = t
        return met / total if total else 1.0

    def good_requests(self, slos: Mapping[str, SloClass], tbt_share: float = 1.0) -> int:
        """Finished requests whose TTFT met its SLO and at least `tbt_share` of whose
        time-between-tokens met theirs."""
        good = 0
        for it, ts in zip(self.items, self.token_times, strict=True):
            if len(ts) != it.num_output_tokens:
                continue
            slo = slos[it.slo_class]
            if ts[0] - it.arrival_s > slo.ttft_ms / 1000.0:
                continue
            gaps = [b - a for a, b in pairwise(ts)]
            if gaps:
                ok = sum(1 for g in gaps if g <= slo.tpot_ms / 1000.0 + 1e-12)
                if ok < tbt_share * len(gaps):
                    continue
            good += 1
        return good

    def output_tokens(self) -> int:
        return sum(len(ts) for ts in self.token_times)

    def mean_jct_s(self) -> float:
        done = [
            ts[-1] - it.arrival_s
            for it, ts in zip(self.items, self.token_times, strict=True)
            if ts and len(ts) == it.num_output_tokens
        ]
        return sum(done) / len(done) if done else float("inf")

    def gpu_utilisation(self) -> float:
        """Mean over steps of S_f / S_b (the paper's GPU compute utilisation), capped at 1."""
        if not self.steps:
            return 0.0
        return sum(min(1.0, s.forward_tokens / s.budget_tokens) for s in self.steps) / len(
            self.steps
        )

    def share_steps_within(self, seconds: float) -> float:
        """Share of steps that took at most `seconds` (the paper's Fig. 3a/4a CDF at 0.1875 s)."""
        if not self.steps:
            return 1.0
        return sum(1 for s in self.steps if s.end_s - s.start_s <= seconds) / len(self.steps)

    def kv_utilisation(self) -> float:
        """Mean over steps of allocated / total KV (the paper's KVC utilisation)."""
        if not self.steps:
            return 0.0
        return sum(s.used_blocks for s in self.steps) / (len(self.steps) * self.total_blocks)


def run_engine(
    items: Sequence[WorkItem],
    policy: BatchingPolicy,
    latency: LatencyModel,
    num_blocks: int,
    block_size: int,
    budget_of: Callable[[], int],
) -> EngineRun:
    """Run `items` (in arrival order) to completion on one engine; `budget_of()` reads the
    policy's token budget for the step just decided."""
    engine = EngineModel(
        policy, BlockManager(num_blocks, block_size), tokens=None, kv_hold_timeout_s=float("inf")
    )
    index: dict[RequestId, int] = {}
    times: list[list[float]] = [[] for _ in items]
    steps: list[StepRecord] = []
    now, i, n = 0.0, 0, len(items)
    while True:
        while i < n and items[i].arrival_s <= now:
            req = SimRequest.from_item(i, items[i]).request
            index[req.id] = i
            engine.add(req, RequestMode.GENERATE)
            i += 1
        step = engine.schedule(now)
        if step is None:
            if i >= n:
                break
            now = max(now, items[i].arrival_s)
            continue
        end = now + latency.step_s(step.batch)
        used = num_blocks - engine.blocks.num_free
        steps.append(StepRecord(now, end, step.batch.num_new_tokens, budget_of(), used))
        result = engine.complete(step, end)
        for tok in result.tokens:
            times[index[tok.request_id]].append(end)
        now = end
    return EngineRun(
        tuple(items),
        tuple(tuple(t) for t in times),
        tuple(steps),
        num_blocks,
        engine.num_preemptions,
    )
