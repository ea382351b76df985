"""Block ledger invariants: free + held == total; allocation is all-or-nothing."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from splitserve.core.ids import RequestId
from splitserve.core.kv import BlockManager, KvLayout, blocks_for


@pytest.mark.parametrize(
    ("tokens", "size", "blocks"), [(0, 16, 0), (1, 16, 1), (16, 16, 1), (17, 16, 2), (33, 8, 5)]
)
def test_blocks_for(tokens: int, size: int, blocks: int) -> None:
    assert blocks_for(tokens, size) == blocks


def test_kv_bytes_per_token_llama_7b() -> None:
    # 2 (K, V) x 32 layers x 32 heads x 128 dims x 2 bytes = 512 KiB.
    assert KvLayout(32, 32, 128, 2).bytes_per_token == 524288


def test_grow_is_all_or_nothing() -> None:
    bm = BlockManager(num_blocks=4, block_size=16)
    assert bm.grow(RequestId("a"), 48)  # 3 blocks
    assert not bm.grow(RequestId("b"), 32)  # needs 2, 1 free
    assert bm.blocks_held(RequestId("b")) == 0
    assert bm.num_free == 1
    assert bm.free(RequestId("a")) == 3
    assert bm.num_free == 4


ops = st.lists(
    st.tuples(st.sampled_from(["grow", "free"]), st.integers(0, 5), st.integers(0, 200)),
    max_size=60,
)


@given(ops)
def test_blocks_are_conserved(seq: list[tuple[str, int, int]]) -> None:
    bm = BlockManager(num_blocks=20, block_size=16)
    for op, rid_n, tokens in seq:
        rid = RequestId(f"r{rid_n}")
        before = bm.blocks_held(rid)
        if op == "grow":
            ok = bm.grow(rid, tokens)
            if ok:
                assert bm.blocks_held(rid) >= blocks_for(tokens, 16)
            else:
                assert bm.blocks_held(rid) == before
        else:
            bm.free(rid)
        assert bm.num_free + sum(bm.held.values()) == bm.num_blocks
        assert bm.num_free >= 0
