"""From a point prediction to a prediction at a class's percentile: empirical tail ratios.

An SLO class states its TTFT / TPOT targets at a percentile (p50, p90, p99). The router's
latency predictions (queue drain, decode step cost) are point estimates; a p99 class needs the
value that 99 % of requests stay under. `TailRatios` keeps the most recent ratios
actual / predicted (observed per finished request) and answers

    factor(q) = the q-quantile of those ratios

so `predicted x factor(q)` is the prediction at percentile q (a split-conformal style
calibration: the residual distribution of the predictor itself, no distribution assumed). A p99
class thus gets a larger factor than a p50 class as soon as predictions scatter at all.

Until `min_samples` ratios are in, `factor` is 1 (the point prediction, for every percentile:
without observations there is no tail to calibrate on). Factors are clamped to
[`min_factor`, `max_factor`] so one wild observation cannot stall or open admission.
Pure: no clock, no I/O.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from dataclasses import dataclass, field


@dataclass(slots=True)
class TailRatios:
    window: int = 512
    min_samples: int = 20
    min_factor: float = 0.25
    max_factor: float = 20.0
    _ratios: deque[float] = field(default_factory=deque)
    _sorted: list[float] = field(default_factory=list)

    def observe(self, predicted_s: float, actual_s: float) -> None:
        if not predicted_s > 0 or not actual_s >= 0 or not math.isfinite(actual_s):
            return
        if not math.isfinite(predicted_s):
            return
        r = actual_s / predicted_s
        self._ratios.append(r)
        bisect.insort(self._sorted, r)
        if len(self._ratios) > self.window:
            old = self._ratios.popleft()
            del self._sorted[bisect.bisect_left(self._sorted, old)]

    def __len__(self) -> int:
        return len(self._ratios)

    def factor(self, percentile: float) -> float:
        """The `percentile` (in (0, 1]) quantile of actual / predicted; 1 before `min_samples`."""
        n = len(self._sorted)
        if n < self.min_samples:
            return 1.0
        q = min(1.0, max(0.0, percentile))
        k = min(n - 1, max(0, math.ceil(q * n) - 1))  # the empirical (nearest-rank) quantile
        return min(self.max_factor, max(self.min_factor, self._sorted[k]))
