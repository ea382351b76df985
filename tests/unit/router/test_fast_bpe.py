"""The ASCII byte-level BPE fast path gives exactly the Rust tokenizer's ids, or steps aside."""

from __future__ import annotations

import random
import sysconfig
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

from splitserve.router.fast_bpe import FastBpe
from splitserve.router.tokenizer import BOS, END_HEADER, END_OF_TURN, START_HEADER, TextTokenizer

_PIECES = [
    "the", " router", "Places", " EACH", "x", "  ", "   ", "\t", "\n", "\n\n", " \n ", "\r\n",
    "\x0b", "\x0c", "\x00", "\x1f", "\x7f", "'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S",
    "'", "''", "42", " 7", "3.14", "1e9", "!", " ?", "...", "--", "#", "{}", "()", "[x]", "a_b",
    "snake_case", "CamelCase", "http://a.b/c?d=e", "@", "`", "~", "\\", '"', " ",
    BOS, END_OF_TURN, START_HEADER, END_HEADER, "<|", "|>", "<|eot_id", "eot_id|>",
]  # fmt: skip


def _rust(tokenizer: TextTokenizer) -> Any:
    return tokenizer._fast


def _bpe(tokenizer: TextTokenizer) -> FastBpe:
    bpe = FastBpe.of(_rust(tokenizer))
    assert bpe is not None, "the default tokenizer has the shape the fast path serves"
    return bpe


def test_generated_ascii_text_gets_the_rust_ids(tokenizer: TextTokenizer) -> None:
    bpe, rust = _bpe(tokenizer), _rust(tokenizer)
    rng = random.Random(17)
    for _ in range(2000):
        text = "".join(rng.choice(_PIECES) for _ in range(rng.randint(0, 30)))
        assert bpe.encode(text) == rust.encode(text, add_special_tokens=False).ids, repr(text)


def test_real_source_text_gets_the_rust_ids(tokenizer: TextTokenizer) -> None:
    bpe, rust = _bpe(tokenizer), _rust(tokenizer)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    checked = 0
    for name in ("ast.py", "pathlib.py", "random.py", "tokenize.py"):
        text = (stdlib / name).read_text(encoding="utf-8")
        for start in range(0, len(text), 3000):
            chunk = text[start : start + 3000]
            if chunk.isascii():
                assert bpe.encode(chunk) == rust.encode(chunk, add_special_tokens=False).ids
                checked += 1
    assert checked > 20
    # The second time, every word comes from the cache: still the same ids.
    chunk = (stdlib / "ast.py").read_text(encoding="utf-8")[:3000]
    assert bpe.encode(chunk) == bpe.encode(chunk) == rust.encode(chunk).ids


@pytest.mark.parametrize("text", ["Grüße", "naïve text", "\u00a0nbsp", "emoji 🙂"])
def test_non_ascii_text_is_left_to_the_rust_tokenizer(tokenizer: TextTokenizer, text: str) -> None:
    assert _bpe(tokenizer).encode(text) is None
    # ... and the tokenizer as a whole still encodes it (through Rust).
    messages = [{"role": "user", "content": text}]
    assert tokenizer.decode(tokenizer.apply_chat_template(messages)).endswith("assistant\n\n")


def test_chat_template_ids_are_unchanged_by_the_fast_path(tokenizer: TextTokenizer) -> None:
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What's 2+2?\n\nAnswer in one word, please."},
    ]
    fast_ids = tokenizer.apply_chat_template(messages)
    tokenizer._bpe = None  # the Rust path alone
    assert tokenizer.apply_chat_template(messages) == fast_ids


def _tokenizer(pre: Any, normalizer: Any = None) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre
    if normalizer is not None:
        tok.normalizer = normalizer
    return tok


@pytest.mark.parametrize(
    "tok",
    [
        _tokenizer(pre_tokenizers.Metaspace()),
        _tokenizer(pre_tokenizers.ByteLevel(add_prefix_space=True)),
        _tokenizer(pre_tokenizers.ByteLevel(use_regex=False)),
        _tokenizer(pre_tokenizers.ByteLevel(add_prefix_space=False), normalizers.NFC()),
    ],
    ids=["metaspace", "prefix-space", "no-regex", "normalizer"],
)
def test_other_tokenizer_shapes_get_no_fast_path(tok: Tokenizer) -> None:
    assert FastBpe.of(tok) is None
