"""The oracle predictor: true output lengths, known only to the simulator.

Used for the Past-Future "theoretical optimum" and ALISE's oracle upper bound. Unknown request
ids fall back to `max_tokens` (the conservative answer), so an oracle never under-reserves. In
the simulator a request's `max_tokens` *is* its true output length (stop tokens never match), so
`OraclePredictor()` with no table is exact there: it is what `make_predictor("oracle")` gives a
simulated engine.
"""

from __future__ import annotations

from collections.abc import Mapping

from splitserve.core.ids import RequestId
from splitserve.policy.predict.base import LengthQuery, clamp_prediction


class OraclePredictor:
    def __init__(self, true_output_tokens: Mapping[RequestId, int] | None = None) -> None:
        self._truth = dict(true_output_tokens or {})

    def predict(self, query: LengthQuery) -> int:
        return clamp_prediction(self._truth.get(query.request_id, query.max_tokens), query)

    def observe(self, num_prompt_tokens: int, num_output_tokens: int) -> None:
        """The oracle learns nothing."""


class NoisyOraclePredictor:
    """The truth times (1 + e), e ~ Uniform(-2 * error, 2 * error): mean |e| = `error`.

    A stand-in for a good learned predictor with a known accuracy (ALISE's retrieval predictor
    reports a 9.2 % mean relative error on ShareGPT, Table 2). Draws come from its own seeded
    RNG, one per prediction, so a run is deterministic for a seed and arrival order.
    """

    def __init__(
        self,
        relative_error: float,
        seed: int = 0,
        true_output_tokens: Mapping[RequestId, int] | None = None,
    ) -> None:
        if not 0.0 <= relative_error < 0.5:
            raise ValueError(f"relative_error must be in [0, 0.5), got {relative_error}")
        import random

        self.relative_error = relative_error
        self._oracle = OraclePredictor(true_output_tokens)
        self._rng = random.Random(seed)

    def predict(self, query: LengthQuery) -> int:
        truth = self._oracle.predict(query)
        e = self.relative_error
        noisy = round(truth * (1.0 + self._rng.uniform(-2.0 * e, 2.0 * e)))
        low = max(1, query.num_generated_tokens)
        return max(low, noisy)  # may exceed max_tokens: the cap is the truth in the simulator

    def observe(self, num_prompt_tokens: int, num_output_tokens: int) -> None:
        """Learns nothing."""
