"""Fidelity against the run's own steps: price a replay as the recorded workers ran their steps.

Owns: the worker step log of a recorded run (`parse_steps_csv`: the CSV `tools/record_run.py
--steps-out` writes from each worker's `WatchSteps` stream, `core.perf.samples.STEP_COLUMNS`),
the latency model fitted to those steps (`RunModel`), each worker's speed over the run relative
to that model (`run_speed`), and the calibrated cluster (`calibrate`).

Why: on a shared machine a worker's step times change by multiples within one run, so a profile
taken at another moment (or a probe beside the workers, `sim.speed`) prices the replay at the
wrong speed (docs/simulator.md, "Validation on the development machine"). The run's own steps
say how long each step took while the run ran. Replaying with them separates the simulator's
scheduling fidelity (which steps form, in which order, how requests queue) from the machine's
speed: what is left is what the simulator does differently from the live system, plus the
costs outside engine steps (router, RPCs, KV hand-off), not the speed of the machine.

The model: DistServe's reduced forms (`core.perf.fit.features`) fitted by non-negative least
squares to every step a pool's workers ran, each step divided by that worker's speed factor at
its start; the factor at a time is the median of measured / modelled over the `nearest` steps
that started closest to it (a fixed time window would lag an abrupt change: the slow side has
fewer steps per second), normalised to a median of 1 over the steps, so the model carries the
run's typical speed and the factor its changes. Fit and factor
alternate `rounds` times. The replay's steps are then priced by the model times a factor with
`price_nearest` steps (default 1: the ratio of the recorded step that started nearest, so a
stall of the run lands on the replay's step at the same moment). Columns no step exercises (a
decode worker never prefills) get 0, and a shape the fit prices at 0 or less falls back to the
cluster's own model.

Approximation, stated: the factor is per worker and per moment, not per shape, so a slowdown
that hit prefills and decodes differently is averaged; the step times are `engine.step()` as
the worker measured it, plus (with `gaps`) the time to the next step when that step carries on
one of its sequences (`with_busy_gaps`); costs outside the worker's steps (router, RPCs, the
KV hand-off in P/D) are not in them.

The P/D hand-off (`Handoffs`, from the decode workers' `kv_pulls.jsonl`,
`worker.kv_pull_log`): per request, the router's first token to its `Decode` reaching the decode
worker (the router's second RPC) plus the engine's KV pull (for vLLM: admission to the step that
lists the KV received). The decode pool's model then prices each request's KV transfer as that
request's measured hand-off (`RunModel.transfers`, by the bytes of its prompt; the median
hand-off for a size no request had), instead of the link, and the replay runs such transfers
side by side (`validate.SideBySideTransfers`: the run did its pulls at once, and each measured
hand-off already holds what they cost each other; queued on the link, an overlap would count
twice). Approximations, stated: the simulator starts a transfer at the decode engine's next step
boundary and a vLLM pull ends at one, so the wait for the step in flight can count twice; the
time from the `Decode`'s arrival to the pull's start (the engine thread taking the command) is
left to the simulator's step boundary and not charged.
Pure: lines in, values out.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from splitserve.core.perf.fit import COEFF_NAMES, features
from splitserve.core.perf.protocol import BatchShape, LatencyModel
from splitserve.core.perf.samples import STEP_COLUMNS
from splitserve.core.roles import Role
from splitserve.sim.cluster import ClusterSpec, KvOverlap
from splitserve.sim.speed import SpeedFactor

FIRST = ("prefill", "mixed")
"""Roles whose workers run a request's prompt (where its first token comes from)."""
PRICE_NEAREST = 1
"""The factor that prices the replay's steps: by default the ratio of the recorded step that
started nearest the replayed step's start (so the run's short stalls land where they happened),
not a smoothed one."""
NEAREST = 21
"""The speed factor for the fit: median over this many steps starting nearest to it (a window
that is short where steps are dense, a busy decode, and long where they are sparse)."""
ROUNDS = 3
"""Fit and speed factor alternate this many times."""


@dataclass(frozen=True, slots=True)
class RunStep:
    """One step a worker ran during the recorded run."""

    start_s: float
    """On the worker's monotonic clock (the router log's clock on one machine)."""
    duration_s: float
    batch: BatchShape


