"""The `LatencyModel` protocol and the batch shape it prices."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Protocol


@dataclass(slots=True, init=False, unsafe_hash=True)
class BatchShape:
    """One engine step: prefill chunks and decode sequences run together.

    Attributes:
        prefill_chunks: (new_tokens, context_tokens_before_chunk) per prefilling request.
        decode_contexts: context length (tokens already in KV) per decoding request; each
            decodes one token this step.
    """

    prefill_chunks: Final[tuple[tuple[int, int], ...]]
    decode_contexts: Final[tuple[int, ...]]

    def __init__(
        self,
        prefill_chunks: tuple[tuple[int, int], ...] = (),
        decode_contexts: tuple[int, ...] = (),
    ) -> None:
        self.prefill_chunks = prefill_chunks
        self.decode_contexts = decode_contexts

    @property
    def num_new_tokens(self) -> int:
        return sum(n for n, _ in self.prefill_chunks) + len(self.decode_contexts)

    @property
    def is_empty(self) -> bool:
        return not self.prefill_chunks and not self.decode_contexts


class LatencyModel(Protocol):
    """Prices engine steps. Pure: the same shape always costs the same.

    Implementations must return a positive, finite number of seconds for any non-empty batch and
    be monotone: adding work to a batch never makes it cheaper.
    """

    @property
    def ready(self) -> bool:
        """False when the model has too little data to be trusted (e.g. an online fit)."""
        ...

    def step_s(self, batch: BatchShape) -> float:
        """Seconds one engine step takes for `batch`."""
        ...

    def kv_transfer_s(self, num_bytes: int) -> float:
        """Seconds to move `num_bytes` of KV cache from a prefill worker to a decode worker."""
        ...
