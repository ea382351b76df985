"""Latency models by name: what a scenario's `latency_model:` and `--sim-latency-model` choose.

- `roofline`: `RooflineModel` on the scenario's hardware preset; every shape and preset.
- `distserve-a100`: DistServe's fits of its own engine on A100-80GB; OPT-13B TP 1/2/4,
  OPT-66B TP 2/3/4/8.
- `distserve-vllm-a100`: DistServe's fits of vLLM (v0.2) on A100-80GB; the same.
- `vidur-a100`: Vidur's A100 operator tables plus roofline attention; Llama-2-7B/70B,
  Llama-3-8B/70B, CodeLlama-34B at TP 1/2/4/8.
- `vidur-h100`: the same on H100; Llama-2-7B/70B, CodeLlama-34B at TP 1/2/4/8.
- `measured-h100`, `measured-h200`: whole steps splitserve measured on an H100 / H200
  (`measured.py`); Llama-2-7B and Llama-3-8B at TP 1.

Each GPU model names the hardware it was measured on (`LatencyModelSpec.hardware`): KV
capacity is sized for that preset, and a scenario naming other hardware is refused. The KV
transfer is priced by `kv_link` when given (`kvlink.KV_LINKS`), else by the model's default:
the hardware preset's link for the roofline, NVLink within a node of the same GPU for the
others.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from splitserve.core.perf.distserve import DistServeModel, distserve_models
from splitserve.core.perf.kvlink import KvLink, kv_link
from splitserve.core.perf.measured import MeasuredGpuModel, measured_models
from splitserve.core.perf.protocol import BatchShape, LatencyModel
from splitserve.core.perf.roofline import RooflineModel
from splitserve.core.perf.shapes import HARDWARE, MODELS
from splitserve.core.perf.vidur import VidurModel, vidur_models


@dataclass(frozen=True, slots=True)
class LatencyModelSpec:
    name: str
    hardware: str | None
    """The hardware preset the measurements come from; None: any (the roofline)."""
    default_kv_link: str | None
    covers: Callable[[], tuple[tuple[str, int], ...]] | None
    """(model, tp) pairs with data; None: every shape."""
    build: Callable[[str, str, int, float, KvLink | None], LatencyModel]
    """(model, hardware, tp, time_scale, kv link or None) -> the model."""


@dataclass(frozen=True, slots=True)
class LinkedModel:
    """Any latency model with its KV transfer priced by another link (time-scaled alike)."""

    base: LatencyModel
    link: KvLink
    time_scale: float = 1.0

    @property
    def ready(self) -> bool:
        return self.base.ready

    def step_s(self, batch: BatchShape) -> float:
        return self.base.step_s(batch)

    def kv_transfer_s(self, num_bytes: int) -> float:
        return self.link.transfer_s(num_bytes) * self.time_scale


@dataclass(frozen=True, slots=True)
class TimeScaledModel:
    """Any latency model with its steps and KV transfers multiplied by `time_scale` (the
    scenario's `time_scale`, which the named models take when built; a profile is read as
    measured and scaled here)."""

    base: LatencyModel
    time_scale: float

    def __post_init__(self) -> None:
        if not (self.time_scale > 0 and math.isfinite(self.time_scale)):
            raise ValueError(f"time scale must be a finite number > 0, got {self.time_scale}")

    @property
    def ready(self) -> bool:
        return self.base.ready

    def step_s(self, batch: BatchShape) -> float:
        return self.base.step_s(batch) * self.time_scale

    def kv_transfer_s(self, num_bytes: int) -> float:
        return self.base.kv_transfer_s(num_bytes) * self.time_scale


@dataclass(frozen=True, slots=True)
class OverheadModel:
    """Any latency model plus a fixed cost per non-empty step: a live engine's work beyond the
    model's (scheduling, RPC, event-loop delay), calibrated from a recorded run."""

    base: LatencyModel
    overhead_s: float

    def __post_init__(self) -> None:
        if not self.overhead_s >= 0:
            raise ValueError(f"step overhead must be >= 0, got {self.overhead_s}")

    @property
    def ready(self) -> bool:
        return self.base.ready

    def step_s(self, batch: BatchShape) -> float:
        t = self.base.step_s(batch)
        return t + self.overhead_s if t > 0 else t

    def kv_transfer_s(self, num_bytes: int) -> float:
        return self.base.kv_transfer_s(num_bytes)


