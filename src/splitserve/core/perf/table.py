"""Profiled latency model (Vidur-style): measured step-time curves, interpolated.

Owns: `ProfileCurve` (piecewise-linear interpolation of measured points, linear extrapolation past
the last one, flat below the first) and `ProfiledModel`, which prices a batch as the sum of four
measured components, each a function of one batch feature, the way Vidur splits a step into
operator classes (token-level GEMMs, prefill attention, decode attention, fixed overhead):

    step_s = gemm(new tokens) + prefill_attention(Σ n·(ctx + (n+1)/2)) + decode_attention(Σ ctx)
             + overhead_s

Profiles come from a GPU run (torch operator timings or a live engine's per-step log) as rows
`component,x,seconds`; `parse_profile_csv` turns such text into a model and `ProfiledModel.
sampled_from` builds one from another model (a roofline) for tests and for bootstrapping.
Pure: parsing takes lines, never paths. Curves must be non-decreasing, so the model is monotone.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from splitserve.core.perf.protocol import BatchShape, LatencyModel

COMPONENTS = ("gemm", "prefill_attention", "decode_attention")


@dataclass(frozen=True, slots=True)
class ProfileCurve:
    """Measured (x, seconds) points; x strictly increasing, seconds non-decreasing and >= 0."""

    xs: tuple[float, ...]
    ys: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.xs) != len(self.ys) or not self.xs:
            raise ValueError("a curve needs one or more (x, seconds) points, as many xs as ys")
        if any(b <= a for a, b in zip(self.xs, self.xs[1:], strict=False)):
            raise ValueError("curve xs must be strictly increasing")
        if any(y < 0 for y in self.ys) or any(
            b < a for a, b in zip(self.ys, self.ys[1:], strict=False)
        ):
            raise ValueError("curve seconds must be >= 0 and non-decreasing (monotone model)")

    def at(self, x: float) -> float:
        xs, ys = self.xs, self.ys
        if x <= xs[0]:
            return ys[0] if x > 0 else 0.0
        i = bisect_right(xs, x)
        if i == len(xs):
            if len(xs) == 1:
                return ys[0] * x / xs[0]  # one point: proportional
            i -= 1  # extrapolate with the last segment's slope
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def prefill_attention_work(batch: BatchShape) -> float:
    """Σ n·(ctx + (n+1)/2): query-key pairs of causal attention over each chunk."""
    return sum(n * (ctx + (n + 1) / 2.0) for n, ctx in batch.prefill_chunks)


@dataclass(frozen=True, slots=True)
class ProfiledModel:
    gemm: ProfileCurve
    """Seconds of the token-level operators (GEMMs, norms, activations) by new tokens."""
    prefill_attention: ProfileCurve
    """Seconds of prefill attention by `prefill_attention_work`."""
    decode_attention: ProfileCurve
    """Seconds of decode attention by context tokens read (Σ decode contexts)."""
    overhead_s: float = 0.0
    kv_link_bw_bytes_s: float = 25e9
    kv_link_latency_s: float = 0.0005

    def __post_init__(self) -> None:
        if self.overhead_s < 0 or not self.kv_link_bw_bytes_s > 0 or self.kv_link_latency_s < 0:
            raise ValueError("overhead and link latency must be >= 0, bandwidth > 0")

    @property
    def ready(self) -> bool:
        return True

    def step_s(self, batch: BatchShape) -> float:
        if batch.is_empty:
            return 0.0
        return (
            self.overhead_s
            + self.gemm.at(batch.num_new_tokens)
            + self.prefill_attention.at(prefill_attention_work(batch))
            + self.decode_attention.at(sum(batch.decode_contexts))
        )

    def kv_transfer_s(self, num_bytes: int) -> float:
        if num_bytes <= 0:
            return 0.0
        return self.kv_link_latency_s + num_bytes / self.kv_link_bw_bytes_s

    @classmethod
    def sampled_from(
        cls,
        model: LatencyModel,
        token_points: Sequence[int] = (1, 8, 32, 128, 512, 1024, 2048, 4096, 8192),
        context_points: Sequence[int] = (16, 256, 1024, 4096, 16384, 65536, 262144),
    ) -> ProfiledModel:
        """A table measured on `model` instead of a GPU: each component isolated by differencing
        batches (so the overhead is counted once)."""
        empty_decode = model.step_s(BatchShape(decode_contexts=(0,)))
        gemm = ProfileCurve(
            tuple(float(n) for n in token_points),
            tuple(model.step_s(BatchShape(decode_contexts=(0,) * n)) for n in token_points),
        )
        overhead = max(0.0, empty_decode - gemm.at(1))
        # Prefill attention: single chunks of n tokens (ctx 0) minus their GEMM share.
        pa_x, pa_y = [], []
        for n in token_points:
            shape = BatchShape(prefill_chunks=((n, 0),))
            pa_x.append(prefill_attention_work(shape))
            pa_y.append(
                max(0.0, model.step_s(shape) - model.step_s(BatchShape(decode_contexts=(0,) * n)))
            )
        da_y = [
            max(0.0, model.step_s(BatchShape(decode_contexts=(c,))) - empty_decode)
            for c in context_points
        ]
        return cls(
            gemm=gemm,
            prefill_attention=ProfileCurve(tuple(pa_x), tuple(_monotone(pa_y))),
            decode_attention=ProfileCurve(
                tuple(float(c) for c in context_points), tuple(_monotone(da_y))
            ),
            overhead_s=overhead,
            kv_link_bw_bytes_s=_bw(model),
            kv_link_latency_s=model.kv_transfer_s(1),
        )


def _bw(model: LatencyModel) -> float:
    big = 1 << 30
    extra = model.kv_transfer_s(big + 1) - model.kv_transfer_s(1)
    return big / extra if extra > 0 else 25e9


def _monotone(ys: Iterable[float]) -> list[float]:
    out: list[float] = []
    for y in ys:
        out.append(max(y, out[-1]) if out else y)
    return out


def _number(text: str, name: str, number: int, line: str) -> float:
    """A finite number >= 0 (NaN would price every step NaN; a negative one bends the curve)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(
            f"line {number}: {name} must be a finite number >= 0, got {text!r} (row {line!r})"
        )
    return value


def parse_profile_csv(lines: Iterable[str], overhead_s: float = 0.0) -> ProfiledModel:
    """Rows `component,x,seconds` (header optional); components: gemm, prefill_attention,
    decode_attention. Duplicate xs are averaged. x and seconds must be finite numbers >= 0
    (ValueError naming the line)."""
    points: dict[str, dict[float, list[float]]] = {c: {} for c in COMPONENTS}
    for number, raw in enumerate(lines, start=1):
        line = raw.strip()
        if not line or line.startswith("#") or line.lower().startswith("component"):
            continue
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 3 or parts[0] not in points:
            raise ValueError(
                f"line {number}: bad profile row {line!r}; want component,x,seconds with "
                f"component in {', '.join(COMPONENTS)}"
            )
        x = _number(parts[1], "x", number, line)
        seconds = _number(parts[2], "seconds", number, line)
        points[parts[0]].setdefault(x, []).append(seconds)
    curves: dict[str, ProfileCurve] = {}
    for comp, by_x in points.items():
        if not by_x:
            raise ValueError(f"profile has no {comp!r} rows")
        xs = sorted(by_x)
        curves[comp] = ProfileCurve(
            tuple(xs), tuple(_monotone(sum(v) / len(v) for v in (by_x[x] for x in xs)))
        )
    return ProfiledModel(
        curves["gemm"], curves["prefill_attention"], curves["decode_attention"], overhead_s
    )
