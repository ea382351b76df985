"""KV-cache sizing and paged block accounting.

`BlockManager` is the one block ledger used by the simulated engine (live) and the simulator: a
request holds a whole number of fixed-size blocks; allocation either fully succeeds or changes
nothing. Invariant: free + sum(held) == total, always.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from splitserve.core.ids import RequestId


def blocks_for(num_tokens: int, block_size: int) -> int:
    """Blocks needed to hold `num_tokens` tokens (ceiling division)."""
    if num_tokens < 0:
        raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
    return -(-num_tokens // block_size)


@dataclass(frozen=True, slots=True)
class KvLayout:
    """What one token's KV cache costs: 2 (K and V) x layers x KV heads x head dim x dtype bytes."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype_bytes: int = 2

    @property
    def bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes


class BlockManager:
    """Paged KV blocks: all-or-nothing allocation per request, conservation of blocks."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be >= 1")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free = num_blocks
        self._held: dict[RequestId, int] = {}

    @property
    def num_free(self) -> int:
        return self._free

    @property
    def held(self) -> Mapping[RequestId, int]:
        return self._held

    def blocks_held(self, rid: RequestId) -> int:
        return self._held.get(rid, 0)

    def extra_blocks_for(self, rid: RequestId, num_tokens: int) -> int:
        """Blocks `rid` would need on top of what it holds to cover `num_tokens` tokens."""
        return max(0, blocks_for(num_tokens, self.block_size) - self._held.get(rid, 0))

    def can_grow(self, rid: RequestId, num_tokens: int) -> bool:
        return self.extra_blocks_for(rid, num_tokens) <= self._free

    def grow(self, rid: RequestId, num_tokens: int) -> bool:
        """Make `rid` hold enough blocks for `num_tokens` tokens. False (and no change) if short."""
        extra = self.extra_blocks_for(rid, num_tokens)
        if extra > self._free:
            return False
        if extra:
            self._free -= extra
            self._held[rid] = self._held.get(rid, 0) + extra
        return True

    def shrink(self, rid: RequestId, keep: int) -> int:
        """Let `rid` keep only its first `keep` blocks (a partial checkpoint frees the tail);
        returns how many were freed. Raises (and changes nothing) unless 0 <= keep <= held."""
        held = self._held.get(rid, 0)
        if not 0 <= keep <= held:
            raise ValueError(f"cannot shrink {rid!r} to {keep} blocks: it holds {held}")
        freed = held - keep
        if keep:
            self._held[rid] = keep
        else:
            self._held.pop(rid, None)
        self._free += freed
        return freed

    def free(self, rid: RequestId) -> int:
        """Release every block `rid` holds; returns how many. Unknown ids free nothing."""
        n = self._held.pop(rid, 0)
        self._free += n
        return n


@dataclass(frozen=True, slots=True)
class KvHandle:
    """Where a prefilled request's KV cache lives, for the decode worker to pull.

    `params` carries engine-specific data as JSON-able values (vLLM's `kv_transfer_params`).
    """

    transport: str
    source_address: str
    source_request_id: RequestId
    num_tokens: int
    num_bytes: int = 0
    params: Mapping[str, object] | None = None