def parse_steps_csv(lines: Iterable[str]) -> tuple[RunStep, ...]:
    """A worker's steps (`STEP_COLUMNS`; header required), sorted by start. Steps with no
    token or no time (the simulated engine reports its KV admissions so) are left out."""
    rows = [ln.rstrip("\n") for ln in lines if ln.strip()]
    if not rows or rows[0].split(",") != list(STEP_COLUMNS):
        raise ValueError(f"a steps CSV starts with the header {','.join(STEP_COLUMNS)}")
    out: list[RunStep] = []
    for number, line in enumerate(rows[1:], 2):
        parts = line.split(",")
        if len(parts) != len(STEP_COLUMNS):
            raise ValueError(f"steps line {number}: want {len(STEP_COLUMNS)} columns")
        try:
            start, duration = float(parts[1]), float(parts[2])
            chunks = tuple(
                (int(n), int(ctx)) for n, ctx in (c.split(":") for c in parts[7].split(";") if c)
            )
            contexts = tuple(int(c) for c in parts[8].split(";") if c)
        except ValueError as err:
            raise ValueError(f"steps line {number}: {err}") from None
        batch = BatchShape(chunks, contexts)
        if not math.isfinite(start) or not math.isfinite(duration) or duration < 0:
            raise ValueError(f"steps line {number}: start and a duration >= 0 must be numbers")
        if batch.is_empty or duration == 0:
            continue  # no engine work (the simulated engine's KV admission): nothing to price
        out.append(RunStep(start, duration, batch))
    if not out:
        raise ValueError("the steps CSV holds no step")
    out.sort(key=lambda s: s.start_s)
    return tuple(out)


def continues(step: BatchShape, nxt: BatchShape) -> bool:
    """Does `nxt` carry on a sequence `step` ran (a decode one token further, or a prefill's
    next chunk or first decode)? Then the worker had work between the two steps."""
    after = {c + 1 for c in step.decode_contexts} | {ctx + n for n, ctx in step.prefill_chunks}
    return any(c in after for c in nxt.decode_contexts) or any(
        ctx in after for _, ctx in nxt.prefill_chunks
    )


def with_busy_gaps(steps: Sequence[RunStep]) -> tuple[RunStep, ...]:
    """Each step's duration extended to the next step's start when the next step carries on
    one of its sequences: the worker's time between steps while it had work (the engine
    thread's command handling and output hand-off, outside `engine.step()`), which the
    simulator has no other place for. Idle gaps (nothing carried on) are left out."""
    out = []
    for step, nxt in itertools.zip_longest(steps, steps[1:]):
        assert step is not None
        gap = nxt.start_s - step.start_s - step.duration_s if nxt is not None else 0.0
        if nxt is not None and gap > 0 and continues(step.batch, nxt.batch):
            step = RunStep(step.start_s, step.duration_s + gap, step.batch)
        out.append(step)
    return tuple(out)


@dataclass(frozen=True, slots=True)
class RunModel:
    """Step time = Σ coefficient × `features(batch)`, fitted to a run's steps."""

    coeffs: tuple[float, ...]
    """In `COEFF_NAMES` order, all >= 0."""
    prior: LatencyModel
    """Prices KV transfers (unless `transfers`), and any shape the coefficients price at 0
    (never seen in the run)."""
    transfers: tuple[tuple[int, float], ...] = ()
    """(KV bytes, seconds) ascending by bytes, one per size: the run's measured hand-off of a
    request with that many bytes (`Handoffs.table`); empty: the prior's link prices them."""

    @property
    def ready(self) -> bool:
        return True

    def raw_s(self, batch: BatchShape) -> float:
        return sum(c * f for c, f in zip(self.coeffs, features(batch), strict=True))

    def step_s(self, batch: BatchShape) -> float:
        if batch.is_empty:
            return 0.0
        value = self.raw_s(batch)
        return value if value > 0 else self.prior.step_s(batch)

    def kv_transfer_s(self, num_bytes: int) -> float:
        """The measured hand-off of the request with these bytes; a size the run had none of:
        the median hand-off; without `transfers`: the prior's link."""
        table = self.transfers
        if not table:
            return self.prior.kv_transfer_s(num_bytes)
        i = bisect.bisect_left(table, (num_bytes, -math.inf))
        if i < len(table) and table[i][0] == num_bytes:
            return table[i][1]
        return float(np.median([sec for _, sec in table]))


