"""Simulator speed benchmark: replay the Azure conversation trace on a disaggregated cluster.

Owns: the benchmark scenario (OPT-13B on A100-80GB, half the workers prefill, half decode, FCFS
everywhere, trace at its recorded rate) and timing it on the wall clock: this module and the
runner are the only sim modules allowed I/O and wall time. The figure of merit is simulated
requests per wall-clock second on one core (issue 4 target: >= 20,000).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path

from splitserve.core.ids import PoolName
from splitserve.core.perf import HARDWARE, MODELS, RooflineModel
from splitserve.core.roles import Role
from splitserve.sim.cluster import ClusterSpec, simulate
from splitserve.sim.entities import PoolSpec, WorkerTemplate
from splitserve.sim.report import markdown_table
from splitserve.sim.workload import WorkItem, parse_azure_trace


@dataclass(frozen=True, slots=True)
class BenchReport:
    num_requests: int
    num_workers: int
    num_events: int
    wall_s: float
    cpu_s: float
    """CPU time of this process during the simulation (robust to other load on the machine)."""
    parse_s: float
    simulated_s: float
    num_finished: int

    @property
    def requests_per_s(self) -> float:
        return self.num_requests / self.wall_s

    @property
    def requests_per_cpu_s(self) -> float:
        return self.num_requests / self.cpu_s if self.cpu_s > 0 else float("inf")

    def markdown(self) -> str:
        headers = ["requests", "workers", "events", "simulated s", "wall s", "CPU s"]
        headers += ["requests / wall s", "requests / CPU s"]
        row: list[object] = [self.num_requests, self.num_workers, self.num_events]
        row += [self.simulated_s, self.wall_s, self.cpu_s]
        row += [self.requests_per_s, self.requests_per_cpu_s]
        return markdown_table(headers, [row])


def bench_cluster(num_workers: int) -> ClusterSpec:
    model = RooflineModel(MODELS["opt-13b"], HARDWARE["a100-80g"])
    template = WorkerTemplate(
        latency=model,
        num_blocks=model.kv_capacity_tokens(0.9) // 16,
        kv_layout=model.shape.kv_layout,
        policy_params={"max_num_batched_tokens": 4096},
    )
    p = max(1, num_workers // 2)
    return ClusterSpec(
        (
            PoolSpec(PoolName("prefill"), Role.PREFILL, p, template),
            PoolSpec(PoolName("decode"), Role.DECODE, max(1, num_workers - p), template),
        )
    )


def run_items(items: tuple[WorkItem, ...], num_workers: int = 16) -> BenchReport:
    spec = bench_cluster(num_workers)
    start, cpu = time.perf_counter(), time.process_time()
    result = simulate(spec, items)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    return BenchReport(
        num_requests=len(items),
        num_workers=spec.num_workers,
        num_events=result.num_events,
        wall_s=wall,
        cpu_s=cpu,
        parse_s=0.0,
        simulated_s=result.end_s,
        num_finished=result.num_finished,
    )


def run(trace: Path, num_workers: int = 16, max_requests: int | None = None) -> BenchReport:
    """Parse `trace` (timed separately) and replay it; wall time covers the simulation only."""
    start = time.perf_counter()
    with trace.open() as f:
        items = parse_azure_trace(f, max_requests=max_requests)
    parse_s = time.perf_counter() - start
    return replace(run_items(items, num_workers), parse_s=parse_s)
