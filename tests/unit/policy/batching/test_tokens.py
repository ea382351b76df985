"""Synthetic tokens: deterministic, in range, and limited to the allowed ids when given."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from splitserve.policy.batching.tokens import SyntheticTokens

prompts = st.lists(st.integers(0, 10_000), min_size=1, max_size=50)


@given(prompts, st.integers(0, 1000))
def test_tokens_are_deterministic_and_in_range(prompt: list[int], index: int) -> None:
    t = SyntheticTokens(vocab_size=4096, first_id=16)
    key = t.key(prompt, None)
    assert t.key(list(prompt), None) == key
    assert 16 <= t.token(key, index) < 4096


@given(prompts, st.integers(0, 1000))
def test_allowed_ids_only(prompt: list[int], index: int) -> None:
    allowed = (20, 33, 4000)
    t = SyntheticTokens(vocab_size=4096, allowed_ids=allowed)
    assert t.token(t.key(prompt, 7), index) in allowed


def test_seed_changes_the_sequence() -> None:
    t = SyntheticTokens(vocab_size=4096)
    a = [t.token(t.key([1, 2, 3], 1), i) for i in range(8)]
    b = [t.token(t.key([1, 2, 3], 2), i) for i in range(8)]
    assert a != b


def test_out_of_range_ids_are_rejected() -> None:
    with pytest.raises(ValueError, match="allowed_ids"):
        SyntheticTokens(vocab_size=10, allowed_ids=(3, 10))
    with pytest.raises(ValueError, match="first_id"):
        SyntheticTokens(vocab_size=10, first_id=10)
