"""What every paper reproduction shares: the ±25 % band, a paper-vs-ours `Comparison`, one
system's searched goodput (`SystemResult`) and the `Reproduction` a paper's run returns.

Pure: the runner prints a `Reproduction` and writes its plots.
"""

from __future__ import annotations

import copyreg
import ctypes
import dataclasses
import math
import multiprocessing
import signal
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Executor, ProcessPoolExecutor
from contextlib import contextmanager, suppress
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

from splitserve.core.perf import (
    HARDWARE,
    DistServeModel,
    LatencyModel,
    RescaledModel,
    RooflineModel,
)
from splitserve.core.perf.kvlink import kv_link
from splitserve.sim.metrics import Goodput
from splitserve.sim.report import fmt, markdown_table

LATENCY_SOURCES = ("roofline", "gpu")
"""How a reproduction prices steps: `roofline` (analytical, the hardware preset's figures) or
`gpu` (the nearest model built from published GPU measurements, `core.perf.catalog`; each
paper's notes say which)."""

_LATENCY: ContextVar[str] = ContextVar("reproduction_latency", default="roofline")


@contextmanager
def latency_source(name: str) -> Iterator[None]:
    """Run the reproductions inside with `name`'s latency models (context-local, not global)."""
    if name not in LATENCY_SOURCES:
        raise ValueError(f"unknown latency source {name!r}; valid: {', '.join(LATENCY_SOURCES)}")
    token = _LATENCY.set(name)
    try:
        yield
    finally:
        _LATENCY.reset(token)


def use_gpu_models() -> bool:
    """True inside `latency_source("gpu")`."""
    return _LATENCY.get() == "gpu"


_POOL: ContextVar[Executor | None] = ContextVar("reproduction_pool", default=None)
_T = TypeVar("_T")


@contextmanager
def parallel(jobs: int) -> Iterator[None]:
    """Run the independent units (`parallel_map`) of the reproductions inside in `jobs` worker
    processes (1: in this process). Each unit is a deterministic function of its arguments
    (its own seeded generators), so the results are the same for every `jobs`; only the
    order in which units finish differs, and `parallel_map` returns them in call order.
    Workers are spawned, not forked: a fresh interpreter imports the package, so nothing of
    this process's state (threads, numpy's pools) is copied half-way."""
    if jobs < 1:
        raise ValueError(f"jobs must be at least 1, got {jobs}")
    if jobs == 1:
        token = _POOL.set(None)
        try:
            yield
        finally:
            _POOL.reset(token)
        return
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx, initializer=_worker_init) as pool:
        token = _POOL.set(pool)
        try:
            yield
        except BaseException:
            # Ctrl-C (or any error): the pool's exit would wait for every submitted unit to run
            # (minutes, nothing printed); drop the queued ones and stop the running ones
            running = list((getattr(pool, "_processes", None) or {}).values())
            pool.shutdown(wait=False, cancel_futures=True)
            for process in running:
                process.terminate()
            raise
        finally:
            _POOL.reset(token)


def _worker_init() -> None:
    """Workers leave a terminal's Ctrl-C (sent to the whole process group) to the parent, which
    stops them (each printed its own KeyboardInterrupt traceback), and get SIGTERM when the
    parent dies however it died (Linux): a `kill` of the parent left them running as orphans."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform == "linux":
        with suppress(OSError):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


_PR_SET_PDEATHSIG: Final = 1


def _rebuild(cls: type[_T], kwargs: dict[str, object]) -> _T:
    """A dataclass instance from its init fields (the reducer `_picklable` registers)."""
    return cls(**kwargs)


def _reduce_dataclass(obj: Any) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    init = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj) if f.init}
    return (_rebuild, (type(obj), init))


def _picklable(obj: object, seen: set[int] | None = None) -> None:
    """Register a constructor-based pickle reducer for every dataclass type reachable from
    `obj`. The simulator's hot classes are frozen dataclasses that the optional mypyc build
    compiles (`make sim-compiled`); a compiled frozen dataclass has no `__dict__`, so pickle's
    default restores it with `setattr`, which the frozen class refuses. Rebuilding through
    the constructor works for both builds and gives equal objects."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        if type(obj) not in copyreg.dispatch_table:
            copyreg.pickle(type(obj), _reduce_dataclass)
        for f in dataclasses.fields(obj):
            _picklable(getattr(obj, f.name), seen)
    elif isinstance(obj, (tuple, list, set, frozenset)):
        for item in obj:
            _picklable(item, seen)
    elif isinstance(obj, dict):
        for key, value in obj.items():
            _picklable(key, seen)
            _picklable(value, seen)


