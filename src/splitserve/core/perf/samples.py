"""Measured step times -> a profile table and a fit (the pure half of `splitserve profile`).

Owns: the sample record (`Measurement`) and its CSV form, and the two ways of turning samples
into a latency model:

* `build_table`: a `ProfiledModel` (Vidur-style components, see `core.perf.table`). Probes
  measure whole steps, never components, so the components are separated by a joint least-squares
  solve over the probe cells (median of the repetitions of one probe configuration):

      step_s = g[N] + k_pa·W + k_da·S

  with one free value `g[N]` per distinct number of new tokens N (the GEMMs *and* the fixed
  per-step overhead), and non-negative slopes for prefill attention work W = Σ n·(ctx+(n+1)/2)
  and decode context S = Σ ctx. The slopes only separate the components: the attention curves
  are the cells' residuals `step_s - g[N]` at their own W or S (so curvature the slopes miss is
  kept), each anchored at (0, 0) and made non-decreasing by isotonic regression (pool adjacent
  violators), as is the gemm curve. Past their last point the attention curves go on with the
  fitted slope (their own last segment, between two noisy residuals, could be anything).
  W only varies at a fixed N when prefill probes put the same N tokens into different numbers
  of requests, which is why the profiler's prefill grid is (total tokens × requests); with no
  such variation the solve gives prefill attention 0 and the gemm curve carries it.
  `parse_profile_csv` has no overhead row, so the overhead stays folded into `gemm` (every
  non-empty step has N >= 1, so the sum is the same).
* `evaluate`: held-out accuracy. Every `holdout_every`-th cell of each kind (in order of W or
  S) is held out when the cells kept bracket it in N and in W or S; a table built from the
  rest and `fit.fit` (DistServe A.4 reduced forms, NNLS) on the rest (cell medians, as for the
  table) are scored (MAPE) on the held-out cells.

* `fit_steps`: with worker-reported steps (`splitserve profile --method steps`), the A.4 fit on
  every step the worker ran, mixed prefill+decode steps included; `steps_csv` writes them.

Pure: no clock, no files (CSV helpers take and return lines).
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from splitserve.core.perf.fit import COEFF_NAMES, FittedModel, StepSample, fit
from splitserve.core.perf.protocol import BatchShape
from splitserve.core.perf.table import ProfileCurve, ProfiledModel, prefill_attention_work

ProbeKind = Literal["prefill", "decode"]
SAMPLE_COLUMNS = (
    "kind",
    "batch_size",
    "prompt_tokens",
    "rep",
    "new_tokens",
    "prefill_work",
    "decode_context_sum",
    "seconds",
    "spread_s",
    "chunks",
    "contexts",
)


@dataclass(frozen=True, slots=True)
class Measurement:
    """One repetition of one probe: the step shape the probe ran and the seconds it took."""

    kind: ProbeKind
    batch_size: int
    prompt_tokens: int
    """Prompt tokens per request (prefill: new tokens per request; decode: context at start)."""
    rep: int
    batch: BatchShape
    """The step measured (decode: contexts at the middle of the measured window)."""
    seconds: float
    spread_s: float = 0.0
    """Spread inside the probe: prefill, first to last probe completion; decode, the
    interquartile range of the per-request step-time estimates."""

    @property
    def key(self) -> tuple[str, int, int]:
        return (self.kind, self.batch_size, self.prompt_tokens)


@dataclass(frozen=True, slots=True)
class Cell:
    """The repetitions of one probe configuration, summarised robustly."""

    kind: ProbeKind
    batch_size: int
    prompt_tokens: int
    batch: BatchShape
    seconds: float
    """Median over repetitions."""
    spread_s: float
    """Max - min over repetitions."""
    count: int

    @property
    def new_tokens(self) -> int:
        return self.batch.num_new_tokens

    @property
    def work(self) -> float:
        return prefill_attention_work(self.batch)

    @property
    def context_sum(self) -> int:
        return sum(self.batch.decode_contexts)


def cells(samples: Iterable[Measurement]) -> list[Cell]:
    """Group repetitions by probe configuration; median seconds, median-context batch."""
    groups: dict[tuple[str, int, int], list[Measurement]] = {}
    for s in samples:
        if s.seconds > 0 and math.isfinite(s.seconds) and not s.batch.is_empty:
            groups.setdefault(s.key, []).append(s)
    out = []
    for _key, group in sorted(groups.items()):
        secs = [g.seconds for g in group]
        by_ctx = sorted(group, key=lambda g: sum(g.batch.decode_contexts))
        first = group[0]
        out.append(
            Cell(
                first.kind,
                first.batch_size,
                first.prompt_tokens,
                by_ctx[len(by_ctx) // 2].batch,
                statistics.median(secs),
                max(secs) - min(secs),
                len(group),
            )
        )
    return out


# -- the table ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TableFit:
    model: ProfiledModel
    k_prefill_attention: float
    """Seconds per unit of prefill attention work (the separating slope)."""
    k_decode_attention: float
    """Seconds per decode context token (the separating slope)."""
    gemm_points: tuple[tuple[int, float], ...]
    """(new tokens, seconds) before the monotone fix: the raw per-N values."""


def build_table(samples: Iterable[Measurement] | Sequence[Cell]) -> TableFit:
    """A `ProfiledModel` from probe samples (see the module docstring for the method).

    Raises:
        ValueError: no usable samples, or no decode or no prefill probes to build a curve from.
    """
    cs = _as_cells(samples)
    if not cs:
        raise ValueError("no usable samples (all empty or non-positive)")
    ns = sorted({c.new_tokens for c in cs})
    col = {n: i for i, n in enumerate(ns)}
    base = np.zeros((len(cs), len(ns)))
    for r, c in enumerate(cs):
        base[r, col[c.new_tokens]] = 1.0
    w = np.array([c.work for c in cs])
    s = np.array([float(c.context_sum) for c in cs])
    y = np.array([c.seconds for c in cs])
    g, k_pa, k_da = _solve(base, w, s, y)
    gemm_raw = tuple((n, float(g[col[n]])) for n in ns)
    counts = [sum(1 for c in cs if c.new_tokens == n) for n in ns]
    gemm = _curve([float(n) for n in ns], [v for _, v in gemm_raw], counts)
    pa = _residual_curve(
        [(c.work, c.seconds - float(g[col[c.new_tokens]])) for c in cs if c.kind == "prefill"],
        k_pa,
    )
    da = _residual_curve(
        [
            (float(c.context_sum), c.seconds - float(g[col[c.new_tokens]]))
            for c in cs
            if c.kind == "decode"
        ],
        k_da,
    )
    return TableFit(ProfiledModel(gemm, pa, da, 0.0), k_pa, k_da, gemm_raw)


def _as_cells(samples: Iterable[Measurement] | Sequence[Cell]) -> list[Cell]:
    items = list(samples)
    if items and isinstance(items[0], Cell):
        return [c for c in items if isinstance(c, Cell)]
    return cells(m for m in items if isinstance(m, Measurement))


def _solve(
    base: np.ndarray, w: np.ndarray, s: np.ndarray, y: np.ndarray
) -> tuple[np.ndarray, float, float]:
    """Least squares of y = base·g + k_pa·w + k_da·s with k_pa, k_da >= 0 (and identifiable)."""
    best: tuple[float, np.ndarray, float, float] | None = None
    for use_pa, use_da in itertools.product((True, False), repeat=2):
        extra = [v for v, used in ((w, use_pa), (s, use_da)) if used]
        scales = [float(np.abs(v).max()) or 1.0 for v in extra]
        x = np.column_stack([base, *(v / sc for v, sc in zip(extra, scales, strict=True))])
        if int(np.linalg.matrix_rank(x)) < x.shape[1]:
            continue
        sol, *_ = np.linalg.lstsq(x, y, rcond=None)
        ks = [float(k) / sc for k, sc in zip(sol[base.shape[1] :], scales, strict=True)]
        if any(k < 0 for k in ks):
            continue
        err = float(np.sum((x @ sol - y) ** 2))
        k_pa = ks.pop(0) if use_pa else 0.0
        k_da = ks.pop(0) if use_da else 0.0
        if best is None or err < best[0] - 1e-18:
            best = (err, sol[: base.shape[1]], k_pa, k_da)
    assert best is not None  # the base alone is always full rank (one column per N)
    return best[1], best[2], best[3]


def _residual_curve(points: list[tuple[float, float]], slope: float) -> ProfileCurve:
    by_x: dict[float, list[float]] = {0.0: [0.0]}
    for x, r in points:
        if x > 0:
            by_x.setdefault(x, []).append(r)
    xs = sorted(by_x)
    curve = _curve(xs, [statistics.fmean(by_x[x]) for x in xs], [len(by_x[x]) for x in xs])
    if len(curve.xs) < 2:
        return curve
    # Past the last point the curve would go on with its last segment's slope, which between
    # two noisy residuals can be anything; go on with the least-squares slope instead.
    x_last, y_last = curve.xs[-1], curve.ys[-1]
    return ProfileCurve((*curve.xs, 2 * x_last), (*curve.ys, y_last + slope * x_last))


def _curve(xs: Sequence[float], ys: Sequence[float], weights: Sequence[int]) -> ProfileCurve:
    fitted = isotonic(ys, weights)
    return ProfileCurve(tuple(xs), tuple(max(0.0, v) for v in fitted))


def isotonic(ys: Sequence[float], weights: Sequence[float] | None = None) -> list[float]:
    """The non-decreasing sequence closest to `ys` in weighted least squares (pool adjacent
    violators)."""
    ws = list(weights) if weights is not None else [1.0] * len(ys)
    blocks: list[list[float]] = []  # [mean, weight, length]
    for y, wt in zip(ys, ws, strict=True):
        blocks.append([float(y), float(wt), 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            m2, w2, n2 = blocks.pop()
            m1, w1, n1 = blocks.pop()
            blocks.append([(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2, n1 + n2])
    out: list[float] = []
    for mean, _w, n in blocks:
        out.extend([mean] * int(n))
    return out


def table_csv(table: TableFit, header_notes: Sequence[str] = ()) -> list[str]:
    """Lines of the `component,x,seconds` CSV that `parse_profile_csv` (and the scenario key
    `latency_profile:`) read."""
    m = table.model
    lines = [f"# {note}" for note in header_notes]
    lines.append(
        "# gemm includes the fixed per-step overhead (the CSV has no overhead row); "
        f"separating slopes: prefill_attention {table.k_prefill_attention:.6g} s/unit, "
        f"decode_attention {table.k_decode_attention:.6g} s/token"
    )
    lines.append("component,x,seconds")
    for name, curve in (
        ("gemm", m.gemm),
        ("prefill_attention", m.prefill_attention),
        ("decode_attention", m.decode_attention),
    ):
        lines += [f"{name},{x!r},{y!r}" for x, y in zip(curve.xs, curve.ys, strict=True)]
    return lines


# -- held-out evaluation ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Evaluation:
    train_cells: int
    heldout_cells: int
    table_mape_in_sample: float
    """The full table (every cell) against every cell."""
    table_mape_heldout: float
    """A table built without the held-out cells, on them."""
    fit: FittedModel
    """NNLS of the A.4 reduced forms on the training cells (their medians)."""
    fit_mape_heldout: float
    heldout: tuple[tuple[str, int, int, float, float, float], ...] = field(default=())
    """(kind, batch size, prompt tokens, measured s, table s, fit s) per held-out cell."""

    def summary(self) -> dict[str, object]:
        coeffs = dict(zip(COEFF_NAMES, self.fit.coeffs, strict=True)) if self.fit.coeffs else {}
        return {
            "cells": {"train": self.train_cells, "heldout": self.heldout_cells},
            "table": {
                "mape_in_sample": self.table_mape_in_sample,
                "mape_heldout": self.table_mape_heldout,
            },
            "fit": {
                "form": "a_p*[prefill] + b_p*sum(n) + c_p*sum(n*(ctx+(n+1)/2)) "
                "+ a_d*[decode] + b_d*sum(ctx) + c_d*B",
                "coefficients": coeffs,
                "num_samples": self.fit.num_samples,
                "mape_train": self.fit.mape,
                "mape_heldout": self.fit_mape_heldout,
                "ready_at_default_gate": self.fit.ready and self.fit.mape <= 0.1,
                "reason": self.fit.reason,
            },
            "heldout": [
                dict(
                    zip(
                        ("kind", "batch_size", "prompt_tokens", "measured_s", "table_s", "fit_s"),
                        row,
                        strict=True,
                    )
                )
                for row in self.heldout
            ],
        }


def split_cells(cs: Sequence[Cell], holdout_every: int) -> tuple[list[Cell], list[Cell]]:
    """(train, held out): of each kind, in order of attention work (prefill) or context (decode),
    every `holdout_every`-th cell is held out if the cells kept bracket it in both new tokens and
    that feature, so held-out cells are interpolated, never extrapolated."""
    train: list[Cell] = []
    held: list[Cell] = []
    for kind in ("prefill", "decode"):
        group = sorted((c for c in cs if c.kind == kind), key=lambda c: (_feature(c), c.new_tokens))
        out: list[Cell] = []
        for i, c in enumerate(group):
            others = [o for o in group if o is not c and o not in out]
            bracketed = all(
                len({f(o) for o in group}) == 1  # a feature all cells share brackets nothing
                or (any(f(o) < f(c) for o in others) and any(f(o) > f(c) for o in others))
                for f in (_feature, _new_tokens)
            )
            if holdout_every > 0 and i % holdout_every == holdout_every // 2 and bracketed:
                out.append(c)
        held += out
        train += [c for c in group if c not in out]
    return train, held


def _feature(c: Cell) -> float:
    return c.work if c.kind == "prefill" else float(c.context_sum)


def _new_tokens(c: Cell) -> float:
    return float(c.new_tokens)


def evaluate(samples: Sequence[Measurement], holdout_every: int = 4) -> Evaluation:
    """Score the table and the fit on held-out probe cells (see the module docstring)."""
    cs = cells(samples)
    full = build_table(cs).model
    in_sample = _mape([(c.seconds, full.step_s(c.batch)) for c in cs])
    train, held = split_cells(cs, holdout_every)
    table = build_table(train).model if train else full
    # Fitted to the cells' medians, like the table: raw repetitions on a noisy machine would
    # let outliers steer a least-squares fit.
    steps = [StepSample(c.batch, c.seconds) for c in train]
    fitted = fit(steps, prior=table, min_samples=len(COEFF_NAMES) + 1, max_mape=math.inf)
    rows = tuple(
        (
            c.kind,
            c.batch_size,
            c.prompt_tokens,
            c.seconds,
            table.step_s(c.batch),
            fitted.step_s(c.batch),
        )
        for c in held
    )
    return Evaluation(
        train_cells=len(train),
        heldout_cells=len(held),
        table_mape_in_sample=in_sample,
        table_mape_heldout=_mape([(r[3], r[4]) for r in rows]),
        fit=fitted,
        fit_mape_heldout=_mape([(r[3], r[5]) for r in rows]) if fitted.ready else math.nan,
        heldout=rows,
    )


def _mape(pairs: Sequence[tuple[float, float]]) -> float:
    if not pairs:
        return math.nan
    return statistics.fmean(abs(pred - meas) / meas for meas, pred in pairs)


# -- samples CSV --------------------------------------------------------------------------------


def samples_csv(samples: Iterable[Measurement]) -> list[str]:
    """Lines of the raw samples CSV (`SAMPLE_COLUMNS`); `parse_samples_csv` reads them back."""
    lines = [",".join(SAMPLE_COLUMNS)]
    for m in samples:
        chunks = ";".join(f"{n}:{ctx}" for n, ctx in m.batch.prefill_chunks)
        contexts = ";".join(str(c) for c in m.batch.decode_contexts)
        lines.append(
            f"{m.kind},{m.batch_size},{m.prompt_tokens},{m.rep},{m.batch.num_new_tokens},"
            f"{prefill_attention_work(m.batch)!r},{sum(m.batch.decode_contexts)},"
            f"{m.seconds!r},{m.spread_s!r},{chunks},{contexts}"
        )
    return lines


def parse_samples_csv(lines: Iterable[str]) -> list[Measurement]:
    """The samples `samples_csv` wrote. A row that is not one is a ValueError naming its line
    and column: counts are whole numbers (batch size and prompt tokens >= 1), seconds and spread
    finite and >= 0, a prefill sample's chunks are its batch of `prompt_tokens`-token chunks, a
    decode sample's contexts one per request, and the derived columns (`new_tokens`,
    `prefill_work`, `decode_context_sum`) agree with them (they were ignored, so an edited one
    changed nothing without a word; a NaN or negative `seconds` dropped its sample)."""
    out: list[Measurement] = []
    for number, raw in enumerate(lines, start=1):
        line = raw.strip()
        if not line or line.startswith(("#", "kind,")):
            continue
        parts = line.split(",")
        if len(parts) != len(SAMPLE_COLUMNS) or parts[0] not in ("prefill", "decode"):
            raise ValueError(
                f"line {number}: bad sample row {line!r}; want {','.join(SAMPLE_COLUMNS)}"
            )
        out.append(_sample_row(dict(zip(SAMPLE_COLUMNS, parts, strict=True)), number))
    return out


def _sample_row(row: dict[str, str], number: int) -> Measurement:
    def bad(column: str, want: str) -> ValueError:
        return ValueError(f"line {number}: {column} {want}, got {row[column]!r}")

    def count(column: str, least: int) -> int:
        try:
            value = int(row[column])
        except ValueError:
            raise bad(column, f"must be a whole number >= {least}") from None
        if value < least:
            raise bad(column, f"must be a whole number >= {least}")
        return value

    def seconds(column: str) -> float:
        try:
            value = float(row[column])
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and value >= 0):
            raise bad(column, "must be finite and >= 0")
        return value

    def ints(text: str, column: str, least: int) -> tuple[int, ...]:
        try:
            values = tuple(int(v) for v in text.split(";") if v)
        except ValueError:
            raise bad(column, f"must be whole numbers >= {least}") from None
        if any(v < least for v in values):
            raise bad(column, f"must be whole numbers >= {least}")
        return values

    kind: ProbeKind = "prefill" if row["kind"] == "prefill" else "decode"
    batch_size = count("batch_size", 1)
    prompt_tokens = count("prompt_tokens", 1)
    rep = count("rep", 0)
    chunks: list[tuple[int, int]] = []
    for chunk in row["chunks"].split(";"):
        if not chunk:
            continue
        n, sep, ctx = chunk.partition(":")
        pair = ints(f"{n};{ctx}", "chunks", 0) if sep else ()
        if len(pair) != 2 or pair[0] < 1:
            raise bad("chunks", "must be NEW:CONTEXT pairs (NEW >= 1, CONTEXT >= 0) split by ';'")
        chunks.append((pair[0], pair[1]))
    contexts = ints(row["contexts"], "contexts", 0)
    if kind == "prefill" and (chunks != [(prompt_tokens, 0)] * batch_size or contexts):
        raise bad("chunks", f"of a prefill sample must be {batch_size} x {prompt_tokens}:0")
    if kind == "decode" and (chunks or len(contexts) != batch_size):
        raise bad("contexts", f"of a decode sample must be {batch_size} contexts")
    batch = BatchShape(tuple(chunks), contexts)
    if count("new_tokens", 0) != batch.num_new_tokens:
        raise bad("new_tokens", f"must be the batch's {batch.num_new_tokens}")
    work = prefill_attention_work(batch)
    try:
        stated = float(row["prefill_work"])
    except ValueError:
        stated = math.nan
    if not math.isclose(stated, work, rel_tol=1e-9, abs_tol=1e-9):
        raise bad("prefill_work", f"must be the batch's {work!r}")
    if count("decode_context_sum", 0) != sum(contexts):
        raise bad("decode_context_sum", f"must be the batch's {sum(contexts)}")
    return Measurement(
        kind,
        batch_size,
        prompt_tokens,
        rep,
        batch,
        seconds("seconds"),
        seconds("spread_s"),
    )


# -- worker-reported steps ----------------------------------------------------------------------

STEP_COLUMNS = (
    "index",
    "start_s",
    "duration_s",
    "new_tokens",
    "num_seqs",
    "prefill_work",
    "decode_context_sum",
    "chunks",
    "contexts",
)

ReportedStep = tuple[int, float, float, BatchShape]
"""(step index, start on the worker clock, duration, shape): one `WatchSteps` sample."""


def steps_csv(steps: Iterable[ReportedStep]) -> list[str]:
    """Lines of the worker-reported steps CSV (`STEP_COLUMNS`)."""
    lines = [",".join(STEP_COLUMNS)]
    for index, start_s, duration_s, b in steps:
        chunks = ";".join(f"{n}:{ctx}" for n, ctx in b.prefill_chunks)
        contexts = ";".join(str(c) for c in b.decode_contexts)
        lines.append(
            f"{index},{start_s!r},{duration_s!r},{b.num_new_tokens},"
            f"{len(b.prefill_chunks) + len(b.decode_contexts)},{prefill_attention_work(b)!r},"
            f"{sum(b.decode_contexts)},{chunks},{contexts}"
        )
    return lines


def fit_steps(steps: Sequence[ReportedStep], prior: ProfiledModel) -> dict[str, object]:
    """The A.4 fit (NNLS) on every reported step, and how the steps split by kind."""
    usable = [StepSample(b, d) for _i, _t, d, b in steps if not b.is_empty and d > 0]
    mixed = sum(1 for s in usable if s.batch.prefill_chunks and s.batch.decode_contexts)
    prefill = sum(1 for s in usable if s.batch.prefill_chunks and not s.batch.decode_contexts)
    fitted = fit(usable, prior=prior, min_samples=len(COEFF_NAMES) + 1, max_mape=math.inf)
    coeffs = dict(zip(COEFF_NAMES, fitted.coeffs, strict=True)) if fitted.coeffs else {}
    return {
        "steps": len(usable),
        "prefill_only": prefill,
        "decode_only": len(usable) - prefill - mixed,
        "mixed": mixed,
        "coefficients": coeffs,
        "mape": fitted.mape,
        "ready": fitted.ready,
        "reason": fitted.reason,
    }
