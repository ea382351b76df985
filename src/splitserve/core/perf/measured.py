"""Latency models from whole steps splitserve measured on real GPUs (H100, H200).

`tools/gpu_step_profile.py` ran a Llama-shaped model (random bf16 weights, PyTorch operators,
TP 1) on one GPU and timed whole forward passes: prefill of one sequence of n tokens and decode
steps of b sequences at context c replayed from a CUDA graph (`published/_gpu_steps.py`). The
model is a `ProfiledModel` (GEMM curve by new tokens, prefill- and decode-attention curves), so a
simulated worker can behave like an H100 or an H200 (Vidur publishes no H200 profile). The
components are separated by two least-squares fits on the whole steps:

- decode: `step(b, c) = g[b] + k_da * b * c`, one free `g[b]` per batch size (several contexts
  were measured at b = 1, 8, 32, which identifies `k_da`);
- prefill (n >= 512): `step(n) = a + beta * n + k_pa * n (n + 1) / 2`. Single-sequence probes
  cannot separate a free GEMM value per n from attention (the table `splitserve profile` builds
  needs several requests per token count), so the GEMMs are taken as linear in n there, as
  they are once compute-bound. The 128-token prefill ran eagerly with launch cost that a
  serving engine's CUDA graphs or larger batches hide; it is reported, not fitted.

The GEMM curve is `g[b]` at the decode batch sizes and `a + beta * n` at the prefill sizes above
them, made non-decreasing.

What it cannot show: the kernels are PyTorch's, not a serving engine's fused ones (Vidur's H100
operator sums, which come from vLLM's kernels, are 7-17 % below ours at >= 768 tokens; see
docs/simulator.md), decode attention reads a contiguous cache (not paged), and prefill probes are
single sequences, so a batch of several short prompts is priced as one long one (attention
overstated). The KV transfer is NCCL send/recv over NVLink from Vidur's H100 network table for
both GPUs (H200 SXM has the same NVLink 4 as H100 SXM).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from splitserve.core.perf.kvlink import KvLink
from splitserve.core.perf.protocol import BatchShape
from splitserve.core.perf.published import _gpu_steps
from splitserve.core.perf.samples import Measurement
from splitserve.core.perf.table import ProfileCurve, ProfiledModel, _monotone

PREFILL_FIT_MIN_TOKENS = 512
"""Prefill probes below this ran launch-bound (eager PyTorch); they are not fitted."""

GPUS = {"h100": "h100-80g", "h200": "h200"}
"""Measured GPUs and the hardware presets they correspond to."""


def measured_models(gpu: str) -> tuple[tuple[str, int], ...]:
    """(model, tp) pairs measured on `gpu`."""
    return tuple(sorted((m, 1) for g, m in _gpu_steps.STEPS if g == gpu))


def measurements(gpu: str, model: str) -> list[Measurement]:
    """The vendored whole steps of `model` on `gpu` as profiler samples."""
    rows = _gpu_steps.STEPS.get((gpu, model))
    if rows is None:
        have = ", ".join(m for m, _ in measured_models(gpu)) or "none"
        raise ValueError(f"no {gpu} measurement of {model!r}; have: {have}")
    out = []
    for kind, batch, n, seconds in rows:
        if kind == "prefill":
            shape = BatchShape(prefill_chunks=((n, 0),) * batch)
            out.append(Measurement("prefill", batch, n, 0, shape, seconds))
        elif kind == "decode":
            shape = BatchShape(decode_contexts=(n,) * batch)
            out.append(Measurement("decode", batch, n, 0, shape, seconds))
        else:
            raise ValueError(f"unknown step kind {kind!r} in the {gpu} {model} table")
    return out


@dataclass(frozen=True, slots=True)
class MeasuredGpuModel:
    gpu: str
    model: str
    kv_link: KvLink
    tp: int = 1
    time_scale: float = 1.0
    table: ProfiledModel = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.gpu not in GPUS:
            raise ValueError(f"unknown measured GPU {self.gpu!r}; valid: {', '.join(GPUS)}")
        if self.tp != 1:
            raise ValueError(f"{self.gpu} was measured at TP 1 only, got TP {self.tp}")
        if self.time_scale <= 0:
            raise ValueError(f"time_scale must be > 0, got {self.time_scale}")
        object.__setattr__(self, "table", fit_steps(measurements(self.gpu, self.model)))

    @property
    def ready(self) -> bool:
        return True

    def step_s(self, batch: BatchShape) -> float:
        return self.table.step_s(batch) * self.time_scale

    def kv_transfer_s(self, num_bytes: int) -> float:
        return self.kv_link.transfer_s(num_bytes) * self.time_scale


def fit_steps(samples: list[Measurement]) -> ProfiledModel:
    """The `ProfiledModel` of whole decode and prefill steps (see the module docstring)."""
    decode = [s for s in samples if s.kind == "decode"]
    prefill = [s for s in samples if s.kind == "prefill" and s.batch_size == 1]
    prefill = [s for s in prefill if s.prompt_tokens >= PREFILL_FIT_MIN_TOKENS]
    if not decode or len(prefill) < 3:
        raise ValueError("need decode steps and >= 3 single-sequence prefills of >= 512 tokens")
    sizes = sorted({s.batch_size for s in decode})
    col = {b: i for i, b in enumerate(sizes)}
    a = np.zeros((len(decode), len(sizes) + 1))
    for r, s in enumerate(decode):
        a[r, col[s.batch_size]] = 1.0
        a[r, -1] = s.batch_size * s.prompt_tokens
    x, *_ = np.linalg.lstsq(a, np.array([s.seconds for s in decode]), rcond=None)
    k_da = max(float(x[-1]), 0.0)
    g_decode = [
        float(
            np.median(
                [
                    s.seconds - k_da * s.batch_size * s.prompt_tokens
                    for s in decode
                    if s.batch_size == b
                ]
            )
        )
        for b in sizes
    ]
    ns = np.array([float(s.prompt_tokens) for s in prefill])
    y = np.array([s.seconds for s in prefill])
    work = ns * (ns + 1) / 2.0
    coef, *_ = np.linalg.lstsq(np.stack([np.ones_like(ns), ns, work], axis=1), y, rcond=None)
    if coef[2] < 0:  # no measurable quadratic term: GEMMs alone
        lin, *_ = np.linalg.lstsq(np.stack([np.ones_like(ns), ns], axis=1), y, rcond=None)
        coef = np.array([lin[0], lin[1], 0.0])
    base, beta, k_pa = (float(c) for c in coef)
    gemm_x = [float(b) for b in sizes]
    gemm_y = list(g_decode)
    for n in sorted({s.prompt_tokens for s in prefill}):
        if n > sizes[-1]:
            gemm_x.append(float(n))
            gemm_y.append(base + beta * n)
    w_max = float(work.max())
    x_max = float(max(s.batch_size * s.prompt_tokens for s in decode))
    return ProfiledModel(
        gemm=ProfileCurve(tuple(gemm_x), tuple(_monotone(max(v, 0.0) for v in gemm_y))),
        prefill_attention=ProfileCurve((0.0, w_max), (0.0, k_pa * w_max)),
        decode_attention=ProfileCurve((0.0, x_max), (0.0, k_da * x_max)),
    )
