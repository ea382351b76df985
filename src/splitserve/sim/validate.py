"""Fidelity: replay a recorded run through the simulator and compare TTFT / TPOT / latency.

Owns: the recording format (`parse_recording`: JSON lines as `router.request_log` writes them, or
CSV with the same column names), the replay (the recorded arrivals, prompt and output lengths run
on a `ClusterSpec`), and the comparison (`Validation`): per request, simulated vs measured, and
the p50 / p90 / p99 of each metric, measured vs simulated, with their relative error.

Required fields per request: `arrival_s`, `prompt_tokens`, `output_tokens`, `ttft_s`,
`latency_s`; `tpot_s` is empty / null for one-token outputs (and is derived from latency and
TTFT when absent; when given, `ttft_s + tpot_s * (output_tokens - 1)` may not pass `latency_s` by
more than `tpot_tolerance_s`); `id` and `outcome` are optional (rows whose outcome is not `ok`
are replayed as load, not scored, when they produced a token: `LoadOnly`; else skipped and
counted). Pure: takes lines, returns values; the runner reads and writes files.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from splitserve.sim.cluster import Cluster, ClusterSpec, simulate
from splitserve.sim.engine import Simulator
from splitserve.sim.entities import SimRequest, SimWorker
from splitserve.sim.events import EventKind
from splitserve.sim.report import markdown_table
from splitserve.sim.speed import SpeedTrace
from splitserve.sim.workload import WorkItem

METRICS = ("ttft_s", "tpot_s", "latency_s")
QUANTILES = (50, 90, 99)


@dataclass(frozen=True, slots=True)
class Recorded:
    id: str
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    ttft_s: float
    tpot_s: float | None
    latency_s: float


@dataclass(frozen=True, slots=True)
class LoadOnly:
    """A request that did not end `ok` (cancelled by its client, failed, timed out) after it
    had produced tokens: it loaded the workers until then, so the replay runs it, with the
    tokens the router saw, but it is not scored. Approximation, stated: a cancelled request's
    engine may have made a token or two more before the cancel reached it."""

    id: str
    arrival_s: float
    prompt_tokens: int
    output_tokens: int


@dataclass(frozen=True, slots=True)
class Recording:
    requests: tuple[Recorded, ...]
    skipped: int
    """Rows left out: their outcome was not `ok` and they produced no token (whether their
    prefill ran is not recorded)."""
    load_only: tuple[LoadOnly, ...] = ()
    """Rows whose outcome was not `ok` after one token or more: replayed, not scored."""


def _num(row: dict[str, object], key: str, line: int) -> float:
    out = _opt(row, key, line)
    if out is None:
        raise ValueError(f"recording line {line}: missing {key!r}")
    return out


def _opt(row: dict[str, object], key: str, line: int) -> float | None:
    value = row.get(key)
    if value is None or value == "":
        return None
    if isinstance(value, bool):  # (float(True) is 1.0)
        raise ValueError(f"recording line {line}: {key!r} is not a number: {value!r}")
    try:
        out = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"recording line {line}: {key!r} is not a number: {value!r}") from None
    if not math.isfinite(out) or out < 0:
        raise ValueError(f"recording line {line}: {key!r} must be finite and >= 0, got {out}")
    return out


MAX_TOKENS = 2**31
"""More tokens than this in one request is not a recording of a run (and overflows the
simulator's arrays)."""


def _tokens(row: dict[str, object], key: str, line: int) -> int:
    out = _num(row, key, line)
    if out != int(out) or not 1 <= out < MAX_TOKENS:
        raise ValueError(
            f"recording line {line}: {key!r} must be >= 1, a whole number below {MAX_TOKENS}; "
            f"got {out:g}"
        )
    return int(out)


def tpot_tolerance_s(output_tokens: int) -> float:
    """How far `ttft_s + tpot_s * (output_tokens - 1)` may pass `latency_s`, in seconds.

    The router's request log (`router.request_log`) computes all three from the same three
    readings of one clock, so they agree exactly but for its rounding to 6 decimals: at most
    0.5 us on `ttft_s` and on `latency_s`, and 0.5 us on `tpot_s` times `output_tokens - 1`,
    0.5 us * (output_tokens + 1) in all. Twice that leaves room for float arithmetic."""
    return 1e-6 * (output_tokens + 1)


def _check_tpot(tpot: float, ttft: float, latency: float, output: int, line: int) -> None:
    """A `tpot_s` the recorded times cannot have had is refused (it was replayed as measured)."""
    if output == 1:
        raise ValueError(
            f"recording line {line}: 'tpot_s' ({tpot:g}) given for a one-token output: there is "
            "no time between output tokens; leave it empty / null"
        )
    end = ttft + tpot * (output - 1)
    if end - latency > tpot_tolerance_s(output):
        raise ValueError(
            f"recording line {line}: 'tpot_s' ({tpot:g}) * {output - 1} after 'ttft_s' "
            f"({ttft:g}) ends at {end:g} s, after 'latency_s' ({latency:g}) by more than "
            f"{tpot_tolerance_s(output):g} s: the output cannot end after the request"
        )


_REQUIRED = ("arrival_s", "prompt_tokens", "output_tokens", "ttft_s", "latency_s")
"""The columns every recorded request needs (`tpot_s`, `id`, `outcome` are optional)."""

_FIELDS = (*_REQUIRED, "tpot_s", "id", "outcome", "path")
"""Every field of the format (what the router's request log writes); any other is refused."""


def parse_recording(lines: Iterable[str]) -> Recording:
    """Recorded requests (JSON lines, or CSV with a header), sorted by arrival."""
    numbered = [(n, ln) for n, ln in enumerate(lines, 1) if ln.strip()]  # the file's numbers
    text = [ln for _, ln in numbered]
    if not text:
        raise ValueError("the recording is empty")
    rows: list[dict[str, object]]
    if text[0].lstrip().startswith("{"):
        rows = []
        for n, ln in numbered:
            try:
                row = json.loads(ln)
            except json.JSONDecodeError as err:
                raise ValueError(f"recording line {n}: not JSON ({err.msg})") from None
            if not isinstance(row, dict):
                raise ValueError(f"recording line {n}: not a JSON object")
            rows.append(row)
        line_of = [n for n, _ in numbered]
    else:
        reader = csv.DictReader(text)
        missing = [c for c in _REQUIRED if c not in (reader.fieldnames or ())]
        if missing:
            raise ValueError(
                "the recording is neither JSON lines (each line an object) nor CSV with a "
                f"header naming {', '.join(_REQUIRED)}: its first line lacks "
                f"{', '.join(missing)}"
            )
        rows, line_of = [], []
        for r in reader:
            line_of.append(numbered[reader.line_num - 1][0])  # (the row's last line)
            if None in r:  # csv.DictReader's key for the values beyond the header's columns
                raise ValueError(
                    f"recording line {line_of[-1]}: more values than the header has columns"
                )
            rows.append(dict(r))
    out: list[Recorded] = []
    load: list[LoadOnly] = []
    skipped = 0
    for i, (n, row) in enumerate(zip(line_of, rows, strict=True), 1):  # n: the file's line
        unknown = [k for k in row if k not in _FIELDS]
        if unknown:  # was ignored without a word (a typo such as tpot_ms)
            raise ValueError(
                f"recording line {n}: unknown field {unknown[0]!r} (the format's fields: "
                f"{', '.join(_FIELDS)})"
            )
        if str(row.get("outcome") or "ok") != "ok":
            made = _num(row, "output_tokens", n)
            if made != int(made) or made >= MAX_TOKENS:
                raise ValueError(
                    f"recording line {n}: 'output_tokens' must be a whole number below "
                    f"{MAX_TOKENS}; got {made:g}"
                )
            if made == 0:
                skipped += 1
                continue
            load.append(
                LoadOnly(
                    str(row.get("id") or f"line{i}"),
                    _num(row, "arrival_s", n),
                    _tokens(row, "prompt_tokens", n),
                    int(made),
                )
            )
            continue
        arrival = _num(row, "arrival_s", n)
        prompt = _tokens(row, "prompt_tokens", n)
        output = _tokens(row, "output_tokens", n)
        ttft = _num(row, "ttft_s", n)
        latency = _num(row, "latency_s", n)
        if ttft > latency:  # was replayed as measured
            raise ValueError(
                f"recording line {n}: 'ttft_s' ({ttft:g}) is after 'latency_s' ({latency:g}): "
                "the first token cannot come after the last"
            )
        tpot = _opt(row, "tpot_s", n)
        if tpot is None and output > 1:
            tpot = (latency - ttft) / (output - 1)
        elif tpot is not None:
            _check_tpot(tpot, ttft, latency, output, n)
        out.append(
            Recorded(
                str(row.get("id") or f"line{i}"),
                arrival,
                prompt,
                output,
                ttft,
                tpot,
                latency,
            )
        )
    if not out:
        raise ValueError("the recording holds no completed (`ok`) requests")
    out.sort(key=lambda r: r.arrival_s)
    load.sort(key=lambda r: r.arrival_s)
    return Recording(tuple(out), skipped, tuple(load))


def _median_error(metric: str, error: float) -> str:
    """`ttft 3.1 %`; a metric no request can be scored on (TPOT when every output is one token)
    says so (it printed `tpot nan %`)."""
    name = metric.removesuffix("_s")
    if math.isnan(error):
        return f"{name} n/a (no request has a measured {name} above 0 and a simulated one)"
    return f"{name} {error * 100:.1f} %"


@dataclass(frozen=True, slots=True)
class Pair:
    """One request: measured and simulated."""

    recorded: Recorded
    ttft_s: float
    tpot_s: float | None
    latency_s: float

    def value(self, metric: str, simulated: bool) -> float | None:
        src: object = self if simulated else self.recorded
        v: float | None = getattr(src, metric)
        return v


@dataclass(frozen=True, slots=True)
class Row:
    metric: str
    quantile: int
    measured: float
    simulated: float

    @property
    def rel_error(self) -> float:
        return (self.simulated - self.measured) / self.measured if self.measured > 0 else math.inf


@dataclass(frozen=True, slots=True)
class Validation:
    pairs: tuple[Pair, ...]
    skipped: int
    unfinished: int
    """Requests the simulation did not finish (none expected: it runs until all are done)."""
    load_only: int = 0
    """Requests replayed as load only (`LoadOnly`)."""

    def values(self, metric: str, simulated: bool) -> list[float]:
        return [
            v
            for p in self.pairs
            if (v := p.value(metric, simulated)) is not None
            and p.value(metric, not simulated) is not None
        ]

    def rows(self) -> list[Row]:
        out = []
        for metric in METRICS:
            real = self.values(metric, False)
            sim = self.values(metric, True)
            if not real:
                continue
            for q in QUANTILES:
                out.append(
                    Row(metric, q, float(np.percentile(real, q)), float(np.percentile(sim, q)))
                )
        return out

    def median_abs_rel_error(self, metric: str) -> float:
        """Median over requests of |simulated - measured| / measured."""
        errs = [
            abs(s - r) / r
            for p in self.pairs
            if (r := p.value(metric, False)) is not None
            and (s := p.value(metric, True)) is not None
            and r > 0
        ]
        return float(np.median(errs)) if errs else math.nan

    def markdown(self, target: float = 0.05) -> str:
        rows = [
            [
                r.metric.removesuffix("_s"),
                f"p{r.quantile}",
                r.measured * 1e3,
                r.simulated * 1e3,
                f"{r.rel_error * 100:+.1f} %",
                "yes" if abs(r.rel_error) <= target else "no",
            ]
            for r in self.rows()
        ]
        out = [
            f"{len(self.pairs)} requests replayed ({self.load_only} more replayed as load "
            f"only: not ok after their first token; {self.skipped} not ok skipped, "
            f"{self.unfinished} unfinished in the simulation)\n\n",
            markdown_table(
                [
                    "metric",
                    "quantile",
                    "measured ms",
                    "simulated ms",
                    "error",
                    f"within {target * 100:.4g} %",
                ],
                rows,
            ),
            "\nPer-request median |error|: "
            + ", ".join(_median_error(m, self.median_abs_rel_error(m)) for m in METRICS)
            + "\n",
        ]
        return "".join(out)

    def csv_rows(self) -> list[list[object]]:
        head: list[object] = ["id", "arrival_s", "prompt_tokens", "output_tokens"]
        for m in METRICS:
            head += [f"measured_{m}", f"simulated_{m}"]
        rows: list[list[object]] = [head]
        for p in self.pairs:
            r = p.recorded
            row: list[object] = [r.id, r.arrival_s, r.prompt_tokens, r.output_tokens]
            for m in METRICS:
                row += [p.value(m, False), p.value(m, True)]
            rows.append(row)
        return rows


class SideBySideTransfers(Cluster):
    """The replay's cluster when every KV transfer is a hand-off measured in the run
    (`validate_steps.Handoffs`): each takes its own time from when the decode engine takes the
    request, side by side with any other in flight. The run did its pulls at once, and a
    measured hand-off already holds whatever they cost each other; queueing them one after
    another on the decode worker's link (`Cluster._start_transfer`) would count an overlap
    twice."""

    def _start_transfer(self, req: SimRequest, decode: SimWorker, sim: Simulator) -> None:
        dur = self.transfer_s(req, self.workers[req.prefill_worker], decode)
        req.kv_transfer_s = dur
        sim.schedule(sim.now_s + dur, EventKind.TRANSFER_DONE, decode.index, req)


def replay(
    spec: ClusterSpec,
    recording: Recording,
    speed: SpeedTrace | None = None,
    pool_speed: Mapping[str, Callable[[float], float]] | None = None,
    request_overhead_s: float = 0.0,
    side_by_side_transfers: bool = False,
    first_request_extra_s: float = 0.0,
) -> Validation:
    """Run the recorded arrivals and lengths on `spec`; pair each request with its measurement.

    With `speed` (the machine's speed during the run, `sim.speed`), each step is scaled by the
    factor at its start on the recording's clock, and decode steps are priced one by one (a fused
    run would hold one factor for its whole length). `pool_speed` does the same per pool, on
    simulated time (`sim.validate_steps`: the workers' own speed over the run).
    `request_overhead_s` is added to every simulated TTFT and latency: the live system's time
    outside the engine per request (router, RPCs), measured from the run
    (`validate_steps.request_overheads`). `side_by_side_transfers`: KV transfers do not queue
    on the decode worker's link (`SideBySideTransfers`: for measured hand-offs).
    `first_request_extra_s` is added to the first recorded request's TTFT and latency only (its
    cold dispatch, `RequestOverheads.cold_s`). Approximation, stated: it is added after the
    simulation, as the per-request overhead is, so it does not delay that request's step in
    the replay; in the recorded runs the next request arrived 0.23-1.0 s later, so nothing
    queued behind it."""
    reqs = recording.requests
    # the scored requests and those replayed as load only, in arrival order
    every: list[Recorded | LoadOnly] = sorted(
        (*reqs, *recording.load_only), key=lambda r: r.arrival_s
    )
    t0 = every[0].arrival_s
    items = tuple(WorkItem(r.arrival_s - t0, r.prompt_tokens, r.output_tokens) for r in every)
    if side_by_side_transfers:
        loop = Simulator()
        cluster = SideBySideTransfers(
            spec,
            items,
            1,
            speed=speed.step_function(t0) if speed is not None else None,
            pool_speed=pool_speed or None,
        )
        cluster.start(loop)
        loop.run(cluster)
        result = cluster.result(loop)
    elif speed is None and not pool_speed:
        result = simulate(spec, items)
    else:
        result = simulate(
            spec,
            items,
            max_repeat=1,
            speed=speed.step_function(t0) if speed is not None else None,
            pool_speed=pool_speed or None,
        )
    pairs: list[Pair] = []
    unfinished = 0
    first = True
    for rec, sim in zip(every, result.requests, strict=True):
        if not isinstance(rec, Recorded):
            continue
        extra = request_overhead_s + (first_request_extra_s if first else 0.0)
        first = False
        ttft, e2e = sim.ttft_s, sim.e2e_s
        if ttft is None or e2e is None:
            unfinished += 1
            continue
        pairs.append(Pair(rec, ttft + extra, sim.tpot_s, e2e + extra))
    return Validation(tuple(pairs), recording.skipped, unfinished, len(recording.load_only))


def per_request_errors(v: Validation, metric: str) -> Sequence[float]:
    """(simulated - measured) / measured per request, where both exist."""
    return [
        (s - r) / r
        for p in v.pairs
        if (r := p.value(metric, False)) is not None
        and (s := p.value(metric, True)) is not None
        and r > 0
    ]
