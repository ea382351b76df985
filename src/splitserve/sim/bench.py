"""Simulator speed benchmark: replay the Azure conversation trace on a disaggregated cluster.

Owns: the benchmark scenario (OPT-13B on A100-80GB, half the workers prefill, half decode, FCFS
everywhere, trace at its recorded rate) and timing it: this module and the runner are the only
sim modules allowed I/O and wall time. The figure of merit is simulated requests per second on one
core (issue 4 target: >= 20,000); CPU time (`time.process_time`) is reported beside wall time
because the development machine is shared.

Also owns the list of modules the optional compiled build compiles (`COMPILED_MODULES`, read by
`make sim-compiled`, see mk/bench.mk) and says which build a run used (`build_kind`): the same
sources compiled with mypyc into build/mypyc, imported ahead of src/ via PYTHONPATH. The dev tree
and the tests stay pure Python.

`python -m splitserve.sim.bench --report-interval 0 --report-interval 0.1` prints one row per
router mode (exact state at every arrival, or load reports every 0.1 s as the live workers push
them); `splitserve sim bench` runs the exact mode.
"""

from __future__ import annotations

import argparse
import importlib
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from splitserve.core.ids import PoolName
from splitserve.core.perf import HARDWARE, MODELS, RooflineModel
from splitserve.core.roles import Role
from splitserve.sim.cluster import ClusterSpec, simulate
from splitserve.sim.entities import PoolSpec, WorkerTemplate
from splitserve.sim.report import markdown_table
from splitserve.sim.traces import bundled_trace
from splitserve.sim.workload import WorkItem, parse_azure_trace

COMPILED_MODULES: tuple[str, ...] = (
    "splitserve.core.clock",
    "splitserve.core.kv",
    "splitserve.core.perf.protocol",
    "splitserve.core.perf.roofline",
    "splitserve.core.request",
    "splitserve.policy.batching.base",
    "splitserve.policy.batching.engine",
    "splitserve.policy.batching.fcfs",
    "splitserve.policy.placement.base",
    "splitserve.policy.placement.decider",
    "splitserve.policy.placement.profile",
    "splitserve.sim.cluster",
    "splitserve.sim.engine",
    "splitserve.sim.entities",
    "splitserve.sim.events",
    "splitserve.sim.metrics",
)
"""The hot pure modules `make sim-compiled` compiles with mypyc (one shared native library).

Left out: `policy.placement.{filters,scorers,pickers}` (mypyc turns their `kind: ClassVar[str]`
into a dataclass field: "attribute 'kind' is read-only"; `Profile.rank` inlines the built-in
ones anyway), and everything that is not on the replay's per-event path."""

_BUILDS = {0: "pure Python", len(COMPILED_MODULES): "mypyc"}


def compiled_modules() -> list[str]:
    """Which of `COMPILED_MODULES` this process imported from extension modules."""
    out = []
    for name in COMPILED_MODULES:
        origin = getattr(importlib.import_module(name), "__file__", None) or ""
        if not origin.endswith(".py"):
            out.append(name)
    return out


def build_kind() -> str:
    """ "pure Python", "mypyc" (every module of `COMPILED_MODULES` compiled), or "partial"."""
    return _BUILDS.get(len(compiled_modules()), "partial")


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
    report_interval_s: float = 0.0
    """The router's load reports: 0 = exact worker state at every arrival (the default)."""
    build: str = "pure Python"
    """`build_kind()` of the process that ran it."""

    @property
    def requests_per_s(self) -> float:
        return self.num_requests / self.wall_s if self.wall_s > 0 else float("inf")

    @property
    def requests_per_cpu_s(self) -> float:
        return self.num_requests / self.cpu_s if self.cpu_s > 0 else float("inf")

    @property
    def router_mode(self) -> str:
        if self.report_interval_s <= 0:
            return "exact"
        return f"reports every {self.report_interval_s:g} s"

    def row(self) -> list[object]:
        row: list[object] = [self.build, self.router_mode, self.num_requests, self.num_workers]
        row += [self.num_events, f"{self.simulated_s:.0f}", f"{self.wall_s:.3f}"]
        row += [
            f"{self.cpu_s:.3f}",
            f"{self.requests_per_s:,.0f}",
            f"{self.requests_per_cpu_s:,.0f}",
        ]
        return row

    def markdown(self) -> str:
        return markdown_table(HEADERS, [self.row()])


HEADERS = ["build", "router input", "requests", "workers", "events", "simulated s", "wall s"]
HEADERS += ["CPU s", "requests / wall s", "requests / CPU s"]