@dataclass(frozen=True, slots=True)
class RescaledModel:
    """A model measured on one GPU carried to another: each step costs the base model's time
    × `target.step_s / source.step_s`, the roofline's ratio for that very batch shape on the two
    GPUs (same model, same TP). The measurement keeps the engine's own costs and their shape;
    the roofline supplies only how the hardware changes them (compute-bound steps scale with
    peak FLOP/s, memory-bound ones with bandwidth). An approximation: where the base engine is
    bound by something the roofline does not model (CPU overhead), the scaling overstates the
    change. The KV transfer keeps the base model's link.

    `fixed_s` (default 0: everything scales) is a part of every step held as it is: the
    engine's per-step cost off the GPU (Python scheduling, RPC to TP workers), which a GPU swap
    does not change. A step then costs `fixed + (base − fixed) × ratio`. `fixed_overhead`
    estimates it from the measurement itself."""

    base: LatencyModel
    source: RooflineModel
    target: RooflineModel
    fixed_s: float = 0.0

    def __post_init__(self) -> None:
        if self.source.shape != self.target.shape or self.source.tp != self.target.tp:
            raise ValueError("source and target rooflines must price the same model at one TP")
        if self.fixed_s < 0:
            raise ValueError(f"fixed_s must be >= 0, got {self.fixed_s}")

    @property
    def ready(self) -> bool:
        return self.base.ready

    def step_s(self, batch: BatchShape) -> float:
        t = self.base.step_s(batch)
        if t <= 0:
            return t
        fixed = min(self.fixed_s, t)
        return fixed + (t - fixed) * self.target.step_s(batch) / self.source.step_s(batch)

    @staticmethod
    def fixed_overhead(base: LatencyModel, source: RooflineModel) -> float:
        """The measured engine's smallest step (one sequence decoding after one token) less
        the source GPU's roofline for it, floored at 0: the per-step time the GPU's work does
        not explain. For DistServe's vLLM fits of OPT-13B on A100-80GB this grows with TP
        (TP 1/2/4: ≈ 4 / 17 / 25 ms) while the GPU's share shrinks, as a per-step CPU and RPC
        cost does; DistServe's own engine leaves ≈ 0-6 ms."""
        smallest = BatchShape((), (1,))
        return max(0.0, base.step_s(smallest) - source.step_s(smallest))

    def kv_transfer_s(self, num_bytes: int) -> float:
        return self.base.kv_transfer_s(num_bytes)


def _roofline(
    model: str, hardware: str, tp: int, time_scale: float, link: KvLink | None
) -> LatencyModel:
    base = RooflineModel(MODELS[model], HARDWARE[hardware], tp=tp, time_scale=time_scale)
    return base if link is None else LinkedModel(base, link, time_scale)


def _distserve(engine: str) -> Callable[[str, str, int, float, KvLink | None], LatencyModel]:
    def build(
        model: str, _hw: str, tp: int, time_scale: float, link: KvLink | None
    ) -> LatencyModel:
        return DistServeModel(engine, model, tp, link or kv_link("nvlink-a100"), time_scale)

    return build


def _vidur(gpu: str) -> Callable[[str, str, int, float, KvLink | None], LatencyModel]:
    def build(
        model: str, _hw: str, tp: int, time_scale: float, link: KvLink | None
    ) -> LatencyModel:
        return VidurModel(gpu, model, tp, link or kv_link(f"nvlink-{gpu}"), time_scale)

    return build


def _measured(gpu: str) -> Callable[[str, str, int, float, KvLink | None], LatencyModel]:
    def build(
        model: str, _hw: str, tp: int, time_scale: float, link: KvLink | None
    ) -> LatencyModel:
        return MeasuredGpuModel(gpu, model, link or kv_link("nvlink-h100"), tp, time_scale)

    return build


LATENCY_MODELS: Mapping[str, LatencyModelSpec] = {
    "roofline": LatencyModelSpec("roofline", None, None, None, _roofline),
    "distserve-a100": LatencyModelSpec(
        "distserve-a100",
        "a100-80g",
        "nvlink-a100",
        lambda: distserve_models("distserve"),
        _distserve("distserve"),
    ),
    "distserve-vllm-a100": LatencyModelSpec(
        "distserve-vllm-a100",
        "a100-80g",
        "nvlink-a100",
        lambda: distserve_models("vllm"),
        _distserve("vllm"),
    ),
    "vidur-a100": LatencyModelSpec(
        "vidur-a100", "a100-80g", "nvlink-a100", lambda: vidur_models("a100"), _vidur("a100")
    ),
    "vidur-h100": LatencyModelSpec(
        "vidur-h100", "h100-80g", "nvlink-h100", lambda: vidur_models("h100"), _vidur("h100")
    ),
    "measured-h100": LatencyModelSpec(
        "measured-h100",
        "h100-80g",
        "nvlink-h100",
        lambda: measured_models("h100"),
        _measured("h100"),
    ),
    "measured-h200": LatencyModelSpec(
        "measured-h200",
        "h200",
        "nvlink-h100",
        lambda: measured_models("h200"),
        _measured("h200"),
    ),
}


def latency_model_spec(name: str) -> LatencyModelSpec:
    try:
        return LATENCY_MODELS[name]
    except KeyError:
        valid = ", ".join(LATENCY_MODELS)
        raise ValueError(f"unknown latency model {name!r}; valid: {valid}") from None


def build_latency_model(
    name: str,
    model: str,
    hardware: str,
    tp: int = 1,
    time_scale: float = 1.0,
    kv_link_name: str | None = None,
) -> LatencyModel:
    """The latency model `name` for `model` at `tp` (ValueError naming what is valid).

    `hardware` must be the model's own hardware for the GPU-measured ones (or any preset for
    the roofline); `kv_link_name` overrides the KV transfer pricing."""
    spec = latency_model_spec(name)
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}; valid: {', '.join(sorted(MODELS))}")
    if hardware not in HARDWARE:
        raise ValueError(f"unknown hardware {hardware!r}; valid: {', '.join(sorted(HARDWARE))}")
    if spec.hardware is not None and hardware != spec.hardware:
        raise ValueError(
            f"latency model {name!r} was measured on {spec.hardware}; set hardware to it "
            f"(got {hardware!r})"
        )
    link = kv_link(kv_link_name) if kv_link_name else None
    return spec.build(model, hardware, tp, time_scale, link)
