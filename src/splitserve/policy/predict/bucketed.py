"""A bucketed output-length classifier (ALISE-style length buckets, no ML framework).

ALISE (Zhao & Wang, ICCAD'24, §III-A) predicts a length per request with a BERT embedding, a
vector-DB lookup and an MLP fallback, and scores accuracy by whether the prediction lands in the
same evenly divided length bin as the truth. Without an encoder, the only request feature we have
is the prompt length, so this model is a count table: P(output bin | prompt bin), learned online
from finished (prompt_len, output_len) pairs (the paper's "online DB update"). Prompt bins are
powers of two (prompt lengths span orders of magnitude); output bins are `output_bin_tokens`
wide (the paper's even bins), or, with `log_bins_per_octave` = k > 0, log-spaced: k bins per
doubling of the length (bin b holds the lengths n with floor(k log2 n) = b), so a short answer
is not reported at the middle of a 64-token bin (a 7-token answer: 32 with even bins; with
k = 2, its bin holds 6 and 7). The prediction is the `quantile` (default 0.5: the *median*) output
bin among bins that can still hold the answer (upper edge > generated tokens), reported at its
midpoint (a lower quantile is the pessimistic side for a cost spread over the answer's gaps, such
as a KV pull; the optimistic one for anything sized by the length); a prompt bin with fewer
than `min_samples` observations, or with no bin left above the generated length, defers to the
table over all prompts, and when that has nothing either the answer is `max_tokens`. This is a
documented stand-in, not the paper's retrieval model.

Invariants tested: predictions lie in [max(1, generated), max_tokens]; with one dominant output
bin per prompt bin, the prediction lands in it; predictions rise (weakly) with `quantile`.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

from splitserve.policy.predict.base import LengthQuery, clamp_prediction


@dataclass(frozen=True, slots=True)
class BucketedParams:
    output_bin_tokens: int = 64
    """Width of one output-length bin."""
    min_samples: int = 8
    """Observations a prompt bin needs before its own table is trusted."""
    log_bins_per_octave: int = 0
    """0: even output bins of `output_bin_tokens`; k >= 1: k log-spaced bins per doubling
    (`output_bin_tokens` is then unused)."""
    quantile: float = 0.5
    """Which output bin is reported: the first (in length order) whose cumulative count reaches
    this share of the live bins' total; 0.5 is the median bin, lower is shorter."""

    def __post_init__(self) -> None:
        if self.output_bin_tokens < 1 or self.min_samples < 1:
            raise ValueError("output_bin_tokens and min_samples must be >= 1")
        if self.log_bins_per_octave < 0:
            raise ValueError(
                f"log_bins_per_octave must be >= 0 (0: even bins), got {self.log_bins_per_octave}"
            )
        if not 0.0 < self.quantile <= 1.0:
            raise ValueError(f"quantile must be in (0, 1], got {self.quantile}")


def prompt_bin(num_prompt_tokens: int) -> int:
    """Power-of-two bin of a prompt length (0 for 0 or 1 token)."""
    return max(0, num_prompt_tokens - 1).bit_length()


class BucketedPredictor:
    def __init__(self, params: BucketedParams | None = None) -> None:
        self.params = params or BucketedParams()
        self._by_prompt: dict[int, Counter[int]] = {}
        self._all: Counter[int] = Counter()

    def output_bin(self, num_output_tokens: int) -> int:
        k = self.params.log_bins_per_octave
        if not k:
            return (num_output_tokens - 1) // self.params.output_bin_tokens
        b = math.floor(k * math.log2(max(1, num_output_tokens)))
        # Float rounding near an edge: settle on the bin whose integer range holds it.
        while b > 0 and self.bin_range(b)[0] > num_output_tokens:
            b -= 1
        while self.bin_range(b + 1)[0] <= num_output_tokens:
            b += 1
        return b

    def bin_range(self, b: int) -> tuple[int, int]:
        """The lengths output bin `b` holds: [first, end) (a log bin narrower than one token
        holds none: first == end)."""
        k = self.params.log_bins_per_octave
        if not k:
            w = self.params.output_bin_tokens
            return (b * w + 1, (b + 1) * w + 1)
        return (math.ceil(2 ** (b / k)), math.ceil(2 ** ((b + 1) / k)))

    def observe(self, num_prompt_tokens: int, num_output_tokens: int) -> None:
        if num_output_tokens < 1:
            raise ValueError(f"an output length must be >= 1, got {num_output_tokens}")
        b = self.output_bin(num_output_tokens)
        self._by_prompt.setdefault(prompt_bin(num_prompt_tokens), Counter())[b] += 1
        self._all[b] += 1

    def predict(self, query: LengthQuery) -> int:
        own = self._by_prompt.get(prompt_bin(query.num_prompt_tokens))
        tables = [self._all]
        if own is not None and own.total() >= self.params.min_samples:
            tables.insert(0, own)
        for table in tables:
            got = self._quantile_live_bin(table, query.num_generated_tokens)
            if got is not None:
                return clamp_prediction(got, query)
        return clamp_prediction(query.max_tokens, query)

    def _quantile_live_bin(self, table: Counter[int], done_tokens: int) -> int | None:
        """Midpoint of the `quantile` bin among bins that hold a length above `done_tokens`."""
        q = self.params.quantile
        if not self.params.log_bins_per_octave:  # even bins: no range calls
            width = self.params.output_bin_tokens
            live = sorted((b, n) for b, n in table.items() if (b + 1) * width > done_tokens)
            total = sum(n for _, n in live)
            seen = 0
            for b, n in live:
                seen += n
                if seen >= q * total:
                    return b * width + (width + 1) // 2
            return None
        ranges = {b: self.bin_range(b) for b in table}
        live = sorted((b, n) for b, n in table.items() if ranges[b][1] - 1 > done_tokens)
        total = sum(n for _, n in live)
        seen = 0
        for b, n in live:
            seen += n
            if seen >= q * total:
                first, end = ranges[b]
                return (first + end) // 2
        return None
