"""A cheaper encode for ASCII text under GPT-2-style byte-level BPE tokenizers, same ids.

The Rust `tokenizers` library spends most of an encode outside the BPE merges: its
pre-tokenizer regex (Oniguruma, Unicode classes) and the `Encoding` it builds (offsets, token
strings) cost ~1-3 us per token on the router's machine. Here the same pre-tokenization runs as
a stdlib `re` over ASCII classes, and each pre-token's ids come from a per-word cache (most words
of a prompt recur), asking the Rust BPE model only for words not seen yet. The result is the
same as `Tokenizer.encode(text, add_special_tokens=False).ids`:

- only for text that is all ASCII (where Oniguruma's `\\p{L}`, `\\p{N}` and `\\s` and these
  ASCII classes agree); anything else is left to the Rust tokenizer (`encode` returns None);
- only for a tokenizer of exactly these shapes (`FastBpe.of` returns None otherwise): no
  normalizer or a Unicode normal form (NFC, NFD, NFKC, NFKD: each leaves ASCII as it is); a
  `ByteLevel` pre-tokenizer with its GPT-2 regex and no prefix space (GPT-2, the router's
  default tokenizer), or a `Split` by one of the known regexes of `_SPLIT_ASCII` (Llama 3,
  Qwen2) followed by a `ByteLevel` without its regex or a prefix space; a plain BPE model (no
  dropout, no affixes, no byte fallback), added tokens that strip nothing;
- added tokens (special or not) split the text first, longest first, as the Rust library does.

`tests/unit/router/test_fast_bpe.py` checks the equality over generated and real text.
"""

from __future__ import annotations

import json
import re
from typing import Any, Final

_GPT2_ASCII: Final = re.compile(
    r"""'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+""",
    re.ASCII,
)
"""The GPT-2 pre-tokenizer pattern of `ByteLevel(use_regex=True)`, its classes over ASCII."""

_SPLIT_ASCII: Final = {
    # Llama 3 (tiktoken's cl100k pattern): digits in runs of up to three.
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+": re.compile(
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\nA-Za-z0-9]?[A-Za-z]+|[0-9]{1,3}"
        r"| ?[^\sA-Za-z0-9]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        re.ASCII,
    ),
    # Qwen2: the same with single digits.
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+": re.compile(
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\nA-Za-z0-9]?[A-Za-z]+|[0-9]"
        r"| ?[^\sA-Za-z0-9]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        re.ASCII,
    ),
}
"""The `Split` pre-tokenizer regexes served, each with its classes over ASCII (`\\p{L}` is
A-Za-z there, `\\p{N}` 0-9, and Unicode's White_Space the six characters of `re.ASCII`'s
`\\s`). Every ASCII character matches one of the alternatives, so `Isolated` splitting leaves no
gap between matches: `findall` gives the same pieces."""

_ASCII_IDENTITY_NORMALIZERS: Final = frozenset({"NFC", "NFD", "NFKC", "NFKD"})
"""Normalizers that leave ASCII text unchanged."""

_MAX_CACHED_WORDS: Final = 1 << 16
_MAX_CACHED_WORD_CHARS: Final = 64


def _byte_to_char() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (ASCII part)."""
    printable = [*range(ord("!"), ord("~") + 1)]
    table: dict[int, str] = {b: chr(b) for b in printable}
    n = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + n)
            n += 1
    return {b: c for b, c in table.items() if b < 128}


_TO_BYTE_LEVEL: Final = str.maketrans(_byte_to_char())


class FastBpe:
    """`encode(text)` for ASCII text: the Rust tokenizer's ids, cheaper (None: not ASCII)."""

    def __init__(self, model: Any, added: dict[str, int], pattern: re.Pattern[str]) -> None:
        self._model = model
        self._pattern = pattern
        self._added = added
        self._split = (
            re.compile("|".join(re.escape(t) for t in sorted(added, key=len, reverse=True)))
            if added
            else None
        )
        self._words: dict[str, tuple[int, ...]] = {}

    @classmethod
    def of(cls, tokenizer: Any) -> FastBpe | None:
        """A fast path for this Rust `tokenizers.Tokenizer`, or None when its shape differs."""
        try:
            cfg = json.loads(tokenizer.to_str())
        except Exception:
            return None
        pattern = _pre_tokenizer_pattern(cfg.get("pre_tokenizer") or {})
        model = cfg.get("model") or {}
        normalizer = cfg.get("normalizer")
        if (
            (normalizer is not None and normalizer.get("type") not in _ASCII_IDENTITY_NORMALIZERS)
            or pattern is None
            or model.get("type") != "BPE"
            or model.get("dropout") not in (None, 0.0)
            or model.get("continuing_subword_prefix")
            or model.get("end_of_word_suffix")
            or model.get("byte_fallback")
        ):
            return None
        added: dict[str, int] = {}
        for tok in cfg.get("added_tokens") or []:
            if tok.get("lstrip") or tok.get("rstrip") or tok.get("single_word"):
                return None
            if not str(tok["content"]).isascii():
                return None  # a non-ASCII added token never appears in ASCII text anyway
            added[str(tok["content"])] = int(tok["id"])
        return cls(tokenizer.model, added, pattern)

    def encode(self, text: str) -> list[int] | None:
        """The ids of `text` (no special tokens added), or None when `text` is not ASCII."""
        if not text.isascii():
            return None
        ids: list[int] = []
        if self._split is None:
            self._encode_plain(text, ids)
            return ids
        pos = 0
        for match in self._split.finditer(text):
            if match.start() > pos:
                self._encode_plain(text[pos : match.start()], ids)
            ids.append(self._added[match.group(0)])
            pos = match.end()
        if pos < len(text):
            self._encode_plain(text[pos:], ids)
        return ids

    def _encode_plain(self, text: str, ids: list[int]) -> None:
        words = self._words
        for word in self._pattern.findall(text):
            cached = words.get(word)
            if cached is None:
                cached = tuple(t.id for t in self._model.tokenize(word.translate(_TO_BYTE_LEVEL)))
                if len(word) <= _MAX_CACHED_WORD_CHARS:
                    if len(words) >= _MAX_CACHED_WORDS:
                        words.clear()  # bounded; refilled by the words in use
                    words[word] = cached
            ids.extend(cached)


def _pre_tokenizer_pattern(pre: dict[str, Any]) -> re.Pattern[str] | None:
    """The ASCII pattern that splits text as `pre` does before byte-level BPE (None: a shape
    this path does not serve)."""
    if pre.get("type") == "ByteLevel":
        if pre.get("add_prefix_space") is False and pre.get("use_regex") is True:
            return _GPT2_ASCII
        return None
    if pre.get("type") != "Sequence":
        return None
    steps = pre.get("pretokenizers") or []
    if len(steps) != 2:
        return None
    split, level = steps
    regex = (split.get("pattern") or {}).get("Regex")
    if (
        split.get("type") != "Split"
        or split.get("behavior") != "Isolated"
        or split.get("invert") is not False
        or level.get("type") != "ByteLevel"
        or level.get("add_prefix_space") is not False
        or level.get("use_regex") is not False
        or not isinstance(regex, str)
    ):
        return None
    return _SPLIT_ASCII.get(regex)
