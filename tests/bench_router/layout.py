"""Which process runs on which cores in `make bench-router`, and the run's wall-clock budget.

Pure (no I/O, no wall time: the budget takes its clock as an argument), so it is unit-tested.

Layout: the router under test (one process, or N processes of `router serve --processes N`, each
pinned to its own core: router core i for process i) and the peer router run on the *router
cores*; the load generator processes on the *load cores* (one process per core); the zero-delay
backends (splitserve sim workers, the peer's fake OpenAI servers) on the *worker cores* (one
process per core, round robin). On 2 cores the default is the historical one (router on core 0,
everything else on core 1); from 8 cores an automatic layout keeps the three sets disjoint.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field


def parse_cores(spec: str) -> tuple[int, ...]:
    """`"0"`, `"0-3"`, `"0,2,4-5"` -> sorted distinct core numbers; ValueError naming the spec."""
    cores: set[int] = set()
    for part in spec.split(","):
        part = part.strip()
        if not part:
            raise ValueError(f"core list {spec!r}: empty item")
        lo, sep, hi = part.partition("-")
        try:
            first, last = int(lo), int(hi) if sep else int(lo)
        except ValueError:
            raise ValueError(f"core list {spec!r}: {part!r} is not a core or a range") from None
        if first < 0 or last < first:
            raise ValueError(f"core list {spec!r}: bad range {part!r}")
        cores.update(range(first, last + 1))
    return tuple(sorted(cores))


def format_cores(cores: Iterable[int]) -> str:
    """The inverse of `parse_cores`, with ranges: (0, 1, 2, 5) -> "0-2,5"."""
    out: list[str] = []
    run: list[int] = []
    for c in sorted(set(cores)):
        if run and c != run[-1] + 1:
            out.append(_span(run))
            run = []
        run.append(c)
    if run:
        out.append(_span(run))
    return ",".join(out)


def _span(run: list[int]) -> str:
    return str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}"


@dataclass(frozen=True)
class Layout:
    router: tuple[int, ...]
    load: tuple[int, ...]
    worker: tuple[int, ...]
    auto: bool = False
    """Chosen by `make_layout` from the core count rather than given."""

    @property
    def overlaps(self) -> bool:
        """The router shares a core with the load generator or the backends (a lower bound)."""
        return bool(set(self.router) & (set(self.load) | set(self.worker)))

    def fits(self, processes: int) -> bool:
        """`processes` router processes get a core each."""
        return processes <= len(self.router)

    def router_core_of(self, index: int) -> int:
        """The core of router process `index` (pinned one process per core)."""
        return self.router[index % len(self.router)]

    def worker_core_of(self, index: int) -> int:
        return self.worker[index % len(self.worker)]

    def load_core_of(self, index: int) -> int:
        return self.load[index % len(self.load)]

    def describe(self) -> str:
        note = " (automatic)" if self.auto else ""
        shared = "; the router's cores are shared with other processes" if self.overlaps else ""
        return (
            f"router core(s) {format_cores(self.router)}, load generator core(s) "
            f"{format_cores(self.load)}, backend core(s) {format_cores(self.worker)}{note}{shared}"
        )


def auto_layout(cpus: Sequence[int], max_processes: int) -> Layout:
    """The layout when none is given, over the cores this process may use (`cpus`).

    Fewer than 8 cores: router on the first, everything else on the second (the 2-core layout
    the earlier runs used); more router processes than one get the first `max_processes` cores,
    shared with the rest (a lower bound, and the report says so). From 8: `max_processes`
    router cores (at most a quarter of the cores), then a sixth of the rest for the load
    generators and the remainder for the backends. Measured on the 2-core dev machine (c=32
    through one router process, 200-token prompts): the load generator costs ~0.08 ms of CPU
    per streamed request, the zero-delay sim workers ~1.7 ms (prefill) + ~2.5 ms (decode),
    about as much as the router itself, so the backends get most of the cores.
    """
    cpus = sorted(cpus)
    if len(cpus) < 2:
        raise ValueError("bench-router needs 2 cores (router on one, load on the other)")
    if len(cpus) < 8:
        router = tuple(cpus[: max(1, min(max_processes, len(cpus)))])
        return Layout(router, (cpus[1],), (cpus[1],), auto=True)
    n_router = max(1, min(max_processes, len(cpus) // 4))
    rest = cpus[n_router:]
    n_load = max(1, len(rest) // 6)
    return Layout(tuple(cpus[:n_router]), tuple(rest[:n_load]), tuple(rest[n_load:]), auto=True)


def make_layout(
    cpus: Sequence[int],
    max_processes: int,
    router: str | None = None,
    load: str | None = None,
    worker: str | None = None,
) -> Layout:
    """The given core lists (each defaults to the automatic layout's), checked against `cpus`:
    every core must be one this process may run on, and given router cores must number at
    least `max_processes` (one per process; else ValueError saying which). The automatic
    layout may have fewer router cores than `max_processes` (few cores): the caller measures
    only the process counts that fit (`Layout.fits`)."""
    base = auto_layout(cpus, max_processes)
    given = Layout(
        parse_cores(router) if router else base.router,
        parse_cores(load) if load else base.load,
        parse_cores(worker) if worker else base.worker,
        auto=not (router or load or worker),
    )
    allowed = set(cpus)
    for name, cores in (("--router-cores", given.router), ("--load-cores", given.load),
                        ("--worker-cores", given.worker)):  # fmt: skip
        missing = sorted(set(cores) - allowed)
        if missing:
            raise ValueError(f"{name}: core(s) {format_cores(missing)} not available here "
                             f"(this process may use {format_cores(allowed)})")  # fmt: skip
    if router and max_processes > len(given.router):
        raise ValueError(
            f"--router-cores {format_cores(given.router)}: {max_processes} router processes "
            f"need {max_processes} cores (one each)"
        )
    return given


@dataclass
class Budget:
    """A wall-clock cap for the whole run: parts run in priority order, and a part whose
    estimate does not fit in what is left is skipped and recorded (never silently)."""

    total_s: float | None
    clock: Callable[[], float]
    start_s: float = field(init=False)
    skipped: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.start_s = self.clock()

    def left_s(self) -> float:
        if self.total_s is None:
            return float("inf")
        return self.total_s - (self.clock() - self.start_s)

    def allows(self, part: str, estimate_s: float) -> bool:
        """True when `part` (estimated at `estimate_s`) fits; else records it as skipped."""
        if estimate_s <= self.left_s():
            return True
        left = max(0.0, self.left_s())
        self.skipped.append(f"{part} (needs ~{estimate_s:.0f} s, {left:.0f} s left)")
        return False


def backend_counts(layout: Layout, given: int | None = None) -> tuple[int, int]:
    """(prefill, decode) zero-delay workers: `given` decode workers and two thirds as many
    prefill ones (rounded, at least one) when given; else one process per backend core, 40 %
    of them prefill (their measured CPU per request: prefill ~1.7 ms, decode ~2.5 ms). At
    least one of each."""
    if given is not None:
        if given < 1:
            raise ValueError("--backends must be >= 1")
        return max(1, round(given * 2 / 3)), given
    total = len(layout.worker)
    prefill = max(1, round(total * 0.4))
    return prefill, max(1, total - prefill)
