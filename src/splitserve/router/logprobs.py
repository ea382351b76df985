"""Log probabilities in OpenAI's response shapes, exactly as vLLM's OpenAI server writes them.

The engine returns, per output token, the sampled token's log probability and the k most likely
tokens at its position (`TokenLogprobs`: the sampled token first, then the others by rank, the
sampled one not repeated). This module turns them into:

* chat (`logprobs: true`, `top_logprobs: k`): `{"content": [{token, logprob, bytes,
  top_logprobs: [{token, logprob, bytes}, ...]}]}`. As vLLM, `top_logprobs` lists the first k
  entries of the position (the sampled token first, so it holds the k - 1 others when the
  sampled token is not among the k most likely).
* completions (`logprobs: k`): `{tokens, token_logprobs, top_logprobs: [{token: logprob}],
  text_offset}`, `top_logprobs` with up to k + 1 entries (vLLM's; OpenAI's API says "the k
  most likely, plus the sampled one"), `text_offset` counted in characters of the token strings
  from where this chunk starts.

A token's string is the tokenizer's decoding of that one id, special tokens kept (vLLM's
`decoded_token`); log probabilities below -9999 (including -inf) are written as -9999.0, as
vLLM does, so the body stays JSON.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final, Protocol

from splitserve.core.request import TokenLogprobs

MAX_LOGPROBS: Final = 20
"""The most `logprobs` / `top_logprobs` a request may ask for (vLLM's default `max_logprobs`)."""
_FLOOR: Final = -9999.0


class _Decoder(Protocol):
    def decode(self, token_ids: Sequence[int], *, skip_special_tokens: bool = True) -> str: ...


class LogprobsFormatter:
    """The `logprobs` body of each chunk (or of the whole answer) of one response."""

    def __init__(self, tokenizer: _Decoder, *, chat: bool, top: int, as_ids: bool = False) -> None:
        """`as_ids`: a token's string is `token_id:N` (vLLM's `return_tokens_as_token_ids`)."""
        self.tokenizer = tokenizer
        self.as_ids = as_ids
        self.chat = chat
        self.top = top
        """Chat: `top_logprobs`; completions: `logprobs`."""
        self._strings: dict[int, str] = {}
        self._offset = 0
        """Completions: where the next chunk's `text_offset` starts."""

    def token(self, token_id: int) -> str:
        s = self._strings.get(token_id)
        if s is None:
            if self.as_ids:
                s = self._strings[token_id] = f"token_id:{token_id}"
            else:
                s = self._strings[token_id] = self.tokenizer.decode(
                    [token_id], skip_special_tokens=False
                )
        return s

    def body(
        self,
        token_ids: Sequence[int],
        logprobs: Sequence[TokenLogprobs],
        text_start: int | None = None,
    ) -> dict[str, Any]:
        """The `logprobs` value for these tokens (the next ones of the response).

        `text_start`: completions streamed, the characters of text sent before this chunk (where
        vLLM starts the chunk's `text_offset`); None: go on from the previous chunk's tokens.
        """
        if text_start is not None:
            self._offset = text_start
        if len(logprobs) != len(token_ids):
            raise ValueError(f"{len(token_ids)} tokens but {len(logprobs)} log-probability entries")
        return (
            self._chat(token_ids, logprobs) if self.chat else self._completion(token_ids, logprobs)
        )

    def _entries(self, lp: TokenLogprobs) -> list[tuple[str, float]]:
        return [
            (self.token(t), max(v, _FLOOR)) for t, v in zip(lp.token_ids, lp.logprobs, strict=True)
        ]

    @staticmethod
    def _sampled(token_id: int, lp: TokenLogprobs) -> float:
        for t, v in zip(lp.token_ids, lp.logprobs, strict=True):
            if t == token_id:
                return max(v, _FLOOR)
        raise ValueError(f"the engine returned no log probability for token {token_id}")

    def _chat(self, token_ids: Sequence[int], logprobs: Sequence[TokenLogprobs]) -> dict[str, Any]:
        content = []
        for token_id, lp in zip(token_ids, logprobs, strict=True):
            token = self.token(token_id)
            top = [
                {"token": s, "logprob": v, "bytes": list(s.encode("utf-8", errors="replace"))}
                for s, v in self._entries(lp)[: self.top]
            ]
            content.append(
                {
                    "token": token,
                    "logprob": self._sampled(token_id, lp),
                    "bytes": list(token.encode("utf-8", errors="replace")),
                    "top_logprobs": top,
                }
            )
        return {"content": content}

    def _completion(
        self, token_ids: Sequence[int], logprobs: Sequence[TokenLogprobs | None]
    ) -> dict[str, Any]:
        """Completions' shape; a position without log probabilities (an echoed prompt's first)
        has null `token_logprobs` and `top_logprobs`, as vLLM writes it."""
        tokens: list[str] = []
        token_logprobs: list[float | None] = []
        top: list[dict[str, float] | None] = []
        offsets: list[int] = []
        for token_id, lp in zip(token_ids, logprobs, strict=True):
            token = self.token(token_id)
            tokens.append(token)
            token_logprobs.append(None if lp is None else self._sampled(token_id, lp))
            top.append(None if lp is None else dict(self._entries(lp)[: self.top + 1]))
            offsets.append(self._offset)
            self._offset += len(token)
        return {
            "text_offset": offsets,
            "token_logprobs": token_logprobs,
            "tokens": tokens,
            "top_logprobs": top,
        }

    def echoed(
        self,
        prompt_ids: Sequence[int],
        prompt: Sequence[TokenLogprobs | None],
        token_ids: Sequence[int],
        logprobs: Sequence[TokenLogprobs],
    ) -> dict[str, Any]:
        """Completions with `echo`: the prompt's tokens, then the answer's, in one body, as
        vLLM writes it (the prompt's first position has no log probabilities)."""
        if len(prompt) != len(prompt_ids):
            raise ValueError(
                f"{len(prompt_ids)} prompt tokens but {len(prompt)} log-probability entries"
            )
        self._offset = 0
        return self._completion([*prompt_ids, *token_ids], [*prompt, *logprobs])

    def prompt_body(
        self, prompt_ids: Sequence[int], prompt: Sequence[TokenLogprobs | None]
    ) -> list[dict[str, dict[str, Any]] | None]:
        """vLLM's `prompt_logprobs`: per prompt position, null (the first) or `{token id:
        {logprob, rank, decoded_token}}`, the prompt's token first, then the most likely by
        rank."""
        out: list[dict[str, dict[str, Any]] | None] = []
        for token_id, lp in zip(prompt_ids, prompt, strict=True):
            if lp is None:
                out.append(None)
                continue
            ranks = (r for r in range(1, len(lp.token_ids) + 2) if r != lp.rank)
            entry: dict[str, dict[str, Any]] = {}
            for i, (t, v) in enumerate(zip(lp.token_ids, lp.logprobs, strict=True)):
                rank = lp.rank if i == 0 and t == token_id else next(ranks)
                entry[str(t)] = {
                    "logprob": max(v, _FLOOR),
                    "rank": rank,
                    "decoded_token": self.token(t),
                }
            out.append(entry)
        return out
