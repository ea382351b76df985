"""Workloads: arrival processes, length distributions, trace parsing and dataset-shaped presets.

Owns: turning a workload description into a tuple of `WorkItem`s (arrival time, prompt and output
lengths, SLO class). Randomness comes from a `numpy.random.Generator` the caller seeds; nothing
global. Pure: trace *parsing* takes lines of text, the runner reads the file.

Presets (`PRESETS`) are lognormal fits to published summary numbers, not the datasets themselves:
- `sharegpt`: mean prompt ≈ 161 and output ≈ 338 tokens (vLLM paper, §6.1 / Fig. 11, as cited in
  research/seed-pastfuture-alise.md); ShareGPT answer median ≈ 128 (research/seed-splitwise-
  tetriinfer.md). DistServe's Chatbot workload (Table 1) samples this dataset.
- `humaneval`: 164 problems; prompts are function signatures with docstrings (≈ 100–250 tokens),
  completions short (≈ 50–150 tokens); shapes read off DistServe Fig. 7(b), approximate.
- `longbench`: summarisation subset; prompts of thousands of tokens (≈ 2k–16k, mean ≈ 7k), outputs
  a few hundred; shapes read off DistServe Fig. 7(c), approximate.
Replace them with real token counts (`items_from_pairs`) where the datasets are at hand.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

import numpy as np

from splitserve.core.ids import SloClassName
from splitserve.core.request import DEFAULT_SLO_CLASS


@dataclass(frozen=True, slots=True)
class WorkItem:
    arrival_s: float
    num_prompt_tokens: int
    num_output_tokens: int
    slo_class: SloClassName = DEFAULT_SLO_CLASS.name

    def __post_init__(self) -> None:
        if self.num_prompt_tokens < 1 or self.num_output_tokens < 1:
            raise ValueError("prompt and output lengths must be >= 1")
        if not self.arrival_s >= 0:
            raise ValueError(f"arrival_s must be >= 0, got {self.arrival_s}")


# -- arrivals -----------------------------------------------------------------------------------


class ArrivalProcess(Protocol):
    def times_s(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """`n` non-decreasing arrival times starting near 0."""
        ...


@dataclass(frozen=True, slots=True)
class Poisson:
    rate_per_s: float

    def __post_init__(self) -> None:
        if not self.rate_per_s > 0:
            raise ValueError(f"rate_per_s must be > 0, got {self.rate_per_s}")

    def times_s(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return np.cumsum(rng.exponential(1.0 / self.rate_per_s, n))


@dataclass(frozen=True, slots=True)
class Gamma:
    """Gamma inter-arrival times: mean 1/rate, coefficient of variation `cv` (1 = Poisson)."""

    rate_per_s: float
    cv: float = 1.0

    def __post_init__(self) -> None:
        if not self.rate_per_s > 0 or not self.cv > 0:
            raise ValueError("rate_per_s and cv must be > 0")

    def times_s(self, n: int, rng: np.random.Generator) -> np.ndarray:
        shape = 1.0 / (self.cv * self.cv)
        scale = 1.0 / (self.rate_per_s * shape)
        return np.cumsum(rng.gamma(shape, scale, n))


# -- lengths ------------------------------------------------------------------------------------


class LengthDist(Protocol):
    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """`n` integer lengths, each >= 1."""
        ...


@dataclass(frozen=True, slots=True)
class Fixed:
    tokens: int

    def __post_init__(self) -> None:
        if self.tokens < 1:
            raise ValueError("tokens must be >= 1")

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return np.full(n, self.tokens, dtype=np.int64)


@dataclass(frozen=True, slots=True)
class Uniform:
    """Integers uniform on [low_tokens, high_tokens]."""

    low_tokens: int
    high_tokens: int

    def __post_init__(self) -> None:
        if not 1 <= self.low_tokens <= self.high_tokens:
            raise ValueError("need 1 <= low_tokens <= high_tokens")

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return rng.integers(self.low_tokens, self.high_tokens + 1, n, dtype=np.int64)


@dataclass(frozen=True, slots=True)
class LogNormal:
    """Lognormal with the given median and log-space sigma, clipped to [min_tokens, max_tokens]."""

    median_tokens: float
    sigma: float
    min_tokens: int = 1
    max_tokens: int = 1 << 20

    def __post_init__(self) -> None:
        if not self.median_tokens > 0 or self.sigma < 0:
            raise ValueError("median_tokens must be > 0 and sigma >= 0")
        if not 1 <= self.min_tokens <= self.max_tokens:
            raise ValueError("need 1 <= min_tokens <= max_tokens")

    @property
    def mean_tokens(self) -> float:
        """Mean before clipping: median · exp(σ²/2)."""
        return self.median_tokens * math.exp(self.sigma * self.sigma / 2)

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        raw = rng.lognormal(math.log(self.median_tokens), self.sigma, n)
        return np.clip(np.rint(raw), self.min_tokens, self.max_tokens).astype(np.int64)


@dataclass(frozen=True, slots=True)
class LengthPreset:
    prompt: LogNormal
    output: LogNormal
    source: str


PRESETS: dict[str, LengthPreset] = {
    "sharegpt": LengthPreset(
        LogNormal(95.0, 1.0, 4, 2048),
        LogNormal(200.0, 1.0, 4, 2048),
        "vLLM paper §6.1: ShareGPT mean prompt 161 / output 338 tokens",
    ),
    "humaneval": LengthPreset(
        LogNormal(150.0, 0.4, 40, 800),
        LogNormal(80.0, 0.6, 8, 512),
        "DistServe Fig. 7(b), approximate",
    ),
    "longbench": LengthPreset(
        LogNormal(6000.0, 0.5, 1000, 16000),
        LogNormal(250.0, 0.5, 16, 1024),
        "DistServe Fig. 7(c), approximate",
    ),
}


# -- building workloads -------------------------------------------------------------------------


def synthetic(
    arrivals: ArrivalProcess,
    prompt: LengthDist,
    output: LengthDist,
    num_requests: int,
    rng: np.random.Generator,
    slo_class: SloClassName = DEFAULT_SLO_CLASS.name,
) -> tuple[WorkItem, ...]:
    """`num_requests` items with arrivals, prompt lengths and output lengths drawn independently."""
    times = arrivals.times_s(num_requests, rng)
    prompts = prompt.sample(num_requests, rng)
    outputs = output.sample(num_requests, rng)
    return tuple(
        WorkItem(float(t), int(p), int(o), slo_class)
        for t, p, o in zip(times, prompts, outputs, strict=True)
    )


def items_from_pairs(
    arrivals: ArrivalProcess,
    pairs: Sequence[tuple[int, int]],
    num_requests: int,
    rng: np.random.Generator,
    slo_class: SloClassName = DEFAULT_SLO_CLASS.name,
) -> tuple[WorkItem, ...]:
    """Bootstrap-resample joint (prompt, output) pairs, with fresh arrivals (DistServe A.9-6)."""
    if not pairs:
        raise ValueError("need at least one (prompt, output) pair")
    times = arrivals.times_s(num_requests, rng)
    picks = rng.integers(0, len(pairs), num_requests)
    return tuple(
        WorkItem(float(t), pairs[i][0], pairs[i][1], slo_class)
        for t, i in zip(times, picks, strict=True)
    )


_AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


def parse_azure_trace(
    lines: Iterable[str],
    time_scale: float = 1.0,
    slo_class: SloClassName = DEFAULT_SLO_CLASS.name,
    max_requests: int | None = None,
) -> tuple[WorkItem, ...]:
    """Parse the Azure LLM inference 2023 CSV (TIMESTAMP, ContextTokens, GeneratedTokens).

    Arrival times are relative to the earliest row read (the rows need not be in time order;
    they are returned sorted by arrival) and multiplied by `time_scale` (0.5 replays the trace
    twice as fast). `max_requests` keeps the first that many usable rows in file order. Rows
    with a zero length are skipped (the trace has some), blank lines too; anything else that is
    not a row (an empty file, a header without rows, a short row, one with more values than the
    header, a timestamp or length that does not parse, a negative length) is a ValueError naming
    the line.
    """
    if not time_scale > 0:
        raise ValueError(f"time_scale must be > 0, got {time_scale}")
    it = iter(lines)
    first = next(it, None)
    if first is None:
        raise ValueError("the trace is empty (no TIMESTAMP,ContextTokens,GeneratedTokens header)")
    header = [h.strip() for h in first.split(",")]
    try:
        i_ts, i_ctx, i_gen = (header.index(c) for c in _AZURE_COLUMNS)
    except ValueError:
        raise ValueError(f"not an Azure LLM trace header: {header}") from None
    width = max(i_ts, i_ctx, i_gen) + 1
    rows: list[tuple[datetime, int, int]] = []
    t0: datetime | None = None
    for number, line in enumerate(it, start=2):
        if max_requests is not None and len(rows) >= max_requests:
            break
        if not line.strip():
            continue
        cols = line.strip().split(",")
        if len(cols) < width:
            raise ValueError(f"line {number}: {len(cols)} columns, the header has {len(header)}")
        if len(cols) > len(header):  # was read as if the extra values were not there
            raise ValueError(
                f"line {number}: {len(cols)} values, more than the header's {len(header)} columns"
            )
        try:
            ts = _parse_timestamp(cols[i_ts])
        except ValueError:
            raise ValueError(f"line {number}: TIMESTAMP {cols[i_ts]!r} is not a time") from None
        lengths = []
        for column, i in (("ContextTokens", i_ctx), ("GeneratedTokens", i_gen)):
            try:
                n = int(cols[i])
            except ValueError:
                raise ValueError(f"line {number}: {column} {cols[i]!r} is not an integer") from None
            if n < 0:
                raise ValueError(f"line {number}: {column} {n} is negative")
            lengths.append(n)
        ctx, gen = lengths
        # The earliest row (a skipped one too) is time 0: measured from the first row, a later
        # row stamped before it was refused with `arrival_s must be >= 0, got -1.0`.
        t0 = ts if t0 is None else min(t0, ts)
        if ctx < 1 or gen < 1:
            continue
        rows.append((ts, ctx, gen))
    if t0 is None:  # was () as for rows all of zero length, and callers said so
        raise ValueError("the trace has no rows, only its header")
    items = (
        WorkItem((ts - t0).total_seconds() * time_scale, ctx, gen, slo_class)
        for ts, ctx, gen in rows
    )
    return tuple(sorted(items, key=lambda w: w.arrival_s))


def _parse_timestamp(text: str) -> datetime:
    # The trace has 7 fractional digits; datetime takes at most 6.
    head, _, frac = text.strip().partition(".")
    return datetime.fromisoformat(f"{head}.{(frac + '000000')[:6]}" if frac else head)


def arrival_rate(items: Sequence[WorkItem]) -> float:
    """The mean arrival rate over the items' span: (n - 1) arrivals after the first, over the
    time from the first to the last (what `scale_to_rate` sets); a ValueError when they have no
    span (fewer than two, or all at one time)."""
    if len(items) < 2 or items[-1].arrival_s <= items[0].arrival_s:
        raise ValueError(f"its {len(items)} request(s) arrive at once: no arrival rate")
    return (len(items) - 1) / (items[-1].arrival_s - items[0].arrival_s)


def scale_to_rate(items: Sequence[WorkItem], rate_per_s: float) -> tuple[WorkItem, ...]:
    """Rescale arrival times so the mean arrival rate, (n - 1) / span, becomes `rate_per_s`
    (order unchanged). Items with no span (fewer than two, or all at one time) have no rate to
    rescale: a ValueError (they were returned unchanged, so every rate ran the same workload)."""
    if not rate_per_s > 0:
        raise ValueError(f"rate_per_s must be > 0, got {rate_per_s}")
    try:
        current = arrival_rate(items)
    except ValueError as err:
        raise ValueError(f"{err} to rescale") from None
    k = current / rate_per_s
    t0 = items[0].arrival_s
    return tuple(
        WorkItem((w.arrival_s - t0) * k, w.num_prompt_tokens, w.num_output_tokens, w.slo_class)
        for w in items
    )
