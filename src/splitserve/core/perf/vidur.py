"""Vidur's operator-level A100 / H100 measurements (Llama family), as a `LatencyModel`.

Vidur (Agrawal et al., MLSys'24) times every operator of a transformer layer on real GPUs, per
token count and TP degree, and adds attention and communication. This model follows its
structure with the published tables (`published/_vidur.py`):

    step = overhead + emb(T) + layers · (ops(T) + prefill_attn + decode_attn + 2·all_reduce(T))

- `ops(T)`: the sum of the measured medians of the per-layer non-attention operators (norms,
  QKV and output projections, RoPE, MLP up / act / down, residual add) at T = new tokens in the
  step, interpolated linearly between the measured token counts and extrapolated past the
  largest with the slope of its upper half; `emb(T)` the embedding, once per step.
- Attention is not in the published data. It comes from the roofline on the GPU's
  `HardwareSpec` (the same efficiencies as `RooflineModel`, heads split over TP): prefill
  attention FLOPs over peak·MFU, decode attention KV bytes over bandwidth·MBU. That is the
  calibration this model makes, not a measurement.
- `all_reduce(T)`: two per layer at TP > 1, NCCL within one DGX node, message = T·hidden·2
  bytes, from Vidur's network table, plus Vidur's 0.02 ms NCCL launch overhead each.
- `overhead`: the hardware preset's fixed per-step cost (scheduling, sampling; 2 ms), which
  Vidur's GPU tables do not contain. An estimate.

The KV transfer is priced by a `KvLink` (NVLink within a node by default).
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field

from splitserve.core.perf.kvlink import KvLink
from splitserve.core.perf.protocol import BatchShape
from splitserve.core.perf.published import _vidur
from splitserve.core.perf.shapes import HARDWARE, MODELS, HardwareSpec, ModelShape

GPUS = {"a100": "a100-80g", "h100": "h100-80g"}
"""Vidur's GPU names and the hardware presets they correspond to."""
NCCL_LAUNCH_S = 0.02e-3
"""Vidur's `nccl_cpu_launch_overhead_ms` default, added to each all-reduce."""


@dataclass(frozen=True, slots=True)
class Curve:
    """y(x) by linear interpolation of measured points; flat below the first; past the last,
    linear with the slope between the middle and the last point. Running-max'd (monotone)."""

    xs: tuple[float, ...]
    ys: tuple[float, ...]
    tail_slope: float = field(init=False, default=0.0)

    def __post_init__(self) -> None:
        if len(self.xs) != len(self.ys) or len(self.xs) < 2:
            raise ValueError("a curve needs two or more points")
        mono: list[float] = []
        for y in self.ys:
            mono.append(max(y, mono[-1]) if mono else y)
        object.__setattr__(self, "ys", tuple(mono))
        mid = len(self.xs) // 2
        slope = (mono[-1] - mono[mid]) / (self.xs[-1] - self.xs[mid])
        object.__setattr__(self, "tail_slope", max(slope, 0.0))

    def at(self, x: float) -> float:
        xs, ys = self.xs, self.ys
        if x <= xs[0]:
            return ys[0]
        if x >= xs[-1]:
            return ys[-1] + (x - xs[-1]) * self.tail_slope
        i = bisect_right(xs, x)
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def vidur_models(gpu: str) -> tuple[tuple[str, int], ...]:
    """(model, tp) pairs Vidur published for `gpu` ("a100" or "h100")."""
    return tuple(sorted((m, t) for g, m, t in _vidur.COMPUTE if g == gpu))


def _ms_curve(xs: tuple[int, ...], ms: tuple[float, ...]) -> Curve:
    return Curve(tuple(float(x) for x in xs), tuple(m / 1000.0 for m in ms))


@dataclass(frozen=True, slots=True)
class VidurModel:
    gpu: str
    model: str
    tp: int
    kv_link: KvLink
    time_scale: float = 1.0
    shape: ModelShape = field(init=False, repr=False, compare=False)
    hardware: HardwareSpec = field(init=False, repr=False, compare=False)
    _layer: Curve = field(init=False, repr=False, compare=False)
    _emb: Curve = field(init=False, repr=False, compare=False)
    _allreduce: Curve | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.gpu not in GPUS:
            raise ValueError(f"unknown Vidur GPU {self.gpu!r}; valid: {', '.join(GPUS)}")
        if self.time_scale <= 0:
            raise ValueError(f"time_scale must be > 0, got {self.time_scale}")
        table = _vidur.COMPUTE.get((self.gpu, self.model, self.tp))
        if table is None:
            have = ", ".join(f"{m}/tp{t}" for m, t in vidur_models(self.gpu))
            raise ValueError(
                f"Vidur published no {self.gpu} profile of {self.model} at TP {self.tp}; "
                f"have: {have}"
            )
        tokens, layer_ms, emb_ms = table
        object.__setattr__(self, "shape", MODELS[self.model])
        object.__setattr__(self, "hardware", HARDWARE[GPUS[self.gpu]])
        object.__setattr__(self, "_layer", _ms_curve(tokens, layer_ms))
        object.__setattr__(self, "_emb", _ms_curve(tokens, emb_ms))
        allreduce = None
        if self.tp > 1:
            net = _vidur.ALL_REDUCE.get((self.gpu, self.tp))
            if net is None:
                raise ValueError(f"Vidur published no {self.gpu} all-reduce for TP {self.tp}")
            allreduce = _ms_curve(*net)
        object.__setattr__(self, "_allreduce", allreduce)

    @property
    def ready(self) -> bool:
        return True

    def layer_ops_s(self, num_tokens: int) -> float:
        """One layer's non-attention operators at `num_tokens` (the published sum)."""
        return self._layer.at(num_tokens)

    def allreduce_s(self, num_tokens: int) -> float:
        if self._allreduce is None or num_tokens <= 0:
            return 0.0
        nbytes = num_tokens * self.shape.hidden_size * self.shape.dtype_bytes
        return self._allreduce.at(nbytes) + NCCL_LAUNCH_S

    def step_s(self, batch: BatchShape) -> float:
        chunks = batch.prefill_chunks
        contexts = batch.decode_contexts
        if not chunks and not contexts:
            return 0.0
        s, hw = self.shape, self.hardware
        tokens = sum(n for n, _ in chunks) + len(contexts)
        per_layer = self._layer.at(tokens)
        if chunks:
            flops = sum(4.0 * s.hidden_size * n * (ctx + (n + 1) / 2.0) for n, ctx in chunks)
            per_layer += flops / self.tp / (hw.peak_flops * hw.compute_efficiency)
        if contexts:
            kv_bytes = sum(contexts) * s.kv_layout.bytes_per_token / s.num_layers
            per_layer += kv_bytes / self.tp / (hw.memory_bw_bytes_s * hw.memory_efficiency)
        per_layer += 2.0 * self.allreduce_s(tokens)
        total = hw.step_overhead_s + self._emb.at(tokens) + s.num_layers * per_layer
        return total * self.time_scale

    def kv_transfer_s(self, num_bytes: int) -> float:
        return self.kv_link.transfer_s(num_bytes) * self.time_scale
