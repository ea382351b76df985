"""Incremental detokenization: deltas add up to the full decode; no half characters mid-stream."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from splitserve.router.detokenizer import IncrementalDetokenizer
from splitserve.router.tokenizer import TextTokenizer


def _byte_token_ids(tokenizer: TextTokenizer, data: bytes) -> list[int]:
    """One token per byte, through the byte-level alphabet (GPT-2's bytes_to_unicode)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    vocab = tokenizer._hf.get_vocab()
    return [vocab[table[b]] for b in data]


def _run(tokenizer: TextTokenizer, ids: list[int], cuts: list[int]) -> list[str]:
    detok = IncrementalDetokenizer(tokenizer)
    deltas, start = [], 0
    for cut in [*sorted(set(cuts)), len(ids)]:
        deltas.append(detok.push(ids[start:cut]))
        start = max(start, cut)
    deltas.append(detok.flush())
    return deltas


def test_multibyte_character_split_across_tokens(tokenizer: TextTokenizer) -> None:
    ids = _byte_token_ids(tokenizer, "a€b".encode())  # € is three bytes
    detok = IncrementalDetokenizer(tokenizer)
    out = [detok.push([t]) for t in ids]
    assert out == ["a", "", "", "€", "b"]
    assert detok.flush() == ""


def test_flush_releases_a_dangling_partial_character(tokenizer: TextTokenizer) -> None:
    ids = _byte_token_ids(tokenizer, "x€".encode()[:-1])
    detok = IncrementalDetokenizer(tokenizer)
    assert "".join(detok.push([t]) for t in ids) == "x"
    assert detok.flush() == "\ufffd"


def test_context_tokens_are_never_emitted(tokenizer: TextTokenizer) -> None:
    context = tokenizer.encode("The prompt says")
    detok = IncrementalDetokenizer(tokenizer, context)
    out = detok.push(tokenizer.encode(" hello")) + detok.flush()
    assert out == " hello"


def test_special_tokens_are_skipped(tokenizer: TextTokenizer) -> None:
    eos = tokenizer.stop_token_ids[0]
    detok = IncrementalDetokenizer(tokenizer)
    out = detok.push(tokenizer.encode("done")) + detok.push([eos]) + detok.flush()
    assert out == "done"


@given(text=st.text(max_size=60), cuts=st.lists(st.integers(0, 80), max_size=8))
def test_deltas_of_encoded_text_concatenate_to_it(
    tokenizer: TextTokenizer, text: str, cuts: list[int]
) -> None:
    ids = tokenizer.encode(text)
    deltas = _run(tokenizer, ids, cuts)
    assert "".join(deltas) == text
    # Valid text never shows a replacement character mid-stream.
    if "\ufffd" not in text:
        assert not any("\ufffd" in d for d in deltas)


@given(data=st.binary(max_size=40), cuts=st.lists(st.integers(0, 40), max_size=8))
def test_deltas_of_arbitrary_bytes_concatenate_to_full_decode(
    tokenizer: TextTokenizer, data: bytes, cuts: list[int]
) -> None:
    ids = _byte_token_ids(tokenizer, data)
    assert "".join(_run(tokenizer, ids, cuts)) == tokenizer.decode(ids)


@given(ids=st.lists(st.integers(0, 4095), max_size=30), cuts=st.lists(st.integers(0, 30)))
def test_deltas_of_any_token_ids_concatenate_to_full_decode(
    tokenizer: TextTokenizer, ids: list[int], cuts: list[int]
) -> None:
    assert "".join(_run(tokenizer, ids, cuts)) == tokenizer.decode(ids)
