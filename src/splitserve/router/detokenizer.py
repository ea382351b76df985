"""Incremental detokenization: token ids in, text deltas out.

Uses prefix/read offsets as vLLM does. Each step decodes the window `ids[prefix:]` and emits what
lies beyond the text of `ids[prefix:read]`; decoding from a little way back keeps tokenizers that
strip a leading space (sentencepiece) right, and holding back while the window ends in U+FFFD keeps
a multi-byte character split across tokens from ever reaching the client half-done.
Invariant: the concatenation of every delta plus `flush()` equals the decode of all the ids.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, Protocol

_REPLACEMENT: Final = "\ufffd"
INITIAL_CONTEXT_TOKENS: Final = 5
"""Prompt tokens decoded ahead of the first output token, for its leading-space handling."""


class Decoder(Protocol):
    def decode(self, token_ids: Sequence[int], *, skip_special_tokens: bool = True) -> str: ...


class IncrementalDetokenizer:
    """Turns a growing sequence of output token ids into text deltas."""

    def __init__(
        self,
        decoder: Decoder,
        context_ids: Sequence[int] = (),
        *,
        skip_special_tokens: bool = True,
    ) -> None:
        """Args:
        decoder: anything with `decode(ids, skip_special_tokens=...)`.
        context_ids: the tail of the prompt, decoded for context only (never emitted).
        skip_special_tokens: drop special tokens (end of text, ...) from the text.
        """
        self._decoder = decoder
        self._skip = skip_special_tokens
        self._ids: list[int] = list(context_ids)
        self._prefix = 0
        self._read = len(self._ids)

    def _decode(self, ids: Sequence[int]) -> str:
        return self._decoder.decode(ids, skip_special_tokens=self._skip)

    def push(self, token_ids: Sequence[int]) -> str:
        """Add tokens; return the text that is now final (may be empty)."""
        self._ids.extend(token_ids)
        if not token_ids:
            return ""
        prefix_text = self._decode(self._ids[self._prefix : self._read])
        new_text = self._decode(self._ids[self._prefix :])
        if len(new_text) <= len(prefix_text) or new_text.endswith(_REPLACEMENT):
            # Nothing new yet, or a character is still incomplete: wait for more tokens.
            return ""
        self._prefix, self._read = self._read, len(self._ids)
        return new_text[len(prefix_text) :]

    def flush(self) -> str:
        """The text still held back (an incomplete character at the very end); call once, last."""
        prefix_text = self._decode(self._ids[self._prefix : self._read])
        new_text = self._decode(self._ids[self._prefix :])
        self._prefix = self._read = len(self._ids)
        return new_text[len(prefix_text) :]
