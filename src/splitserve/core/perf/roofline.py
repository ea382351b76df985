"""Analytical (roofline) latency model in the DistServe appendix form.

DistServe (Appendix A; spec in research/seed-distserve-vidur-aladdin.md §A.4) prices a prefill as
`C1·(4th² + 2thm) + C2·(3h·Σl²/b) + C3` and a decode iteration as `C4·(4h² + 2hm) + C5·(3h·t)`:
GEMMs proportional to FLOPs (prefill) or to weight bytes (decode), attention proportional to the
squared prompt lengths (prefill) or to the context tokens read (decode). The paper fits C1..C5 by
regression; here they are derived from the hardware figures instead (C1 = 2·layers/(F·MFU),
C4 = dtype·layers/(B·MBU), ...), so a model shape plus a `HardwareSpec` give usable numbers with
no profile. The `4h²+2hm` term is generalised to the shape's real parameter count (GQA, gated
MLPs). A mixed (chunked-prefill) step takes the roofline max of compute and weight-read time for
its GEMMs and adds both attention terms. Fitted and profiled models live beside this one.

Tensor parallelism adds two all-reduces of the step's activations per layer (Megatron-style):
bytes over the TP link bandwidth, optionally with the ring's 2(N-1)/N traffic factor, plus, when
the hardware sets one, a fixed latency per all-reduce (NCCL's base latency and 2(N-1) ring
steps). Both extras are opt-in (`HardwareSpec.tp_ring_allreduce`, `tp_allreduce_latency_s`,
`tp_allreduce_hop_latency_s`); with the defaults the step time is exactly the bandwidth-only one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from splitserve.core.perf.protocol import BatchShape
from splitserve.core.perf.shapes import HardwareSpec, ModelShape


@dataclass(frozen=True, slots=True)
class RooflineModel:
    shape: ModelShape
    hardware: HardwareSpec
    tp: int = 1
    time_scale: float = 1.0
    """Multiplies every step time; < 1 runs a simulated engine faster than the real one."""
    # Derived constants, computed once (`step_s` is the simulator's hottest pricing call). One
    # field each, typed, rather than one tuple: compiled, a field is a native double or int,
    # where unpacking a `tuple[float, ...]` boxed and checked nine objects per call.
    _c_flops: float = field(init=False, repr=False, compare=False, default=0.0)
    _c_bw: float = field(init=False, repr=False, compare=False, default=0.0)
    _c_ppl: int = field(init=False, repr=False, compare=False, default=0)
    _c_layers: int = field(init=False, repr=False, compare=False, default=0)
    _c_hidden: int = field(init=False, repr=False, compare=False, default=0)
    _c_vocab: int = field(init=False, repr=False, compare=False, default=0)
    _c_weight_s: float = field(init=False, repr=False, compare=False, default=0.0)
    _c_kv_bpt: int = field(init=False, repr=False, compare=False, default=0)
    _c_overhead: float = field(init=False, repr=False, compare=False, default=0.0)
    _tp_k: tuple[float, float] = field(init=False, repr=False, compare=False, default=(0.0, 0.0))
    """(ring traffic factor or 0 when off, all-reduce latency per step or 0 when none)."""

    def __post_init__(self) -> None:
        if self.tp < 1:
            raise ValueError(f"tp must be >= 1, got {self.tp}")
        if self.time_scale <= 0:
            raise ValueError(f"time_scale must be > 0, got {self.time_scale}")
        s = self.shape
        flops = self._flops
        bw = self._bw
        object.__setattr__(self, "_c_flops", flops)
        object.__setattr__(self, "_c_bw", bw)
        object.__setattr__(self, "_c_ppl", s.params_per_layer)
        object.__setattr__(self, "_c_layers", s.num_layers)
        object.__setattr__(self, "_c_hidden", s.hidden_size)
        object.__setattr__(self, "_c_vocab", s.vocab_size)
        object.__setattr__(self, "_c_weight_s", s.weight_bytes / bw)
        object.__setattr__(self, "_c_kv_bpt", s.kv_layout.bytes_per_token)
        object.__setattr__(self, "_c_overhead", self.hardware.step_overhead_s)
        ring = self._ring_factor if self.hardware.tp_ring_allreduce else 0.0
        object.__setattr__(self, "_tp_k", (ring, self._allreduce_latency_step_s))

    @property
    def ready(self) -> bool:
        return True

    @property
    def _flops(self) -> float:
        return self.hardware.peak_flops * self.hardware.compute_efficiency * self.tp

    @property
    def _bw(self) -> float:
        return self.hardware.memory_bw_bytes_s * self.hardware.memory_efficiency * self.tp

    @property
    def _ring_factor(self) -> float:
        """Bytes each GPU sends per byte reduced in a ring all-reduce: 2(N-1)/N."""
        return 2 * (self.tp - 1) / self.tp

    @property
    def _allreduce_latency_step_s(self) -> float:
        """Fixed all-reduce latency of one step: two all-reduces per layer, each the base
        latency plus 2(N-1) ring steps (0 at TP 1 or when the hardware sets none)."""
        hw = self.hardware
        if self.tp == 1:
            return 0.0
        per_call = hw.tp_allreduce_latency_s + 2 * (self.tp - 1) * hw.tp_allreduce_hop_latency_s
        return 2 * self.shape.num_layers * per_call

    def step_s(self, batch: BatchShape) -> float:
        # Same arithmetic, in the same order, as the textbook form kept in `_step_s_reference`;
        # only the derived constants are precomputed and additions of exact zeros skipped.
        chunks = batch.prefill_chunks
        contexts = batch.decode_contexts
        if not chunks and not contexts:
            return 0.0
        flops, bw, ppl, layers = self._c_flops, self._c_bw, self._c_ppl, self._c_layers
        hidden, vocab, weight_s = self._c_hidden, self._c_vocab, self._c_weight_s
        kv_bpt, overhead = self._c_kv_bpt, self._c_overhead
        new_tokens = sum(n for n, _ in chunks) + len(contexts) if chunks else len(contexts)
        num_seqs = len(chunks) + len(contexts)
        gemm_flops = 2.0 * new_tokens * ppl * layers
        head_flops = 2.0 * num_seqs * hidden * vocab
        gemm_s = (gemm_flops + head_flops) / flops
        if gemm_s < weight_s:
            gemm_s = weight_s
        total = overhead + gemm_s
        if chunks:
            attn_flops = sum(4.0 * hidden * n * (ctx + (n + 1) / 2.0) for n, ctx in chunks)
            total = total + layers * attn_flops / flops
        if contexts:
            total = total + sum(contexts) * kv_bpt / bw
        if self.tp > 1:
            s = self.shape
            # Two all-reduces of the activations per layer.
            tp_bytes = float(2 * s.num_layers * new_tokens * s.hidden_size * s.dtype_bytes)
            ring, allreduce_lat = self._tp_k
            if ring:
                tp_bytes = tp_bytes * ring
            tp_s = tp_bytes / self.hardware.tp_link_bw_bytes_s
            if allreduce_lat:
                tp_s = tp_s + allreduce_lat
            total = total + tp_s
        scale = self.time_scale
        return total if scale == 1.0 else total * scale

    def _step_s_reference(self, batch: BatchShape) -> float:
        """The unoptimised form of `step_s` (tests compare the two bit for bit)."""
        if batch.is_empty:
            return 0.0
        s = self.shape
        new_tokens = batch.num_new_tokens
        num_seqs = len(batch.prefill_chunks) + len(batch.decode_contexts)
        # GEMMs: compute-bound for big batches, weight-read-bound for small ones (the roofline).
        gemm_flops = 2.0 * new_tokens * s.params_per_layer * s.num_layers
        head_flops = 2.0 * num_seqs * s.hidden_size * s.vocab_size
        gemm_s = max((gemm_flops + head_flops) / self._flops, s.weight_bytes / self._bw)
        # Prefill attention (causal, FlashAttention): QK^T and PV over context + half the chunk.
        attn_flops = sum(
            4.0 * s.hidden_size * n * (ctx + (n + 1) / 2.0) for n, ctx in batch.prefill_chunks
        )
        prefill_attn_s = s.num_layers * attn_flops / self._flops
        # Decode attention reads every context token's KV once per step: memory-bound.
        kv_read = sum(batch.decode_contexts) * s.kv_layout.bytes_per_token
        decode_attn_s = kv_read / self._bw
        tp_s = 0.0
        if self.tp > 1:
            # Two all-reduces of the activations per layer.
            tp_bytes = float(2 * s.num_layers * new_tokens * s.hidden_size * s.dtype_bytes)
            if self.hardware.tp_ring_allreduce:
                tp_bytes = tp_bytes * self._ring_factor  # each GPU moves 2(N-1)/N of them
            tp_s = tp_bytes / self.hardware.tp_link_bw_bytes_s
            latency_s = self._allreduce_latency_step_s
            if latency_s:  # skipped, not added, when 0: bandwidth-only presets stay bit-exact
                tp_s = tp_s + latency_s
        total = self.hardware.step_overhead_s + gemm_s + prefill_attn_s + decode_attn_s + tp_s
        return total * self.time_scale

    def kv_transfer_s(self, num_bytes: int) -> float:
        if num_bytes <= 0:
            return 0.0
        hw = self.hardware
        return (hw.kv_link_latency_s + num_bytes / hw.kv_link_bw_bytes_s) * self.time_scale

    def kv_capacity_tokens(self, memory_utilization: float = 0.9) -> int:
        """Tokens of KV cache that fit beside the weights on the TP group."""
        free = self.hardware.memory_bytes * self.tp * memory_utilization - self.shape.weight_bytes
        return max(0, int(free // self.shape.kv_layout.bytes_per_token))
