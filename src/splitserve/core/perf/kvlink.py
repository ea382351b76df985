"""KV-transfer cost models: seconds to move N bytes of KV cache from a prefill to a decode worker.

Two forms: `LinearLink` (a fixed latency plus bytes over a bandwidth, the roofline's form) and
`MeasuredLink` (measured (bytes, seconds) points, interpolated piecewise-linearly, extrapolated
past the largest with the slope of its upper half). `KV_LINKS` names the measured ones:

- `nvlink-a100`, `nvlink-h100`: NCCL send/recv between two GPUs of one DGX node, from Vidur's
  published network profiles (`published/_vidur.py`, MIT);
- `infiniband-a100`, `infiniband-h100`: the same between one GPU on each of two DGX nodes;
- `nixl-loopback-cpu`: NIXL (UCX) transfers between two processes on one machine over loopback,
  measured on the project's development machine (`published/_nixl_loopback.py`); the link the
  vLLM CPU workers use in local P/D runs.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from splitserve.core.perf.published import _nixl_loopback, _vidur


class KvLink(Protocol):
    def transfer_s(self, num_bytes: int) -> float:
        """Seconds to move `num_bytes` (0 for nothing to move)."""
        ...


@dataclass(frozen=True, slots=True)
class LinearLink:
    latency_s: float
    bandwidth_bytes_s: float

    def __post_init__(self) -> None:
        if self.latency_s < 0 or self.bandwidth_bytes_s <= 0:
            raise ValueError("a link needs latency >= 0 and bandwidth > 0")

    def transfer_s(self, num_bytes: int) -> float:
        if num_bytes <= 0:
            return 0.0
        return self.latency_s + num_bytes / self.bandwidth_bytes_s


@dataclass(frozen=True, slots=True)
class MeasuredLink:
    """Measured transfer times: `sizes` (bytes, strictly increasing), `seconds` (same length).

    Below the smallest size the smallest's time (the latency floor); between points linear; past
    the largest, linear with the slope between the middle and the last point (the bandwidth the
    large transfers reached). Taken as the running maximum so the model is monotone even where
    the measurements are noisy."""

    name: str
    sizes: tuple[int, ...]
    seconds: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.sizes) != len(self.seconds) or len(self.sizes) < 2:
            raise ValueError("a measured link needs two or more (bytes, seconds) points")
        if any(b <= a for a, b in zip(self.sizes, self.sizes[1:], strict=False)):
            raise ValueError("measured link sizes must be strictly increasing")
        mono: list[float] = []
        for s in self.seconds:
            if s <= 0:
                raise ValueError("measured link times must be > 0")
            mono.append(max(s, mono[-1]) if mono else s)
        object.__setattr__(self, "seconds", tuple(mono))

    @property
    def tail_bandwidth_bytes_s(self) -> float:
        mid = len(self.sizes) // 2
        dx = self.sizes[-1] - self.sizes[mid]
        dy = self.seconds[-1] - self.seconds[mid]
        return dx / dy if dy > 0 else float("inf")

    def transfer_s(self, num_bytes: int) -> float:
        if num_bytes <= 0:
            return 0.0
        xs, ys = self.sizes, self.seconds
        if num_bytes <= xs[0]:
            return ys[0]
        if num_bytes >= xs[-1]:
            return ys[-1] + (num_bytes - xs[-1]) / self.tail_bandwidth_bytes_s
        i = bisect_right(xs, num_bytes)
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        return y0 + (y1 - y0) * (num_bytes - x0) / (x1 - x0)


def _ms(name: str, table: tuple[tuple[int, ...], tuple[float, ...]]) -> MeasuredLink:
    return MeasuredLink(name, table[0], tuple(ms / 1000.0 for ms in table[1]))


def _links() -> dict[str, MeasuredLink]:
    out = {}
    for (gpu, link), table in _vidur.SEND_RECV.items():
        out[f"{link}-{gpu}"] = _ms(f"{link}-{gpu}", table)
    out["nixl-loopback-cpu"] = MeasuredLink(
        "nixl-loopback-cpu", _nixl_loopback.SIZES, _nixl_loopback.SECONDS
    )
    return out


KV_LINKS: Mapping[str, MeasuredLink] = _links()
"""Measured KV links by name (see the module docstring)."""


def kv_link(name: str) -> MeasuredLink:
    try:
        return KV_LINKS[name]
    except KeyError:
        raise ValueError(
            f"unknown KV link {name!r}; valid: {', '.join(sorted(KV_LINKS))}"
        ) from None
