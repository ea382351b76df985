"""Model shapes and hardware figures that parameterise the analytical latency model.

Hardware figures are vendor peak numbers; `compute_efficiency` / `memory_efficiency` are the
fractions of peak a serving engine reaches in practice. The defaults (0.55 MFU, 0.8 MBU) are
typical of published vLLM measurements; they are approximations, not measurements of ours, and
the simulator's profiled/fitted models (core.perf) supersede them when data exists.
"""

from __future__ import annotations

from dataclasses import dataclass

from splitserve.core.kv import KvLayout


@dataclass(frozen=True, slots=True)
class ModelShape:
    name: str
    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    vocab_size: int
    dtype_bytes: int = 2
    mlp_matrices: int = 3
    """3 for gated MLPs (SwiGLU: gate, up, down), 2 for plain ones (OPT: fc1, fc2)."""

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def params_per_layer(self) -> int:
        h = self.hidden_size
        attention = 2 * h * h + 2 * h * self.kv_dim  # Q and O, K and V (GQA-aware)
        return attention + self.mlp_matrices * h * self.intermediate_size

    @property
    def num_params(self) -> int:
        return self.num_layers * self.params_per_layer + 2 * self.vocab_size * self.hidden_size

    @property
    def weight_bytes(self) -> int:
        return self.num_params * self.dtype_bytes

    @property
    def kv_layout(self) -> KvLayout:
        return KvLayout(self.num_layers, self.num_kv_heads, self.head_dim, self.dtype_bytes)


@dataclass(frozen=True, slots=True)
class HardwareSpec:
    name: str
    peak_flops: float
    """Dense fp16/bf16 FLOP/s of one accelerator."""
    memory_bw_bytes_s: float
    memory_bytes: float
    compute_efficiency: float = 0.55
    memory_efficiency: float = 0.8
    step_overhead_s: float = 0.002
    """Fixed per-step cost: scheduling, kernel launches, sampling."""
    kv_link_bw_bytes_s: float = 25e9
    """Bandwidth between a prefill and a decode worker (NIC / NVLink)."""
    kv_link_latency_s: float = 0.0005
    tp_link_bw_bytes_s: float = 300e9
    """All-reduce bandwidth between GPUs of one tensor-parallel group: bytes of activations
    reduced per second (algorithm bandwidth), or NCCL's bus bandwidth when
    `tp_ring_allreduce` is set."""
    tp_allreduce_latency_s: float = 0.0
    """Fixed cost of one all-reduce (NCCL's per-call base latency), paid twice per layer per
    step. 0 (every built-in preset) leaves the all-reduce priced by bandwidth only. Estimates:
    NCCL's own tuning model (src/graph/tuning.cc, 2.18+) puts the ring base latency at 6.6 us
    (LL protocol, the one NCCL picks for small messages) and 8.4 us (Simple)."""
    tp_allreduce_hop_latency_s: float = 0.0
    """Latency of one ring step of an all-reduce; a ring all-reduce over N GPUs takes 2(N-1)
    steps. NCCL's tuning model: 1.0 us a step over PCIe (LL), 0.6 us over NVLink (LL)."""
    tp_ring_allreduce: bool = False
    """Ring all-reduce traffic: each GPU sends and receives 2(N-1)/N of the reduced bytes, and
    `tp_link_bw_bytes_s` is the per-link (NCCL "bus") bandwidth. False (every built-in preset)
    keeps the plain bytes / bandwidth form."""


def _m(*shapes: ModelShape) -> dict[str, ModelShape]:
    return {s.name: s for s in shapes}


def _h(*specs: HardwareSpec) -> dict[str, HardwareSpec]:
    return {s.name: s for s in specs}


MODELS: dict[str, ModelShape] = _m(
    ModelShape("tiny", 4, 256, 640, 4, 4, 4096),
    ModelShape("llama-2-7b", 32, 4096, 11008, 32, 32, 32000),
    ModelShape("llama-2-13b", 40, 5120, 13824, 40, 40, 32000),
    ModelShape("llama-2-70b", 80, 8192, 28672, 64, 8, 32000),
    ModelShape("llama-3-8b", 32, 4096, 14336, 32, 8, 128256),
    ModelShape("llama-3-70b", 80, 8192, 28672, 64, 8, 128256),
    ModelShape("codellama-34b", 48, 8192, 22016, 64, 8, 32000),
    ModelShape("opt-13b", 40, 5120, 20480, 40, 40, 50272, mlp_matrices=2),
    ModelShape("opt-66b", 64, 9216, 36864, 72, 72, 50272, mlp_matrices=2),
    ModelShape("opt-175b", 96, 12288, 49152, 96, 96, 50272, mlp_matrices=2),
)

HARDWARE: dict[str, HardwareSpec] = _h(
    HardwareSpec("a100-80g", 312e12, 2.039e12, 80e9),
    HardwareSpec("a100-40g", 312e12, 1.555e12, 40e9),
    HardwareSpec("h100-80g", 989e12, 3.35e12, 80e9, tp_link_bw_bytes_s=450e9),
    HardwareSpec("h200", 989e12, 4.8e12, 141e9, tp_link_bw_bytes_s=450e9),
    # V100 SXM2 32 GB: 125 TFLOP/s fp16 tensor, 900 GB/s HBM2, NVLink 2 (150 GB/s one way);
    # TetriInfer's and ALISE's testbeds.
    HardwareSpec(
        "v100-32g", 125e12, 0.9e12, 32e9, kv_link_bw_bytes_s=25e9, tp_link_bw_bytes_s=150e9
    ),
    # A 2-core CPU as a stand-in (AVX-512 fp32): rough, for local runs of the tiny model only.
    HardwareSpec("cpu-2core", 2e11, 2e10, 8e9, 0.3, 0.5, 0.001, 2e9, 0.0001, 1e10),
)