def _unit(latency: str, fn: Callable[..., _T], args: tuple[object, ...]) -> _T:
    """One unit in a worker: the caller's latency source is set again there (context
    variables do not cross processes)."""
    with latency_source(latency):
        result = fn(*args)
    _picklable(result)
    return result


def parallel_map(fn: Callable[..., _T], calls: Sequence[tuple[object, ...]]) -> list[_T]:
    """`[fn(*args) for args in calls]`, the calls spread over the worker processes of the
    enclosing `parallel(jobs)` (in this process outside one). `fn` must be a module-level
    function and its arguments picklable. All calls are submitted at once, so the longest
    units start first only if the caller lists them first."""
    pool = _POOL.get()
    if pool is None:
        return [fn(*args) for args in calls]
    latency = _LATENCY.get()
    _picklable(list(calls))
    futures = [pool.submit(_unit, latency, fn, args) for args in calls]
    return [f.result() for f in futures]


FIT_HARDWARE = "a100-80g"
"""The GPU DistServe's published fits were measured on."""


def gpu_or(
    roofline: RooflineModel, model: str = "opt-13b", tp: int = 1, engine: str = "vllm"
) -> LatencyModel:
    """`roofline`, or inside `latency_source("gpu")` the nearest GPU-measured model for an OPT
    set-up: DistServe's published fit of vLLM on A100-80GB for `model` at `tp` (KV over NVLink,
    Vidur's A100 send/recv). Where the paper's GPU (`roofline.hardware`) is another one, the fit
    is carried to it by the roofline's per-shape ratio (`RescaledModel`): the measured engine on
    the paper's GPU, not an A100 standing in for it. Papers say which in their notes.

    The part of each step the A100's roofline does not explain at the smallest step
    (`RescaledModel.fixed_overhead`) is held as measured rather than scaled with the GPU: it is
    the engine's per-step work off the GPU. Measured in the fits themselves: vLLM's residual
    grows with TP (OPT-13B TP 1/2/4: ≈ 5 / 15 / 25 ms) while the GPU's share of the step
    halves, the signature of the 2023 vLLM's per-step Python scheduling and Ray RPC to its TP
    workers, which a V100 or an A100-40GB would not make 2× or 1.3× slower (scaling it did
    until this revision: a V100 TP 2 decode of 16 × 600 tokens cost 58 ms, now 42 ms).

    `engine` picks which of DistServe's published engines: "vllm" (vLLM v0.2 as DistServe
    measured it, the default: most papers' baselines and engines are vLLM) or "distserve"
    (DistServe's own engine, for a paper whose system is its own research engine rather than
    vLLM; the paper's module says why)."""
    if not use_gpu_models():
        return roofline
    fit = DistServeModel(engine, model, tp, kv_link("nvlink-a100"))
    if roofline.hardware.name == FIT_HARDWARE:
        return fit
    source = RooflineModel(roofline.shape, HARDWARE[FIT_HARDWARE], tp=roofline.tp)
    return RescaledModel(fit, source, roofline, RescaledModel.fixed_overhead(fit, source))


def pricing() -> str:
    """How steps are priced in this context, for set-up notes."""
    return "GPU-measured model, see the latency note" if use_gpu_models() else "roofline"


def latency_note(gpu_text: str) -> tuple[str, ...]:
    """The note naming the latency model used, for a reproduction's notes (empty: roofline)."""
    return (f"Latency (--latency gpu): {gpu_text}",) if use_gpu_models() else ()


