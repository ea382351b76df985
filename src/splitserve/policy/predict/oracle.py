"""The oracle predictor: true output lengths, known only to the simulator.

Used for the Past-Future "theoretical optimum" and ALISE's oracle upper bound. Unknown request
ids fall back to `max_tokens` (the conservative answer), so an oracle never under-reserves.
"""

from __future__ import annotations

from collections.abc import Mapping

from splitserve.core.ids import RequestId
from splitserve.policy.predict.base import LengthQuery, clamp_prediction


class OraclePredictor:
    def __init__(self, true_output_tokens: Mapping[RequestId, int]) -> None:
        self._truth = dict(true_output_tokens)

    def predict(self, query: LengthQuery) -> int:
        return clamp_prediction(self._truth.get(query.request_id, query.max_tokens), query)

    def observe(self, num_prompt_tokens: int, num_output_tokens: int) -> None:
        """The oracle learns nothing."""
