"""Machine speed during a recorded run: a probe's time series, turned into a step-time factor.

Owns: the speed-probe format and `SpeedTrace`, which maps a time of the recorded run to how much
slower (> 1) or faster (< 1) the machine ran then than while the latency profile was taken.

Why: on a shared machine the vLLM CPU workers' step times change by multiples within one run
(docs/simulator.md, "Where the vLLM error comes from"), so a profile taken at another moment
prices the replay at the wrong speed. A probe process runs a fixed CPU loop every ~0.1 s beside
the workers (`tools/speed_probe.py`, started by `tools/record_run.py --speed-probe`) and writes
how long each loop took. The replay then multiplies each simulated step by the probe's time at
that moment over its median while the profile ran (`Cluster(speed=...)`).

Approximation, stated: the probe measures the CPU time a process gets on this machine, not the
worker's own step; it assumes a worker's step slows by the same factor as a pure-Python loop
(memory-bandwidth contention, for one, slows the two differently).

Format (JSON lines, on the router's clock: `time.monotonic()`, as the request log):

    {"t_s": 1234.5, "probe_s": 0.0021}          # one probe: when it ended, how long it took
    {"reference_start_s": 1300.0, "reference_end_s": 1350.0}   # the profile's window (once)

Without a reference line the reference is the median over the whole trace. Pure: parses lines,
returns values.
"""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

WINDOW_S = 1.0
"""Each factor is the median of the probes within ± half this of the step's start."""


@dataclass(frozen=True, slots=True)
class SpeedTrace:
    times_s: tuple[float, ...]
    """When each probe ended (ascending)."""
    probe_s: tuple[float, ...]
    reference_s: float
    """The probe's median time while the latency profile was taken."""

    def factor(self, t_s: float, window_s: float = WINDOW_S) -> float:
        """Median probe time within ± window/2 of `t_s` over the reference (the nearest probe's
        when none falls in the window)."""
        lo = bisect.bisect_left(self.times_s, t_s - window_s / 2)
        hi = bisect.bisect_right(self.times_s, t_s + window_s / 2)
        if hi > lo:
            value = float(np.median(self.probe_s[lo:hi]))
        else:
            i = min(max(lo, 0), len(self.times_s) - 1)
            if i > 0 and abs(self.times_s[i - 1] - t_s) < abs(self.times_s[i] - t_s):
                i -= 1
            value = self.probe_s[i]
        return value / self.reference_s

    def step_function(self, origin_s: float, bin_s: float = 0.25) -> SpeedFactor:
        """The factor as a function of simulated time (`origin_s` on the trace's clock is 0),
        precomputed on `bin_s` bins so a replay pays one lookup per step."""
        end = self.times_s[-1] - origin_s
        n = max(1, int(end / bin_s) + 2)
        values = tuple(self.factor(origin_s + (i + 0.5) * bin_s) for i in range(n))
        return SpeedFactor(bin_s, values)


@dataclass(frozen=True, slots=True)
class SpeedFactor:
    """Step-time factor on fixed bins of simulated time (the last bin holds beyond the end)."""

    bin_s: float
    values: tuple[float, ...]

    def __call__(self, now_s: float) -> float:
        i = int(now_s / self.bin_s) if now_s > 0 else 0
        return self.values[i if i < len(self.values) else -1]


def parse_speed_trace(lines: Iterable[str]) -> SpeedTrace:
    """Read the probe's JSON lines (see the module docstring); refuses an empty or bad trace."""
    samples: list[tuple[float, float]] = []
    window: tuple[float, float] | None = None
    for number, line in enumerate(lines, 1):
        text = line.strip()
        if not text:
            continue
        try:
            row = json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(f"speed trace line {number}: not JSON ({err})") from err
        if not isinstance(row, dict):
            raise ValueError(f"speed trace line {number}: not an object")
        if "reference_start_s" in row or "reference_end_s" in row:
            try:
                window = (float(row["reference_start_s"]), float(row["reference_end_s"]))
            except (KeyError, TypeError, ValueError) as err:
                raise ValueError(
                    f"speed trace line {number}: needs reference_start_s and reference_end_s"
                ) from err
            if not all(math.isfinite(v) for v in window):  # JSON's NaN / Infinity parse
                raise ValueError(
                    f"speed trace line {number}: reference_start_s and reference_end_s must be "
                    f"finite numbers, got {window[0]} and {window[1]}"
                )
            if window[0] > window[1]:
                raise ValueError(
                    f"speed trace line {number}: reference_start_s {window[0]} is after "
                    f"reference_end_s {window[1]}"
                )
            continue
        try:
            t, p = float(row["t_s"]), float(row["probe_s"])
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"speed trace line {number}: needs numbers t_s and probe_s") from err
        if not math.isfinite(t):  # a NaN time sorted anywhere
            raise ValueError(f"speed trace line {number}: t_s must be a finite number, got {t}")
        if not (math.isfinite(p) and p > 0):  # a NaN probe priced every step NaN
            raise ValueError(
                f"speed trace line {number}: probe_s must be a finite number > 0, got {p}"
            )
        samples.append((t, p))
    if not samples:
        raise ValueError("speed trace has no probes")
    samples.sort()
    times = tuple(t for t, _ in samples)
    probes = tuple(p for _, p in samples)
    ref_values = list(probes)
    if window is not None:
        lo, hi = window
        ref_values = [p for t, p in samples if lo <= t <= hi]
        if not ref_values:
            raise ValueError(f"speed trace: no probe inside the reference window {lo}..{hi}")
    return SpeedTrace(times, probes, float(np.median(ref_values)))