BAND = 0.25
"""A reproduced number counts as matching when within ±25 % of the paper's."""


UNITS = ("", "num", "%", "−%", "pct", "×")
"""How `Comparison.ours` is printed, so that it reads in the unit of `paper_text`:
`num` a plain number (3 significant figures, as `paper_text`'s leading number); `%` a fraction
printed as a percentage (0.969 -> 96.9 %); `−%` a reduction given as a fraction, printed as the
signed change (0.689 -> −68.9 %, -2.31 -> +231 %); `pct` a number already in percent (or points)
printed with %; `×` a ratio printed with ×. `""` (unset) prints a plain number and is refused
when `paper_text` shows a % or × (the row would print "65.49%" beside "0.969")."""


def _sig(value: float) -> str:
    return f"{value:.3g}" if abs(value) < 1e4 else f"{value:,.0f}"


@dataclass(frozen=True, slots=True)
class Comparison:
    name: str
    paper: float
    ours: float
    paper_text: str
    """The paper's claim as stated (ranges stay ranges)."""
    paper_low: float
    paper_high: float
    unit: str = ""
    """How `ours` is printed (`UNITS`); the band compares the raw numbers either way."""

    def __post_init__(self) -> None:
        if self.unit not in UNITS:
            raise ValueError(f"{self.name}: unit {self.unit!r} is not one of {UNITS}")
        if not self.unit and ("%" in self.paper_text or "×" in self.paper_text):
            raise ValueError(
                f"{self.name}: the paper's {self.paper_text!r} has a unit; say which `unit` "
                "`ours` is printed in"
            )

    @property
    def within_band(self) -> bool:
        return self.paper_low * (1 - BAND) <= self.ours <= self.paper_high * (1 + BAND)

    @property
    def ours_text(self) -> str:
        """`ours` in the unit of `paper_text` (`unit`)."""
        v = self.ours
        if math.isnan(v):
            return "-"
        if self.unit == "%":
            return f"{_sig(100 * v)} %"
        if self.unit == "−%":
            change = -100 * v
            return ("+" if change > 0 else "−" if change < 0 else "") + f"{_sig(abs(change))} %"
        if self.unit == "pct":
            return f"{_sig(v)} %"
        if self.unit == "×":
            return f"{_sig(v)}×"
        return fmt(v)


@dataclass(frozen=True, slots=True)
class SystemResult:
    name: str
    num_gpus: int
    goodput: Goodput

    @property
    def per_gpu(self) -> float:
        return self.goodput.rate_per_s / self.num_gpus


@dataclass(frozen=True, slots=True)
class Reproduction:
    paper: str
    comparisons: tuple[Comparison, ...]
    systems: Mapping[str, tuple[SystemResult, ...]]
    """Per workload: every system searched, in search order."""
    notes: tuple[str, ...] = field(default=())

    def markdown(self) -> str:
        rows = [
            [c.name, c.paper_text, c.ours_text, "yes" if c.within_band else "no"]
            for c in self.comparisons
        ]
        out = [f"## {self.paper}: paper vs ours\n\n"]
        out.append(markdown_table(["comparison", "paper", "ours", "within ±25 %"], rows))
        for workload, systems in self.systems.items():
            out.append(f"\n### {workload}: goodput at the attainment target\n\n")
            out.append(
                markdown_table(
                    ["system", "GPUs", "goodput req/s", "per GPU req/s", "probes"],
                    [
                        [s.name, s.num_gpus, s.goodput.rate_per_s, s.per_gpu, len(s.goodput.probes)]
                        for s in systems
                    ],
                )
            )
        if self.notes:
            out.append("\n" + "\n".join(f"- {n}" for n in self.notes) + "\n")
        return "".join(out)

    def curves(self, workload: str) -> dict[str, list[tuple[float, float]]]:
        """(rate per GPU, attainment) probes per system, for plotting."""
        return {
            s.name: [(r / s.num_gpus, a) for r, a in s.goodput.probes]
            for s in self.systems[workload]
        }
