"""The ASCII byte-level BPE fast path gives exactly the Rust tokenizer's ids, or steps aside."""

from __future__ import annotations

import random
import sysconfig
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, processors, trainers

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


_LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
"""Llama 3's `Split` regex, as its tokenizer.json spells it."""
_QWEN2 = _LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}")
"""Qwen2's: single digits."""


def _split_then_bytes(
    regex: str, *, behavior: str = "isolated", invert: bool = False, prefix_space: bool = False
) -> Any:
    """Llama 3's / Qwen2's pre-tokenizer shape: a regex split, then bytes without a regex."""
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(regex), behavior=behavior, invert=invert),
            pre_tokenizers.ByteLevel(add_prefix_space=prefix_space, use_regex=False),
        ]
    )


def _stdlib_texts() -> list[str]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    names = ("ast.py", "pathlib.py", "random.py", "tokenize.py", "argparse.py", "shutil.py")
    return [(stdlib / name).read_text(encoding="utf-8") for name in names]


@pytest.fixture(scope="module", params=["llama3", "qwen2", "qwen2-nfc"])
def split_tokenizer(request: pytest.FixtureRequest) -> Tokenizer:
    """A BPE of Llama 3's or Qwen2's shape (ignore_merges as Llama 3's; Qwen2's NFC
    normalizer), trained here on the standard library's text with their special tokens."""
    regex = _LLAMA3 if request.param == "llama3" else _QWEN2
    tok = Tokenizer(models.BPE(ignore_merges=request.param == "llama3"))
    tok.pre_tokenizer = _split_then_bytes(regex)
    if request.param == "qwen2-nfc":
        tok.normalizer = normalizers.NFC()
    trainer = trainers.BpeTrainer(
        vocab_size=4000,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[BOS, END_OF_TURN, START_HEADER, END_HEADER],
        show_progress=False,
    )
    tok.train_from_iterator(_stdlib_texts()[:4], trainer)
    return tok


def test_split_shapes_get_the_rust_ids(split_tokenizer: Tokenizer) -> None:
    """Llama 3 / Qwen2 shapes: generated pieces (digit runs, contractions in any case, CR/LF
    runs after punctuation) and real text give exactly the Rust tokenizer's ids."""
    bpe = FastBpe.of(split_tokenizer)
    assert bpe is not None
    pieces = [*_PIECES, "12345", " 1234567", "'LL", "'Ve", "!\n", ".\r\n\r\n", " \r\n", "\n\n\n"]
    rng = random.Random(29)
    for _ in range(3000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 30)))
        want = split_tokenizer.encode(text, add_special_tokens=False).ids
        assert bpe.encode(text) == want, repr(text)
    checked = 0
    for text in _stdlib_texts():  # two files the BPE was not trained on
        for start in range(0, len(text), 2000):
            chunk = text[start : start + 2000]
            if chunk.isascii():
                assert bpe.encode(chunk) == split_tokenizer.encode(chunk).ids
                checked += 1
    assert checked > 40
    assert bpe.encode("naïve") is None


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
        _tokenizer(pre_tokenizers.ByteLevel(add_prefix_space=False), normalizers.Lowercase()),
        _tokenizer(_split_then_bytes(r"\p{L}+|\s+|.")),  # a Split regex not in the table
        _tokenizer(_split_then_bytes(_LLAMA3, behavior="removed")),
        _tokenizer(_split_then_bytes(_LLAMA3, invert=True)),
        _tokenizer(_split_then_bytes(_LLAMA3, prefix_space=True)),
        _tokenizer(
            pre_tokenizers.Sequence(
                [
                    pre_tokenizers.Split(Regex(_LLAMA3), behavior="isolated"),
                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
                ]
            )
        ),
        _tokenizer(  # the regex's text as a plain string pattern
            pre_tokenizers.Sequence(
                [
                    pre_tokenizers.Split(_LLAMA3, behavior="isolated"),
                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
                ]
            )
        ),
        _tokenizer(pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(_LLAMA3), "isolated")])),
    ],
    ids=[
        "metaspace",
        "prefix-space",
        "no-regex",
        "normalizer",
        "unknown-split-regex",
        "split-removed",
        "split-inverted",
        "split-prefix-space",
        "split-then-byte-regex",
        "split-as-string",
        "split-alone",
    ],
)
def test_other_tokenizer_shapes_get_no_fast_path(tok: Tokenizer) -> None:
    assert FastBpe.of(tok) is None


