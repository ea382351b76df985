"""Deterministic synthetic tokens for the simulated engine.

The token at output position i depends only on the prompt, the sampling seed and i, so a request
decoded on another worker after a prefill (P/D) produces exactly the tokens the same request
produces aggregated on one worker.

With an end-of-text id and an answer length (`eos_id`, `answer_median`) the engine also ends its
answers by itself, as a model does: each request's answer length is drawn from a lognormal around
`answer_median` keyed by the same hash, so P and D agree on where it ends. `ignore_eos` moves the
end out of reach, `min_tokens` moves it back to the first position allowed, and keeps stop tokens
out of the first `min_tokens` positions too (vLLM's `min_tokens` masks both).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from splitserve.core.request import SamplingSpec

DEFAULT_EOS_TOKEN_ID: Final = 1
"""`<|end_of_text|>` of the default tokenizer (`router.tokenizer.default_tokenizer_dir`, whose
special tokens take ids 0-5; a test holds the two together)."""
DEFAULT_ANSWER_TOKENS: Final = 128
"""Median answer length of the simulated engine: the bundled Azure LLM inference 2023
conversation trace's (`sim/traces/azure_llm_2023_conv.csv`, 19,366 answers: median 129 tokens,
p10 54, p90 424). Its code trace answers far shorter (median 13): `--sim-answer-tokens` sets
another median. A test holds these constants to the trace."""
DEFAULT_ANSWER_SIGMA: Final = 0.86
"""Log-space spread of the answer length: the conversation trace's (standard deviation of the
log lengths 0.859). The trace is not exactly lognormal (its mean log length is 151 tokens, its
median 129); the median and the spread are what a lognormal keeps of it."""

_MASK = (1 << 64) - 1
_LENGTH_SALT = 0x6A09E667F3BCC909
"""Separates the answer-length draw from the token draws of the same key."""
_REDRAW_SALT = 0xBB67AE8584CAA73B
_REDRAWS = 64
"""Draws before a masked token is let through (only when nearly every id is masked)."""


def _mix(x: int) -> int:
    """splitmix64 finaliser: a well-spread 64-bit hash step."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def _unit(h: int) -> float:
    """A hash as a float in (0, 1)."""
    return ((h >> 11) + 0.5) / float(1 << 53)


@dataclass(frozen=True, slots=True)
class SyntheticTokens:
    vocab_size: int
    first_id: int = 0
    """Lowest id produced (skip special tokens that sit at the bottom of a vocabulary)."""
    allowed_ids: tuple[int, ...] = ()
    """When given, tokens are drawn from these ids only (e.g. ids that decode to whole
    characters, so simulated text never shows U+FFFD); `first_id` is then unused."""
    eos_id: int | None = None
    """The end-of-text token the engine emits where an answer ends; None: answers never end by
    themselves (they run to `max_tokens`)."""
    answer_median: int = 0
    """Median answer length in tokens (lognormal); 0: answers never end by themselves."""
    answer_sigma: float = 1.0
    """Log-space spread of the answer length (ShareGPT-like answers: about 1)."""

    def __post_init__(self) -> None:
        if not 0 <= self.first_id < self.vocab_size:
            raise ValueError(
                f"need 0 <= first_id < vocab_size, got {self.first_id}, {self.vocab_size}"
            )
        if any(not 0 <= i < self.vocab_size for i in self.allowed_ids):
            raise ValueError(f"allowed_ids must lie in [0, {self.vocab_size})")
        if self.answer_median < 0:
            raise ValueError(f"answer_median must be >= 0, got {self.answer_median}")
        if not 0 <= self.answer_sigma <= 4:
            raise ValueError(f"answer_sigma must be in [0, 4], got {self.answer_sigma}")
        if self.answer_median and self.eos_id is None:
            raise ValueError("an answer length needs the end-of-text id (eos_id)")
        if self.eos_id is not None and self.eos_id < 0:
            # Not bounded by vocab_size: that bounds the drawn ids, and some vocabularies keep
            # their special tokens above them (Llama 3's end of text is 128001 of 128000 + 256).
            raise ValueError(f"eos_id must be >= 0, got {self.eos_id}")

    def key(self, prompt_token_ids: Sequence[int], seed: int | None) -> int:
        h = _mix(len(prompt_token_ids) ^ ((seed or 0) << 1))
        for t in prompt_token_ids:
            h = _mix(h ^ t)
        return h

    def token(self, key: int, index: int) -> int:
        """The drawn token at output position `index`, before `at` places the end of text."""
        h = _mix(key ^ (index * 0xD1B54A32D192ED03 & _MASK))
        if self.allowed_ids:
            return self.allowed_ids[h % len(self.allowed_ids)]
        return self.first_id + h % (self.vocab_size - self.first_id)

    def answer_length(self, key: int) -> int:
        """The answer's natural length (>= 1) for this key; 0 when answers never end."""
        if not self.answer_median:
            return 0
        h1 = _mix(key ^ _LENGTH_SALT)
        h2 = _mix(h1)
        z = math.sqrt(-2.0 * math.log(_unit(h1))) * math.cos(2.0 * math.pi * _unit(h2))
        return max(1, round(self.answer_median * math.exp(self.answer_sigma * z)))

    def end_index(self, key: int, sampling: SamplingSpec) -> int:
        """Output position of the end-of-text token for this request; -1: none (no answer
        length, `ignore_eos`, or the end lies past `max_tokens`)."""
        n = self.answer_length(key)
        if not n or sampling.ignore_eos:
            return -1
        end = max(n - 1, sampling.min_tokens)
        return end if end < sampling.max_tokens else -1

    def at(self, key: int, index: int, sampling: SamplingSpec, end: int) -> int:
        """The token emitted at `index` for a request whose `end_index` is `end`.

        The end-of-text id appears only at `end`; before `min_tokens` a drawn stop token is drawn
        again (vLLM masks stop tokens there).
        """
        if index == end:
            assert self.eos_id is not None  # end >= 0 only with an answer length
            return self.eos_id
        t = self.token(key, index)
        masked = sampling.stop_token_ids if index < sampling.min_tokens else ()
        salt = key
        for _ in range(_REDRAWS):
            if t != self.eos_id and t not in masked:
                break
            salt = _mix(salt ^ _REDRAW_SALT)
            t = self.token(salt, index)
        return t