def bench_cluster(num_workers: int, report_interval_s: float = 0.0) -> ClusterSpec:
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
        ),
        load_report_interval_s=report_interval_s,
    )


def run_items(
    items: tuple[WorkItem, ...], num_workers: int = 16, report_interval_s: float = 0.0
) -> BenchReport:
    spec = bench_cluster(num_workers, report_interval_s)
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
        report_interval_s=report_interval_s,
        build=build_kind(),
    )


def load_trace(trace: Path, max_requests: int | None = None) -> tuple[tuple[WorkItem, ...], float]:
    """The trace's work items and the wall seconds parsing took."""
    start = time.perf_counter()
    with trace.open() as f:
        items = parse_azure_trace(f, max_requests=max_requests)
    return items, time.perf_counter() - start


def run(
    trace: Path,
    num_workers: int = 16,
    max_requests: int | None = None,
    report_interval_s: float = 0.0,
) -> BenchReport:
    """Parse `trace` (timed separately) and replay it; wall time covers the simulation only."""
    items, parse_s = load_trace(trace, max_requests)
    return replace(run_items(items, num_workers, report_interval_s), parse_s=parse_s)


def run_suite(
    trace: Path,
    num_workers: int = 16,
    max_requests: int | None = None,
    report_intervals_s: Sequence[float] = (0.0,),
    repeat: int = 1,
) -> list[BenchReport]:
    """Each router mode `repeat` times, interleaved (mode A, mode B, mode A, ...), one parse."""
    items, parse_s = load_trace(trace, max_requests)
    return suite_items(items, parse_s, num_workers, report_intervals_s, repeat)


def suite_items(
    items: tuple[WorkItem, ...],
    parse_s: float,
    num_workers: int = 16,
    report_intervals_s: Sequence[float] = (0.0,),
    repeat: int = 1,
) -> list[BenchReport]:
    """`run_suite` on items already parsed (in `parse_s` seconds)."""
    return [
        replace(run_items(items, num_workers, interval), parse_s=parse_s)
        for _ in range(repeat)
        for interval in report_intervals_s
    ]


def bundled_conv_trace() -> Path:
    """The Azure LLM inference 2023 conversation trace shipped with the package."""
    return bundled_trace("conv")


def _int_in(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse type: an integer in [low, high] (a value outside was clamped or ignored)."""

    def convert(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < low or (high is not None and value > high):
            bounds = f"{low} to {high}" if high is not None else f">= {low}"
            raise argparse.ArgumentTypeError(f"{value} is not in the range {bounds}")
        return value

    return convert


def _seconds(text: str) -> float:
    """An argparse type: a finite number of seconds >= 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number >= 0")
    return value


def main(argv: Sequence[str] | None = None) -> None:
    """`make bench`'s command line; a bad option is a one-line usage error (exit 2) naming it,
    as in `splitserve sim bench` (they were clamped, ignored or a traceback)."""
    parser = argparse.ArgumentParser(prog="python -m splitserve.sim.bench", description=__doc__)
    parser.add_argument("--trace", type=Path, default=None, help="default: bundled conv trace")
    parser.add_argument(
        "--workers", type=_int_in(2, 10_000), default=16, help="2 to 10000 (half prefill)"
    )
    parser.add_argument("--max-requests", type=_int_in(1), default=None)
    parser.add_argument(
        "--report-interval",
        type=_seconds,
        action="append",
        default=None,
        help="router load-report interval in s (0 = exact); repeat for several rows",
    )
    parser.add_argument("--repeat", type=_int_in(1), default=1, help="runs per mode, interleaved")
    parser.add_argument(
        "--print-modules",
        action="store_true",
        help="print the source paths of COMPILED_MODULES (for the mypyc build) and exit",
    )
    args = parser.parse_args(argv)
    if args.print_modules:
        print(" ".join(name.replace(".", "/") + ".py" for name in COMPILED_MODULES))
        return
    trace = args.trace if args.trace is not None else bundled_conv_trace()
    try:
        items, parse_s = load_trace(trace, args.max_requests)
    except (OSError, ValueError, UnicodeDecodeError) as err:
        parser.error(f"argument --trace: {trace}: {err}")
    if not items:
        parser.error(f"argument --trace: {trace}: no requests (every row has a zero length)")
    reports = suite_items(
        items,
        parse_s,
        args.workers,
        args.report_interval if args.report_interval else (0.0,),
        args.repeat,
    )
    print(markdown_table(HEADERS, [r.row() for r in reports]), end="")


if __name__ == "__main__":
    main()