def test_encode_with_special_tokens_takes_the_fast_path(tokenizer: TextTokenizer) -> None:
    """The completions route's `encode` (special tokens added): the default tokenizer adds
    none, so the fast path's ids are the answer (it went to Rust every time)."""
    assert tokenizer._wrap == ((), ())
    rust = _rust(tokenizer)
    rng = random.Random(5)
    for _ in range(500):
        text = "".join(rng.choice(_PIECES) for _ in range(rng.randint(0, 30)))
        assert tokenizer.encode(text) == rust.encode(text, add_special_tokens=True).ids


def _wrapped(post: Any, *, truncate: bool = False) -> TextTokenizer:
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = _split_then_bytes(_LLAMA3)
    trainer = trainers.BpeTrainer(
        vocab_size=2000,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[BOS, END_OF_TURN],
        show_progress=False,
    )
    tok.train_from_iterator(_stdlib_texts()[:2], trainer)
    if post is not None:
        tok.post_processor = post(tok)
    if truncate:
        tok.enable_truncation(64)
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=END_OF_TURN)  # type: ignore[no-untyped-call]
    return TextTokenizer(hf)


def _template(single: str) -> Any:
    def make(tok: Tokenizer) -> Any:
        specials = [(t, tok.token_to_id(t)) for t in (BOS, END_OF_TURN)]
        return processors.TemplateProcessing(single=single, special_tokens=specials)

    return make


@pytest.mark.parametrize(
    ("post", "before", "after"),
    [
        (None, (), ()),
        (_template(f"{BOS} $A"), (BOS,), ()),  # Llama 3's
        (_template(f"$A {END_OF_TURN}"), (), (END_OF_TURN,)),
        (
            lambda tok: processors.Sequence(
                [processors.ByteLevel(trim_offsets=False), _template(f"{BOS} $A")(tok)]
            ),
            (BOS,),
            (),
        ),
    ],
    ids=["none", "bos", "eos", "byte-level-then-bos"],
)
def test_a_wrapping_post_processor_keeps_the_fast_path(
    post: Any, before: tuple[str, ...], after: tuple[str, ...]
) -> None:
    tokenizer = _wrapped(post)
    rust = _rust(tokenizer)
    ids = tuple(rust.token_to_id(t) for t in before), tuple(rust.token_to_id(t) for t in after)
    assert tokenizer._wrap == ids
    rng = random.Random(11)
    for _ in range(300):
        text = "".join(rng.choice(_PIECES) for _ in range(rng.randint(0, 30)))
        assert tokenizer.encode(text) == rust.encode(text, add_special_tokens=True).ids, text
    for text in _stdlib_texts()[2:4]:
        chunk = text[:3000]
        assert tokenizer.encode(chunk) == rust.encode(chunk, add_special_tokens=True).ids


@pytest.mark.parametrize(
    ("post", "truncate"),
    [
        (lambda tok: processors.BertProcessing(("x", 1), ("y", 2)), False),
        (_template(f"{BOS} $A"), True),
    ],
    ids=["bert", "truncation"],
)
def test_other_post_processing_keeps_rust(post: Any, truncate: bool) -> None:
    tokenizer = _wrapped(post, truncate=truncate)
    assert tokenizer._wrap is None
    text = "word " * 100
    assert tokenizer.encode(text) == _rust(tokenizer).encode(text).ids
