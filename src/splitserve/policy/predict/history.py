"""The history-distribution predictor (Past-Future, Gong et al. §3.2, Eq. 1).

`HistoryWindow` is a FIFO of the last `window` finished output lengths; its empirical pmf is
P(l) = C(l, L_h) / w. Cold start (paper §3.2): the window begins with `window // 2` copies of the
configured output cap, which weigh half after `window // 2` completions and are gone after
`window`. The window keeps a sorted copy so quantiles and conditional samples cost O(log w).

Samplers (exactly the authors' artifact, WuSiYu/lightllm-ae, see research/seed-pastfuture-alise.md
§A.3): a running request with `l_t` generated tokens draws from P(l | l > l_t) by piecewise-linear
interpolation over [l_t] + {h in L_h : h > l_t} + [max(cap, last)], which falls back to
Uniform[l_t, cap] when nothing in the window exceeds l_t; a new request draws uniformly from L_h.

Invariants tested: len <= window; quantile(q) is non-decreasing in q; a conditional sample is
never below l_t nor above max(cap, max(L_h)).
"""

from __future__ import annotations

import bisect
import math
import random
from collections import deque

from splitserve.policy.predict.base import LengthQuery, clamp_prediction


class HistoryWindow:
    def __init__(self, window: int = 1000, cold_start_tokens: int | None = None) -> None:
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.window = window
        self._fifo: deque[int] = deque()
        self._sorted: list[int] = []
        if cold_start_tokens is not None:
            for _ in range(max(1, window // 2)):
                self.add(cold_start_tokens)

    def __len__(self) -> int:
        return len(self._fifo)

    @property
    def sorted_lengths(self) -> tuple[int, ...]:
        return tuple(self._sorted)

    def add(self, num_output_tokens: int) -> None:
        if num_output_tokens < 1:
            raise ValueError(f"an output length must be >= 1, got {num_output_tokens}")
        if len(self._fifo) == self.window:
            old = self._fifo.popleft()
            del self._sorted[bisect.bisect_left(self._sorted, old)]
        self._fifo.append(num_output_tokens)
        bisect.insort(self._sorted, num_output_tokens)

    def observe(self, num_prompt_tokens: int, num_output_tokens: int) -> None:
        """Past-Future ignores the prompt: only the output length enters the window."""
        self.add(num_output_tokens)

    def quantile(self, q: float) -> int:
        """Nearest-rank quantile of the window (monotone in q). Raises on an empty window."""
        if not self._sorted:
            raise ValueError("empty history window")
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"q must be in [0, 1], got {q}")
        n = len(self._sorted)
        return self._sorted[min(n - 1, max(0, math.ceil(q * n) - 1))]

    def sample_new(self, rng: random.Random) -> int:
        """A new request's total output length: a uniform draw from the window."""
        if not self._sorted:
            raise ValueError("empty history window")
        return self._sorted[rng.randrange(len(self._sorted))]

    def sample_given(self, generated_tokens: int, cap_tokens: int, rng: random.Random) -> int:
        """A total output length drawn from P(l | l > generated), the artifact's sampler."""
        his = self._sorted
        anchors = [generated_tokens, *his[bisect.bisect_right(his, generated_tokens) :]]
        anchors.append(max(cap_tokens, anchors[-1]))
        u = rng.random() * (len(anchors) - 1)
        i = min(int(u), len(anchors) - 2)
        return round(anchors[i] + (anchors[i + 1] - anchors[i]) * (u - i))


class HistoryPredictor:
    """Point predictions from a `HistoryWindow`: the `quantile` of P(l | l > generated).

    Past-Future itself samples (see `HistoryWindow.sample_given`); this point form serves callers
    that need one number (e.g. a router's headroom estimate). Empty conditional -> `max_tokens`.
    """

    def __init__(self, window: HistoryWindow, quantile: float = 0.5) -> None:
        if not 0.0 <= quantile <= 1.0:
            raise ValueError(f"quantile must be in [0, 1], got {quantile}")
        self.history = window
        self.quantile = quantile

    def predict(self, query: LengthQuery) -> int:
        his = self.history.sorted_lengths
        above = his[bisect.bisect_right(his, query.num_generated_tokens) :]
        if not above:
            return clamp_prediction(query.max_tokens, query)
        idx = min(len(above) - 1, max(0, math.ceil(self.quantile * len(above)) - 1))
        return clamp_prediction(above[idx], query)

    def observe(self, num_prompt_tokens: int, num_output_tokens: int) -> None:
        self.history.observe(num_prompt_tokens, num_output_tokens)
