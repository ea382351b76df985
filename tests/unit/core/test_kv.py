"""Block ledger invariants: free + held == total; allocation and shrinking are all-or-nothing."""

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


def test_shrink_frees_the_tail_or_nothing() -> None:
    bm = BlockManager(num_blocks=6, block_size=16)
    a = RequestId("a")
    assert bm.grow(a, 80)  # 5 blocks
    assert bm.shrink(a, 2) == 3
    assert (bm.blocks_held(a), bm.num_free) == (2, 4)
    assert bm.shrink(a, 2) == 0
    with pytest.raises(ValueError, match="holds 2"):
        bm.shrink(a, 3)
    with pytest.raises(ValueError, match="cannot shrink"):
        bm.shrink(a, -1)
    assert (bm.blocks_held(a), bm.num_free) == (2, 4)
    assert bm.shrink(a, 0) == 2
    assert a not in bm.held
    assert bm.num_free == 6
    assert bm.grow(a, 17)  # regrows from nothing
    assert bm.blocks_held(a) == 2


ops = st.lists(
    st.tuples(st.sampled_from(["grow", "free", "shrink"]), st.integers(0, 5), st.integers(0, 200)),
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
        elif op == "shrink":
            keep = tokens % 8
            free_before = bm.num_free
            if keep <= before:
                assert bm.shrink(rid, keep) == before - keep
                assert bm.blocks_held(rid) == keep
            else:
                with pytest.raises(ValueError, match="cannot shrink"):
                    bm.shrink(rid, keep)
                assert bm.blocks_held(rid) == before
                assert bm.num_free == free_before
        else:
            bm.free(rid)
        assert 0 not in bm.held.values()
        assert bm.num_free + sum(bm.held.values()) == bm.num_blocks
        assert bm.num_free >= 0
