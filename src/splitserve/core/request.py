"""Request and SLO types as plain frozen data."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final

from splitserve.core.ids import RequestId, SloClassName

_U64: Final = 1 << 64


def seed_bits(seed: int) -> int:
    """A sampler seed (vLLM takes any int64, as OpenAI's API does) as the wire's uint64: the
    int64's two's-complement bits, so a negative seed reaches the engine unchanged."""
    if not -(1 << 63) <= seed < 1 << 63:
        raise ValueError(f"seed must be a 64-bit signed integer, got {seed}")
    return seed % _U64


def seed_of_bits(bits: int) -> int:
    """The int64 seed whose bits the wire's uint64 carries (inverse of `seed_bits`)."""
    return bits - _U64 if bits >= 1 << 63 else bits


class FinishReason(StrEnum):
    LENGTH = "length"
    """max_tokens reached."""
    STOP = "stop"
    """A stop token or stop string."""
    CANCELLED = "cancelled"
    ERROR = "error"


@dataclass(frozen=True, slots=True)
class SamplingSpec:
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    # The sampler's other knobs (vLLM's `SamplingParams`); the defaults change nothing.
    top_k: int = 0
    """0 (or -1): every token."""
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    min_tokens: int = 0
    bad_words: tuple[str, ...] = ()
    allowed_token_ids: tuple[int, ...] = ()
    """Empty: every token is allowed."""
    logprobs: int | None = None
    """None: no log probabilities. k >= 0: each output token's log probability and the k most
    likely tokens at its position (vLLM's `SamplingParams.logprobs`)."""
    structured_outputs: str = ""
    """Guided decoding: vLLM's `StructuredOutputsParams` as a JSON object; empty: none."""
    prompt_logprobs: int | None = None
    """None: none. k >= 0: each prompt token's log probability (after the first) and the k
    most likely tokens at its position (vLLM's `SamplingParams.prompt_logprobs`), returned
    with the first token."""

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if not 0 <= self.temperature < math.inf:  # NaN and inf too (a gRPC float can be)
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        for name in ("presence_penalty", "frequency_penalty", "repetition_penalty"):
            if not math.isfinite(getattr(self, name)):
                raise ValueError(f"{name} must be a finite number, got {getattr(self, name)}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            raise ValueError(f"top_k must be >= -1, got {self.top_k}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        if self.min_tokens < 0:
            raise ValueError(f"min_tokens must be >= 0, got {self.min_tokens}")
        if self.logprobs is not None and self.logprobs < 0:
            raise ValueError(f"logprobs must be >= 0, got {self.logprobs}")
        if self.prompt_logprobs is not None and self.prompt_logprobs < 0:
            raise ValueError(f"prompt_logprobs must be >= 0, got {self.prompt_logprobs}")


@dataclass(frozen=True, slots=True)
class TokenLogprobs:
    """Log probabilities at one output position, as vLLM returns them: the sampled token first,
    then the most likely tokens by rank (the sampled one not repeated when among them)."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    rank: int = 0
    """The sampled token's rank (1: the most likely); 0: unknown."""


@dataclass(frozen=True, slots=True)
class SloClass:
    """Latency targets for a class of requests.

    TTFT and TPOT targets hold at `percentile` over requests of the class; `attainment` is the
    fraction of requests that must meet both.
    """

    name: SloClassName
    ttft_ms: float
    tpot_ms: float
    percentile: float = 0.9
    priority: int = 0
    sheddable: bool = False

    def __post_init__(self) -> None:
        if self.ttft_ms <= 0 or self.tpot_ms <= 0:
            raise ValueError("SLO targets must be positive")
        if not 0 < self.percentile <= 1:
            raise ValueError(f"percentile must be in (0, 1], got {self.percentile}")


DEFAULT_SLO_CLASS = SloClass(name=SloClassName("default"), ttft_ms=2000.0, tpot_ms=200.0)


@dataclass(frozen=True, slots=True)
class Request:
    """One generation request as the serving path sees it (token ids, not text)."""

    id: RequestId
    prompt_token_ids: tuple[int, ...]
    sampling: SamplingSpec
    arrival_s: float
    slo_class: SloClassName = DEFAULT_SLO_CLASS.name
    tags: tuple[tuple[str, str], ...] = field(default=())
    priority: int = 0
    """The SLO class's priority (higher runs first), for step policies that use one."""
    deadline_s: float | None = None
    """First-token deadline on the holder's clock (the worker re-bases the router's budget)."""

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)
