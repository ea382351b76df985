"""Latency model fitted to measured step times (DistServe Appendix A reduced forms).

Owns: the least-squares fit of research/seed-distserve-vidur-aladdin.md §A.4's reduced forms,
extended to mixed (chunked-prefill) steps by summing them:

    step_s = a_p·[has prefill] + b_p·Σ prefill tokens + c_p·Σ n·(ctx + (n+1)/2)
           + a_d·[has decode]  + b_d·Σ decode contexts + c_d·(decode batch size)

For a prefill-only batch of whole prompts this is DistServe's `a + b·Σl + c·Σl²` (up to the
constant ½ in the attention work); for a decode-only batch it is `a + b·Σctx + c·B`.
`fit()` is pure: samples in, a frozen `FittedModel` out. Coefficients are constrained to be
non-negative (exact NNLS by enumerating which coefficients are pinned at 0: six columns, 64
small solves), because a negative one would let more work cost less and invert decisions. The
fitted model is `ready` only with at least `min_samples` samples that pin down every coefficient
(full rank) and a fit error (MAPE) within `max_mape`; until then every price comes from the
`prior` model, so callers always get a positive, monotone answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from splitserve.core.perf.protocol import BatchShape, LatencyModel
from splitserve.core.perf.table import prefill_attention_work

NUM_COEFFS = 6
COEFF_NAMES = ("a_p", "b_p", "c_p", "a_d", "b_d", "c_d")


def features(batch: BatchShape) -> tuple[float, ...]:
    """The six regressors of one step, in `COEFF_NAMES` order."""
    prefill_tokens = sum(n for n, _ in batch.prefill_chunks)
    return (
        1.0 if batch.prefill_chunks else 0.0,
        float(prefill_tokens),
        prefill_attention_work(batch),
        1.0 if batch.decode_contexts else 0.0,
        float(sum(batch.decode_contexts)),
        float(len(batch.decode_contexts)),
    )


@dataclass(frozen=True, slots=True)
class StepSample:
    batch: BatchShape
    seconds: float


@dataclass(frozen=True, slots=True)
class FittedModel:
    prior: LatencyModel
    """Prices every step while the fit is not ready, and every KV transfer."""
    coeffs: tuple[float, ...] | None = None
    num_samples: int = 0
    reason: str = "no samples"
    """Why the fit is not ready (empty when it is)."""
    mape: float = float("nan")
    """Mean absolute percentage error on the samples it was fitted to."""

    @property
    def ready(self) -> bool:
        return self.coeffs is not None

    def step_s(self, batch: BatchShape) -> float:
        if batch.is_empty:
            return 0.0
        if self.coeffs is None:
            return self.prior.step_s(batch)
        value = sum(c * f for c, f in zip(self.coeffs, features(batch), strict=True))
        return value if value > 0 else self.prior.step_s(batch)

    def kv_transfer_s(self, num_bytes: int) -> float:
        return self.prior.kv_transfer_s(num_bytes)


def fit(
    samples: Sequence[StepSample],
    prior: LatencyModel,
    min_samples: int = 30,
    max_mape: float = 0.1,
) -> FittedModel:
    """Non-negative least-squares fit of the six coefficients; not ready (prior used) when there
    are too few samples, they do not pin down every coefficient, or the fit explains them badly."""
    usable = [s for s in samples if not s.batch.is_empty and s.seconds > 0]
    n = len(usable)
    if n < min_samples:
        return FittedModel(prior, None, n, f"{n} samples < {min_samples}")
    x = np.array([features(s.batch) for s in usable], dtype=float)
    y = np.array([s.seconds for s in usable], dtype=float)
    # Scale columns so the solve is well conditioned (token counts and squares differ by 1e6).
    scale = np.abs(x).max(axis=0)
    scale[scale == 0] = 1.0
    xs = x / scale
    rank = int(np.linalg.matrix_rank(xs))
    if rank < NUM_COEFFS:
        return FittedModel(prior, None, n, f"samples pin down {rank} of {NUM_COEFFS} coefficients")
    coeffs = _nnls(xs, y) / scale
    pred = x @ coeffs
    mape = float(np.mean(np.abs(pred - y) / y))
    if mape > max_mape:
        return FittedModel(prior, None, n, f"fit error {mape:.1%} > {max_mape:.1%}", mape)
    return FittedModel(prior, tuple(float(c) for c in coeffs), n, "", mape)


def _nnls(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """argmin ||x·c - y|| over c >= 0, by trying every set of free columns (few columns)."""
    cols = x.shape[1]
    best = np.zeros(cols)
    best_err = float(np.sum(y * y))
    for mask in range(1, 1 << cols):
        free = [j for j in range(cols) if mask >> j & 1]
        sol, *_ = np.linalg.lstsq(x[:, free], y, rcond=None)
        if np.any(sol < 0):
            continue
        err = float(np.sum((x[:, free] @ sol - y) ** 2))
        if err < best_err:
            best_err = err
            best = np.zeros(cols)
            best[free] = sol
    return best
