"""Deterministic synthetic tokens for the simulated engine.

The token at output position i depends only on the prompt, the sampling seed and i, so a request
decoded on another worker after a prefill (P/D) produces exactly the tokens the same request
produces aggregated on one worker.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

_MASK = (1 << 64) - 1


def _mix(x: int) -> int:
    """splitmix64 finaliser: a well-spread 64-bit hash step."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


@dataclass(frozen=True, slots=True)
class SyntheticTokens:
    vocab_size: int
    first_id: int = 0
    """Lowest id produced (skip special tokens that sit at the bottom of a vocabulary)."""
    allowed_ids: tuple[int, ...] = ()
    """When given, tokens are drawn from these ids only (e.g. ids that decode to whole
    characters, so simulated text never shows U+FFFD); `first_id` is then unused."""

    def __post_init__(self) -> None:
        if not 0 <= self.first_id < self.vocab_size:
            raise ValueError(
                f"need 0 <= first_id < vocab_size, got {self.first_id}, {self.vocab_size}"
            )
        if any(not 0 <= i < self.vocab_size for i in self.allowed_ids):
            raise ValueError(f"allowed_ids must lie in [0, {self.vocab_size})")

    def key(self, prompt_token_ids: Sequence[int], seed: int | None) -> int:
        h = _mix(len(prompt_token_ids) ^ ((seed or 0) << 1))
        for t in prompt_token_ids:
            h = _mix(h ^ t)
        return h

    def token(self, key: int, index: int) -> int:
        h = _mix(key ^ (index * 0xD1B54A32D192ED03 & _MASK))
        if self.allowed_ids:
            return self.allowed_ids[h % len(self.allowed_ids)]
        return self.first_id + h % (self.vocab_size - self.first_id)
