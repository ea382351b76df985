"""The predictor Protocol and the query it answers.

A prediction is the *total* output length (tokens) a request will have when it finishes, given
what is known now: its prompt length, how many tokens it has generated, and its `max_tokens` cap.
Every predictor returns a value in [max(1, generated_tokens), max_tokens] (`clamp_prediction`).
Predictors learn from finished requests through `observe`; the caller decides what to feed (the
Past-Future spec excludes aborted, truncated requests).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from splitserve.core.ids import RequestId


@dataclass(frozen=True, slots=True)
class LengthQuery:
    request_id: RequestId
    num_prompt_tokens: int
    num_generated_tokens: int
    """Output tokens produced so far (0 before the first token)."""
    max_tokens: int
    """The request's output cap: no prediction exceeds it."""

    def __post_init__(self) -> None:
        if self.num_prompt_tokens < 0 or self.num_generated_tokens < 0 or self.max_tokens < 1:
            raise ValueError("token counts must be >= 0 and max_tokens >= 1")


def clamp_prediction(total_tokens: int, query: LengthQuery) -> int:
    """Clip a predicted total output length into [max(1, generated), max_tokens]."""
    low = max(1, query.num_generated_tokens)
    high = max(low, query.max_tokens)
    return min(high, max(low, total_tokens))


class OutputLengthPredictor(Protocol):
    """Predicts a request's total output length; learns from finished requests."""

    def predict(self, query: LengthQuery) -> int:
        """Total output tokens expected at finish, in [max(1, generated), max_tokens]."""
        ...

    def observe(self, num_prompt_tokens: int, num_output_tokens: int) -> None:
        """A request finished with this prompt and this many output tokens."""
        ...