def nnls(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """argmin ||x·c − y|| over c >= 0, by trying every set of free columns (six at most)."""
    cols = x.shape[1]
    best = np.zeros(cols)
    best_err = float(np.sum(y * y))
    for k in range(1, cols + 1):
        for free in itertools.combinations(range(cols), k):
            sol, *_ = np.linalg.lstsq(x[:, free], y, rcond=None)
            if np.any(sol < 0):
                continue
            err = float(np.sum((x[:, free] @ sol - y) ** 2))
            if err < best_err - 1e-15 * max(1.0, best_err):
                best_err = err
                best = np.zeros(cols)
                best[list(free)] = sol
    return best


def fit_steps(steps: Sequence[RunStep], weights: Sequence[float], prior: LatencyModel) -> RunModel:
    """NNLS of duration / weight on the features (columns no step exercises stay 0); relative
    error is what is minimised (rows scaled by 1 / target), so short decodes count as much as
    long prefills."""
    x = np.array([features(s.batch) for s in steps], dtype=float)
    y = np.array([s.duration_s / w for s, w in zip(steps, weights, strict=True)], dtype=float)
    scale = np.abs(x).max(axis=0)
    scale[scale == 0] = 1.0
    xs = x / scale / y[:, None]
    coeffs = nnls(xs, np.ones_like(y)) / scale
    return RunModel(tuple(float(c) for c in coeffs), prior)


@dataclass(frozen=True, slots=True)
class RunSpeed:
    """A worker's speed over the run: measured / modelled step time, smoothed over time."""

    times_s: tuple[float, ...]
    """Step starts (ascending)."""
    ratios: tuple[float, ...]
    """Each step's measured / modelled time."""
    nearest: int = NEAREST

    def factor(self, t_s: float) -> float:
        """The median ratio of the `nearest` steps starting closest to `t_s` (for 1: the
        recorded step whose start is nearest, the one a replayed step starting then matches)."""
        times, n = self.times_s, len(self.times_s)
        lo = hi = bisect.bisect_left(times, t_s)
        while hi - lo < min(self.nearest, n):  # widen toward the closer neighbour
            if lo == 0 or (hi < n and times[hi] - t_s < t_s - times[lo - 1]):
                hi += 1
            else:
                lo -= 1
        return float(np.median(self.ratios[lo:hi]))

    def step_function(self, origin_s: float, end_s: float, bin_s: float = 0.002) -> SpeedFactor:
        """The factor on simulated time (`origin_s` on the run's clock is 0) up to `end_s` on
        the run's clock (the last bin holds beyond)."""
        n = max(1, int((max(end_s, self.times_s[-1]) - origin_s) / bin_s) + 2)
        return SpeedFactor(
            bin_s, tuple(self.factor(origin_s + (i + 0.5) * bin_s) for i in range(n))
        )


def run_speed(steps: Sequence[RunStep], model: RunModel, nearest: int = NEAREST) -> RunSpeed:
    return RunSpeed(
        tuple(s.start_s for s in steps),
        tuple(s.duration_s / model.step_s(s.batch) for s in steps),
        nearest,
    )


@dataclass(frozen=True, slots=True)
class PoolFit:
    """What `calibrate` made of one pool's steps."""

    pool: str
    workers: tuple[str, ...]
    steps: int
    model: RunModel
    speeds: tuple[RunSpeed, ...]
    """One per worker (in `workers` order)."""
    mape_model: float
    """Mean |modelled − measured| / measured over the steps, the model alone."""
    mape_timed: float
    """The same with each step's speed factor."""

    def factor_quantiles(self) -> tuple[float, float, float]:
        """p10 / p50 / p90 of the speed factor at the steps' starts."""
        values = [sp.factor(t) for sp in self.speeds for t in sp.times_s]
        q = np.percentile(values, [10, 50, 90])
        return float(q[0]), float(q[1]), float(q[2])


def fit_pool(
    pool: str,
    worker_steps: Mapping[str, Sequence[RunStep]],
    prior: LatencyModel,
    nearest: int = NEAREST,
    rounds: int = ROUNDS,
) -> PoolFit:
    """Fit one model to all of a pool's workers' steps, each worker with its own speed."""
    names = tuple(sorted(worker_steps))
    flat = [(name, s) for name in names for s in worker_steps[name]]
    if not flat:
        raise ValueError(f"pool {pool!r}: no steps recorded")
    steps = [s for _, s in flat]
    weights = [1.0] * len(flat)
    model = fit_steps(steps, weights, prior)
    speeds: dict[str, RunSpeed] = {}
    for _ in range(max(1, rounds)):
        speeds = {n: run_speed(worker_steps[n], model, nearest) for n in names}
        at = [speeds[n].factor(s.start_s) for n, s in flat]
        norm = float(np.median(at))
        weights = [w / norm for w in at]
        model = fit_steps(steps, weights, prior)
    speeds = {n: run_speed(worker_steps[n], model, nearest) for n in names}
    modelled = [model.step_s(s.batch) for s in steps]
    timed = [m * speeds[n].factor(s.start_s) for m, (n, s) in zip(modelled, flat, strict=True)]
    return PoolFit(
        pool,
        names,
        len(steps),
        model,
        tuple(speeds[n] for n in names),
        _mape(modelled, steps),
        _mape(timed, steps),
    )


def _mape(pred: Sequence[float], steps: Sequence[RunStep]) -> float:
    return float(
        np.mean([abs(p - s.duration_s) / s.duration_s for p, s in zip(pred, steps, strict=True)])
    )


def _speed_product(parts: Sequence[SpeedFactor]) -> SpeedFactor:
    """Workers of one pool share a pool-level factor: their median per bin."""
    if len(parts) == 1:
        return parts[0]
    n = max(len(p.values) for p in parts)
    values = tuple(
        float(np.median([p.values[min(i, len(p.values) - 1)] for p in parts])) for i in range(n)
    )
    return SpeedFactor(parts[0].bin_s, values)


@dataclass(frozen=True, slots=True)
class RequestOverheads:
    """The live system's time per request outside the worker's steps, measured by matching
    each recorded request to the step that ran its whole prompt (a chunk of exactly its prompt
    length at context 0, the first such step starting after its arrival) on a first-stage
    worker (prefill or mixed)."""

    dispatch_s: tuple[float, ...]
    """Router arrival to that step's start, for requests that arrived at an idle worker (no
    step in progress, so no queueing in it): the router's work and the RPC to the worker."""
    return_s: tuple[float, ...]
    """That step's end to the router's first token (every matched request): vLLM's output
    hand-off, the RPC back, the router."""
    unmatched: int
    first_dispatch_s: float | None = None
    """The dispatch of the run's first request (None: it did not reach an idle worker or was
    not matched). On the vLLM runs it is 16-31 ms against a 3.1-3.8 ms median, in every run:
    the router's and the worker's first request goes through paths nothing has warmed yet."""

    @property
    def cold_s(self) -> float:
        """The first request's dispatch over the median dispatch (0 when either is missing or
        it is not over): charged to the replay's first request only."""
        if self.first_dispatch_s is None or not self.dispatch_s:
            return 0.0
        return max(0.0, self.first_dispatch_s - max(0.0, float(np.median(self.dispatch_s))))

    @property
    def total_s(self) -> float:
        """Median dispatch + median return (0 for a side with no sample)."""
        d = float(np.median(self.dispatch_s)) if self.dispatch_s else 0.0
        r = float(np.median(self.return_s)) if self.return_s else 0.0
        return max(0.0, d) + max(0.0, r)

    def markdown(self) -> str:
        def q(xs: Sequence[float]) -> str:
            if not xs:
                return "none"
            p = np.percentile(xs, [10, 50, 90]) * 1e3
            return f"{p[0]:.1f} / {p[1]:.1f} / {p[2]:.1f} ms ({len(xs)})"

        return (
            "Per-request time outside the steps (p10 / p50 / p90, requests): "
            f"dispatch {q(self.dispatch_s)}, return {q(self.return_s)}, "
            f"{self.unmatched} unmatched; "
            f"{self.total_s * 1e3:.1f} ms added to each simulated TTFT and latency; "
            f"the first request's cold dispatch {self.cold_s * 1e3:.1f} ms more to it.\n\n"
        )


def request_overheads(
    requests: Sequence[tuple[float, int, float]], steps: Sequence[RunStep], horizon: int = 400
) -> RequestOverheads:
    """`requests`: (arrival, prompt tokens, TTFT) on the run's clock, sorted by arrival (the
    first is the run's first request, whose dispatch is also kept apart: `first_dispatch_s`);
    `steps`: the first-stage workers' steps as they reported them (no busy gaps), sorted by
    start."""
    starts = [s.start_s for s in steps]
    dispatch: list[float] = []
    back: list[float] = []
    unmatched = 0
    first: float | None = None
    for k, (arrival, prompt, ttft) in enumerate(requests):
        i = bisect.bisect_left(starts, arrival)
        match = next(
            (s for s in steps[i : i + horizon] if (prompt, 0) in s.batch.prefill_chunks), None
        )
        if match is None:
            unmatched += 1
            continue
        back.append(arrival + ttft - match.start_s - match.duration_s)
        idle = i == 0 or steps[i - 1].start_s + steps[i - 1].duration_s <= arrival
        if idle and steps[i] is match:  # the worker's next step after an idle wait: no queue
            dispatch.append(match.start_s - arrival)
            if k == 0:
                first = match.start_s - arrival
    return RequestOverheads(tuple(dispatch), tuple(back), unmatched, first)


@dataclass(frozen=True, slots=True)
class KvPull:
    """One line of a run's `kv_pulls.jsonl` (`worker.kv_pull_log`), the worker's clock."""

    id: str
    received_s: float | None
    """The request's `Decode` reached the decode worker (None: not seen)."""
    start_s: float
    end_s: float
    num_bytes: int


def parse_kv_pulls(lines: Iterable[str]) -> dict[str, KvPull]:
    """The pulls of a run by request id (JSON lines; blank lines skipped). Refuses a line
    without its fields, a pull that ends before it starts, and an id pulled twice."""
    out: dict[str, KvPull] = {}
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            rid = str(row["id"])
            received = row.get("received_s")
            pull = KvPull(
                rid,
                None if received is None else float(received),
                float(row["pull_start_s"]),
                float(row["pull_end_s"]),
                int(row["bytes"]),
            )
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
            raise ValueError(f"kv pulls line {number}: {type(err).__name__}: {err}") from None
        if not pull.end_s >= pull.start_s or pull.num_bytes < 0:
            raise ValueError(f"kv pulls line {number}: want pull_end_s >= pull_start_s, bytes >= 0")
        if rid in out:
            raise ValueError(f"kv pulls line {number}: request {rid!r} pulled twice")
        out[rid] = pull
    return out


@dataclass(frozen=True, slots=True)
class Handoffs:
    """Each P/D request's hand-off to the decode worker, measured (see the module docstring):
    parallel tuples, one entry per recorded request with a logged pull."""

    prompt_tokens: tuple[int, ...]
    first_token_s: tuple[float, ...]
    """The router's first token (arrival + TTFT), the run's clock."""
    dispatch_s: tuple[float, ...]
    """First token to the `Decode` at the decode worker (0 where the worker did not see it)."""
    admit_s: tuple[float, ...]
    """The `Decode` at the worker to the engine's pull start (not charged)."""
    pull_s: tuple[float, ...]
    end_s: tuple[float, ...]
    """The pull's end, the run's clock."""
    unmatched: int
    """Logged pulls with no completed request of that id in the recording."""

    @property
    def charged_s(self) -> tuple[float, ...]:
        """Per request: dispatch + pull (each at least 0)."""
        return tuple(
            max(0.0, d) + max(0.0, p) for d, p in zip(self.dispatch_s, self.pull_s, strict=True)
        )

    def table(self, bytes_per_token: int) -> tuple[tuple[int, float], ...]:
        """(prompt bytes, charged seconds) per prompt length (the median where several
        requests had one), ascending: `RunModel.transfers` for a pool of that KV layout."""
        by_len: dict[int, list[float]] = {}
        for n, c in zip(self.prompt_tokens, self.charged_s, strict=True):
            by_len.setdefault(n, []).append(c)
        return tuple((n * bytes_per_token, float(np.median(v))) for n, v in sorted(by_len.items()))

    def overlaps(self) -> int:
        """Requests whose hand-off (first token to pull end) overlapped an earlier one's: the
        run did them at once, the replay's link one after another."""
        spans = sorted(zip(self.first_token_s, self.end_s, strict=True))
        count, reach = 0, -math.inf
        for start, end in spans:
            if start < reach:
                count += 1
            reach = max(reach, end)
        return count

    def markdown(self) -> str:
        def q(xs: Sequence[float]) -> str:
            p = np.percentile(xs, [10, 50, 90]) * 1e3
            return f"{p[0]:.1f} / {p[1]:.1f} / {p[2]:.1f}"

        if not self.pull_s:
            return "P/D hand-off: no pull of a recorded request logged; the link prices it.\n\n"
        return (
            f"P/D hand-off per request ({len(self.pull_s)} requests; p10 / p50 / p90 ms): "
            f"router's first token to the Decode at the worker {q(self.dispatch_s)}, "
            f"to the pull's start {q(self.admit_s)} (not charged), "
            f"KV pull {q(self.pull_s)}; charged (dispatch + pull) {q(self.charged_s)}; "
            f"{self.overlaps()} overlapping an earlier one, {self.unmatched} pulls unmatched.\n\n"
        )


def handoffs(
    requests: Sequence[tuple[str, float, int, float]], pulls: Mapping[str, KvPull]
) -> Handoffs:
    """`requests`: (id, arrival, prompt tokens, TTFT) on the run's clock; `pulls` by id."""
    rows = []
    seen = set()
    for rid, arrival, prompt, ttft in requests:
        pull = pulls.get(rid)
        if pull is None:
            continue
        seen.add(rid)
        first = arrival + ttft
        received = pull.received_s
        dispatch = received - first if received is not None else 0.0
        admit = pull.start_s - received if received is not None else pull.start_s - first
        rows.append((prompt, first, dispatch, admit, pull.end_s - pull.start_s, pull.end_s))

    def col(k: int) -> tuple[float, ...]:
        return tuple(float(r[k]) for r in rows)

    return Handoffs(
        tuple(int(r[0]) for r in rows),
        col(1),
        col(2),
        col(3),
        col(4),
        col(5),
        unmatched=len(set(pulls) - seen),
    )


@dataclass(frozen=True, slots=True)
class Calibration:
    spec: ClusterSpec
    """The cluster with each pool priced by its `RunModel`."""
    pool_speed: dict[str, SpeedFactor]
    """Per pool, the factor on simulated time; empty without `timed`."""
    fits: tuple[PoolFit, ...]
    gaps: bool = False
    """Steps include the worker's busy time to the next step (`with_busy_gaps`)."""
    overheads: RequestOverheads | None = None
    """Measured per-request time outside the steps, added to the replay (None: not asked)."""
    handoffs: Handoffs | None = None
    """The measured P/D hand-off charged per request (None: not asked, or not recorded)."""
    note: str = ""
    """A line for the report (e.g. that the run recorded no hand-off)."""

    @property
    def side_by_side_transfers(self) -> bool:
        """Transfers are measured hand-offs, so the replay must not queue them on the link
        (`validate.SideBySideTransfers`)."""
        return self.handoffs is not None and bool(self.handoffs.pull_s)

    @property
    def request_overhead_s(self) -> float:
        return self.overheads.total_s if self.overheads is not None else 0.0

    @property
    def first_request_extra_s(self) -> float:
        """The run's first request's cold dispatch (`RequestOverheads.cold_s`), or 0."""
        return self.overheads.cold_s if self.overheads is not None else 0.0

    def markdown(self) -> str:
        lines = [
            "Steps priced from the run's own worker steps (`--run-steps`"
            + (", with busy gaps" if self.gaps else ", engine.step() only")
            + ")"
            + (", scaled by each worker's speed over the run" if self.pool_speed else "")
            + ":\n\n",
            "| pool | workers | steps | fit MAPE | with smoothed speed | its p10 / p50 / p90 |"
            " coefficients |\n|---|---|---|---|---|---|---|\n",
        ]
        for f in self.fits:
            q = f.factor_quantiles()
            coeffs = ", ".join(
                f"{n} {c:.3g}" for n, c in zip(COEFF_NAMES, f.model.coeffs, strict=True) if c
            )
            lines.append(
                f"| {f.pool} | {', '.join(f.workers)} | {f.steps} | {f.mape_model * 100:.1f} % | "
                f"{f.mape_timed * 100:.1f} % | {q[0]:.2f} / {q[1]:.2f} / {q[2]:.2f} | {coeffs} |\n"
            )
        out = "".join(lines) + "\n"
        out += self.overheads.markdown() if self.overheads is not None else ""
        out += self.handoffs.markdown() if self.handoffs is not None else ""
        return out + self.note


def calibrate(
    spec: ClusterSpec,
    steps_by_worker: Mapping[str, Sequence[RunStep]],
    origin_s: float,
    end_s: float,
    timed: bool = True,
    nearest: int = NEAREST,
    gaps: bool = True,
    price_nearest: int = PRICE_NEAREST,
    requests: Sequence[tuple[float, int, float]] | None = None,
    handoff: Handoffs | None = None,
) -> Calibration:
    """Price each pool of `spec` by the steps of the recorded workers of its role (worker
    names `<role>-<i>`, as `splitserve up` names them); with `timed`, also scale each pool's
    steps by its workers' speed over the run (`origin_s`: the run time that is simulated 0;
    `nearest` steps smooth the factor for the fit, `price_nearest` the one that prices);
    with `gaps`, a step's time runs to the next step's start while the worker had work
    (`with_busy_gaps`). With `requests` ((arrival, prompt tokens, TTFT) on the run's clock),
    also measure the per-request time outside the steps (`request_overheads`); the speed
    factors then start at the median dispatch time (when the engine sees the first request).
    With `handoff`, the decode pools price each request's KV transfer as its measured hand-off
    (`RunModel.transfers`); refused with `kv_overlap: layer` (which would hide part of it).
    Refuses a pool whose role no recorded worker had, and a recorded worker no pool takes."""
    if handoff is not None and spec.kv_overlap is not KvOverlap.NONE:
        raise ValueError(
            "the measured hand-off is charged whole; the cluster's kv_overlap "
            f"{spec.kv_overlap.value!r} would hide part of it (use kv_overlap: none, or turn "
            "the hand-off off)"
        )
    by_role: dict[str, dict[str, Sequence[RunStep]]] = {}
    for name, steps in steps_by_worker.items():
        by_role.setdefault(name.split("-")[0], {})[name] = with_busy_gaps(steps) if gaps else steps
    pools = []
    fits = []
    speed: dict[str, SpeedFactor] = {}
    roles = {p.role.value for p in spec.pools if p.replicas > 0}
    extra = sorted(set(by_role) - roles)
    if extra:
        raise ValueError(
            f"recorded workers of role {', '.join(extra)} but the cluster has no such pool"
        )
    overheads = None
    if requests is not None:
        first = sorted(
            (
                st
                for name, sts in steps_by_worker.items()
                if name.split("-")[0] in FIRST
                for st in sts
            ),
            key=lambda st: st.start_s,
        )
        overheads = request_overheads(requests, first)
        if overheads.dispatch_s:
            origin_s += max(0.0, float(np.median(overheads.dispatch_s)))
    for pool in spec.pools:
        mine = by_role.get(pool.role.value)
        if not mine:
            if pool.replicas == 0:
                pools.append(pool)
                continue
            raise ValueError(f"pool {pool.name!r} ({pool.role.value}): no recorded worker steps")
        fit = fit_pool(str(pool.name), mine, pool.worker.latency, nearest)
        if handoff is not None and handoff.pull_s and pool.role is Role.DECODE:
            table = handoff.table(pool.worker.kv_layout.bytes_per_token)
            fit = dataclasses.replace(fit, model=dataclasses.replace(fit.model, transfers=table))
        fits.append(fit)
        worker = dataclasses.replace(pool.worker, latency=fit.model)
        pools.append(dataclasses.replace(pool, worker=worker))
        if timed:
            priced = [run_speed(mine[n], fit.model, price_nearest) for n in fit.workers]
            speed[str(pool.name)] = _speed_product(
                [sp.step_function(origin_s, end_s) for sp in priced]
            )
    return Calibration(
        dataclasses.replace(spec, pools=tuple(pools)),
        speed,
        tuple(fits),
        gaps,
        overheads,
        handoff,
    )
