"""A worker's step-latency model fitted online from its step reports (`WatchSteps`).

Each engine step a worker runs arrives as (batch composition, seconds): the prefill chunks
(new tokens, tokens already in KV) and the decode contexts, as `core.perf.BatchShape`. The
model is the simulator's own latency-model object: a `core.perf.fit.FittedModel` (DistServe
Appendix A.4's reduced forms, summed for mixed steps)

    step_s = a_p·[prefill] + b_p·Σ n + c_p·Σ n·(ctx + (n+1)/2)
           + a_d·[decode]  + b_d·Σ ctx + c_d·(decode batch size)

refitted by non-negative least squares over a sliding window of the most recent steps every
`refit_every` steps, so a worker that slows down (a busier host, longer contexts) is tracked.

Unlike `core.perf.fit.fit`, which needs all six coefficients pinned down, the online fit only
solves for the columns the worker's steps exercise: a disaggregated prefill worker never runs a
decode step and a decode worker never a prefill chunk, so their other half stays 0 (the model
then prices only the kind of step that worker runs). Approximation, stated: an engine whose
mixed steps cost max(compute, memory) rather than a sum (the roofline) is fitted within ~5 % on
the kinds of step a P/D worker runs alone, but 10-30 % off on a mixed worker. It is `ready`
once `min_samples` usable steps were fitted within `max_mape`; until then `fitted` is None and
the owner falls back to coarser estimates.

What the router's placement reads from it (`EndpointView` fields):
* `prefill_tokens_per_s()`: the recent mean prefill chunk L over the model's price of a
  prefill-only step of one chunk of L tokens (queue drain rate);
* `decode_step()`: (base, per-sequence) seconds of a decode step at the recent mean decode
  context c: base = a_d, per_seq = b_d·c + c_d (read as step(2) - step(1), so any
  `LatencyModel` gives the same answer).

Pure: no clock, no I/O; the owner feeds it.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from splitserve.core.perf.fit import NUM_COEFFS, FittedModel
from splitserve.core.perf.protocol import BatchShape


@dataclass(frozen=True, slots=True)
class _Unknown:
    """The prior of an online fit: no price (0) for anything; `ready` is False."""

    @property
    def ready(self) -> bool:
        return False

    def step_s(self, batch: BatchShape) -> float:
        return 0.0

    def kv_transfer_s(self, num_bytes: int) -> float:
        return 0.0


UNKNOWN = _Unknown()


@dataclass(slots=True)
class OnlineStepModel:
    window: int = 512
    """Steps kept for the fit (the most recent)."""
    refit_every: int = 32
    min_samples: int = 24
    max_mape: float = 0.25
    """A fit that explains the window worse than this is not used (noisy or non-linear)."""
    _pending: list[tuple[float, ...]] = field(default_factory=list)
    """Regressor rows observed since the last refit, not yet in `_ring`."""
    _ring: np.ndarray | None = None
    """The window's regressor rows, each written at slot i and i + window (2·window rows), so
    the last n rows in order are one contiguous slice: a refit converts only the rows new
    since the last one, not the whole window (the same floats as converting the whole window
    at once)."""
    _written: int = 0
    """Rows written into `_ring` in total."""
    _y: deque[float] = field(default_factory=deque)
    _chunks: deque[int] = field(default_factory=lambda: deque(maxlen=256))
    _contexts: deque[float] = field(default_factory=lambda: deque(maxlen=256))
    _since: int = 0
    _fitted: FittedModel | None = None
    num_steps: int = 0
    """Usable steps observed in total."""

    def observe(self, batch: BatchShape, seconds: float) -> None:
        self.observe_parts(batch.prefill_chunks, batch.decode_contexts, seconds)

    def observe_parts(
        self,
        prefill_chunks: Sequence[tuple[int, int]],
        decode_contexts: Sequence[int],
        seconds: float,
    ) -> None:
        """`observe(BatchShape(prefill_chunks, decode_contexts), seconds)` without building the
        shape (the router's step feed calls it once per engine step of every worker): the same
        regressors as `core.perf.fit.features`, computed in the same order (the same floats)."""
        if (not prefill_chunks and not decode_contexts) or not seconds > 0:
            return
        if not math.isfinite(seconds):
            return
        ctx_sum = sum(decode_contexts)
        if prefill_chunks:
            self._pending.append((
                1.0,
                float(sum(n for n, _ in prefill_chunks)),
                sum(n * (ctx + (n + 1) / 2.0) for n, ctx in prefill_chunks),
                1.0 if decode_contexts else 0.0,
                float(ctx_sum),
                float(len(decode_contexts)),
            ))  # fmt: skip
            self._chunks.extend(n for n, _ in prefill_chunks)
        else:
            self._pending.append((0.0, 0.0, 0, 1.0, float(ctx_sum), float(len(decode_contexts))))
        self._y.append(seconds)
        if len(self._y) > self.window:
            self._y.popleft()
        if len(self._pending) > self.window:
            del self._pending[0]  # only with refit_every > window: older rows are not used
        if decode_contexts:
            self._contexts.append(ctx_sum / len(decode_contexts))
        self.num_steps += 1
        self._since += 1
        if self._since >= self.refit_every or (
            self._fitted is None and len(self._y) >= self.min_samples
        ):
            self.refit()

    def refit(self) -> None:
        self._since = 0
        n = len(self._y)
        if n < self.min_samples:
            return
        x = self._window_rows(n)
        y = np.array(self._y, dtype=float)
        coeffs = _nnls_active(x, y)
        if coeffs is None:
            return
        mape = float(np.mean(np.abs(x @ coeffs - y) / y))
        if mape > self.max_mape:
            self._fitted = None
            return
        self._fitted = FittedModel(UNKNOWN, tuple(float(c) for c in coeffs), n, "", mape)

    def _window_rows(self, n: int) -> np.ndarray:
        """The last `n` (<= window) rows observed, oldest first, as an (n, NUM_COEFFS) array."""
        w = self.window
        if self._ring is None:
            self._ring = np.zeros((2 * w, NUM_COEFFS), dtype=float)
        if self._pending:
            new = np.array(self._pending, dtype=float)
            slots = (self._written + np.arange(len(new))) % w
            self._ring[slots] = new
            self._ring[slots + w] = new
            self._written += len(new)
            self._pending.clear()
        start = (self._written - n) % w
        return self._ring[start : start + n]

    @property
    def fitted(self) -> FittedModel | None:
        """The current fit (a `core.perf.LatencyModel`), None while not ready."""
        return self._fitted

    def prefill_tokens_per_s(self) -> float:
        """Prompt tokens per second at the recent mean chunk; 0 without a fit or prefill steps."""
        m = self._fitted
        if m is None or not self._chunks:
            return 0.0
        chunk = max(1, round(sum(self._chunks) / len(self._chunks)))
        s = m.step_s(BatchShape(prefill_chunks=((chunk, 0),)))
        return chunk / s if s > 0 else 0.0

    def decode_step(self) -> tuple[float, float]:
        """(base s, per-sequence s) of a decode step at the recent mean context; zeros without
        a fit or decode steps."""
        m = self._fitted
        if m is None or not self._contexts:
            return (0.0, 0.0)
        ctx = max(1, round(sum(self._contexts) / len(self._contexts)))
        one = m.step_s(BatchShape(decode_contexts=(ctx,)))
        two = m.step_s(BatchShape(decode_contexts=(ctx, ctx)))
        if one <= 0:
            return (0.0, 0.0)
        per = max(0.0, two - one)
        return (max(0.0, one - per), per)


def _nnls_active(x: np.ndarray, y: np.ndarray) -> np.ndarray | None:
    """argmin ||x·c - y|| over c >= 0, solving only for the columns that are not all zero and
    only over full-rank column sets (a column the samples cannot separate from the others is
    left at 0). None when no column is usable."""
    nonzero = (x != 0).any(axis=0)
    active = [j for j in range(NUM_COEFFS) if nonzero[j]]
    if not active:
        return None
    scale = np.abs(x).max(axis=0)
    scale[scale == 0] = 1.0
    xs = x / scale
    best: np.ndarray | None = None
    best_err = math.inf
    for size in range(len(active), 0, -1):
        for free in itertools.combinations(active, size):
            sub = xs[:, free]
            if int(np.linalg.matrix_rank(sub)) < size:
                continue
            sol, *_ = np.linalg.lstsq(sub, y, rcond=None)
            if np.any(sol < 0):
                continue
            err = float(np.sum((sub @ sol - y) ** 2))
            if err < best_err - 1e-18:
                best_err = err
                best = np.zeros(NUM_COEFFS)
                best[list(free)] = sol
        if best is not None and size == len(active):
            break  # the unconstrained solution over every active column is non-negative
    return None if best is None else best / scale
