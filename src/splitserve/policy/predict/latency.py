"""A worker's latency model, fitted online from what its owner observes (no wall clock here).

* `PrefillRate`: prompt tokens per second a worker computes, an exponentially weighted mean of
  (tokens the worker had to compute before this prompt's first token, incl. it) / (seconds to
  the first token), so queueing is in it;
* `StepFit`: decode step time = base + per_seq x batch, recursive least squares with forgetting
  over (batch size, mean time per output token) pairs;
* `PullRate`: prompt tokens per second a decode worker's KV pulls move, from the pull totals
  its load reports carry (`LoadReport.kv_pulled_tokens` / `kv_pull_seconds`, the worker's own
  measurement): an exponentially weighted mean of (tokens pulled since the last report that
  grew) / (pull seconds since then).

`PrefillRate` and `PullRate` share their mean's update (their base, `SmoothedRate`); all answer
0 until they have `min_samples` observations (the owner treats 0 as "no estimate").
These are the router's fallback, fitted from its own calls (TTFT of `Prefill`/`Generate`, TPOT
of streams) for workers whose engine does not report its steps; workers that do are modelled by
`step_model.OnlineStepModel` from their `WatchSteps` reports.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(slots=True)
class SmoothedRate:
    """A rate in tokens per second, an exponentially weighted mean of its samples: the first
    sample as is, then weight `alpha` on the newest. `PrefillRate` and `PullRate` differ only
    in how a sample is taken; both keep the mean here."""

    alpha: float = 0.2
    min_samples: int = 3
    _rate: float = 0.0
    _n: int = 0

    def add(self, rate: float) -> None:
        """One sample (tokens per second, > 0: the callers filter)."""
        self._rate = rate if self._n == 0 else (1 - self.alpha) * self._rate + self.alpha * rate
        self._n += 1

    @property
    def tokens_per_s(self) -> float:
        """The estimate; 0 (no estimate) before `min_samples` samples."""
        return self._rate if self._n >= self.min_samples else 0.0


@dataclass(slots=True)
class PrefillRate(SmoothedRate):
    alpha: float = 0.2
    min_samples: int = 3

    def observe(self, tokens: int, seconds: float) -> None:
        if tokens <= 0 or not seconds > 0 or not math.isfinite(seconds):
            return
        self.add(tokens / seconds)


@dataclass(slots=True)
class StepFit:
    """tpot ~ base + per_seq * batch, by recursive least squares with forgetting `lam`."""

    lam: float = 0.98
    min_samples: int = 3
    _theta: tuple[float, float] = (0.0, 0.0)
    _p: tuple[float, float, float] = (1e3, 0.0, 1e3)
    """The symmetric 2x2 covariance (p00, p01, p11)."""
    _n: int = 0
    _mean: float = 0.0

    def observe(self, batch: int, tpot_s: float) -> None:
        if batch < 1 or not tpot_s > 0 or not math.isfinite(tpot_s):
            return
        x0, x1 = 1.0, float(batch)
        p00, p01, p11 = self._p
        px0 = p00 * x0 + p01 * x1
        px1 = p01 * x0 + p11 * x1
        denom = self.lam + x0 * px0 + x1 * px1
        k0, k1 = px0 / denom, px1 / denom
        err = tpot_s - (self._theta[0] * x0 + self._theta[1] * x1)
        self._theta = (self._theta[0] + k0 * err, self._theta[1] + k1 * err)
        self._p = (
            (p00 - k0 * px0) / self.lam,
            (p01 - k0 * px1) / self.lam,
            (p11 - k1 * px1) / self.lam,
        )
        self._n += 1
        self._mean += (tpot_s - self._mean) / self._n

    @property
    def params(self) -> tuple[float, float]:
        """(base_s, per_seq_s), both >= 0; (0, 0) before `min_samples` observations.

        A fit that goes negative (too few distinct batch sizes) falls back to a flat mean.
        """
        if self._n < self.min_samples:
            return (0.0, 0.0)
        base, per = self._theta
        if base < 0 or per < 0:
            return (self._mean, 0.0)
        return (base, per)


@dataclass(slots=True)
class PullRate(SmoothedRate):
    """A worker's KV pull throughput in prompt tokens per second, from its reported totals.

    Each report whose totals grew adds one sample, (tokens pulled since the last one) /
    (seconds those pulls took): a ratio of sums over the pulls in between, so one report
    covering several pulls weighs them by their tokens. Samples are averaged with weight
    `alpha` on the newest. The first totals seen, and totals that fell (the worker restarted
    and counts from 0 again), only set the baseline. Approximations, stated: the rate divides
    each pull's tokens by its whole time, so a fixed cost per pull (link latency, a cold NIXL
    handshake) is spread over its tokens (short pulls look slower per token); and pulls that
    overlapped count their times in full, as if they had run one after another (the
    placement's `predicted_pull_s` queues the pending ones the same way).
    """

    alpha: float = 0.3
    min_samples: int = 2
    _tokens: int = -1
    """The last totals (tokens; -1: none yet)."""
    _seconds: float = 0.0

    def observe_totals(self, tokens: int, seconds: float) -> None:
        """A load report's pull totals (tokens pulled, seconds those pulls took, since the
        worker started)."""
        if tokens < 0 or not (seconds >= 0 and math.isfinite(seconds)):
            return
        first = self._tokens < 0
        d_tokens, d_seconds = tokens - self._tokens, seconds - self._seconds
        self._tokens, self._seconds = tokens, seconds
        if first or d_tokens <= 0 or d_seconds <= 0:
            return  # first seen, the worker restarted, or no pull finished since the last one
        self.add(d_tokens / d_seconds)
