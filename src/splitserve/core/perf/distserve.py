"""DistServe's fitted A100-80GB step-time models (OPT-13B / 66B), as a `LatencyModel`.

DistServe (Zhong et al., OSDI'24, Appendix A and its simulator) fits, per model and TP degree,
on A100-SXM-80GB, for its own engine and for vLLM as it measured it:

    prefill batch (prompt lengths l_i):       a + b·Σ l_i + c·Σ l_i²           ms
    decode step (B sequences, lengths sum L): a + b·L + c·B                    ms
        (one triple while B < threshold, another from the threshold on)

The coefficients are vendored as published (`published/_distserve.py`). How our batch shapes
map onto the fits, where DistServe's engine never runs such a shape (approximations, stated):

- A chunk of `n` new tokens after `ctx` cached ones counts `n` in Σ l and `n·(n + 2·ctx)` in
  Σ l² (the growth of the causal attention term, (ctx+n)² − ctx²); a whole prompt is `n = l`.
- A decoding sequence with `ctx` tokens in its KV cache counts `ctx + 1` in L (its length
  including the token being decoded).
- From the small/large threshold on, the decode time is never below the small-batch fit at the
  threshold (the published pair steps down there for some models; a model must be monotone).
- A step mixing prefill and decode (chunked prefill) costs the prefill fit plus the decode fit
  minus the decode fit's constant `a` (the decode rows ride on the prefill's weight pass).
  DistServe's own engines never mix, so this is an extrapolation.

Pipeline parallelism is not modelled (our workers are one TP group each). The KV transfer is
priced by a `KvLink` (NVLink between two A100s of one node by default: DistServe's Alg. 2 puts
the prefill and decode instances of a stage in one node).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from splitserve.core.perf.kvlink import KvLink
from splitserve.core.perf.protocol import BatchShape
from splitserve.core.perf.published import _distserve

ENGINES = ("distserve", "vllm")
"""`distserve`: DistServe's own engine; `vllm`: vLLM (v0.2) as DistServe measured it."""

Triple = tuple[float, float, float]


@dataclass(frozen=True, slots=True)
class DistServeFit:
    threshold: int
    prefill: Triple
    decode_small: Triple
    decode_large: Triple

    def prefill_ms(self, sum_len: float, sum_sq: float) -> float:
        a, b, c = self.prefill
        return a + b * sum_len + c * sum_sq

    def decode_ms(self, batch_size: int, sum_len: float) -> float:
        if batch_size < self.threshold:
            a, b, c = self.decode_small
            return a + b * sum_len + c * batch_size
        a, b, c = self.decode_large
        large = a + b * sum_len + c * batch_size
        # The two published fits meet with a step down at the threshold for some models
        # (OPT-13B TP 1: 23.6 ms at B = 94 against 22.2 ms at B = 95); hold the small-batch
        # value until the large-batch fit passes it, so a bigger batch never costs less.
        a, b, c = self.decode_small
        return max(large, a + b * sum_len + c * (self.threshold - 1))

    def decode_const_ms(self, batch_size: int) -> float:
        return (self.decode_small if batch_size < self.threshold else self.decode_large)[0]


def distserve_fit(engine: str, model: str, tp: int) -> DistServeFit:
    """The published fit for (`engine`, `model`, `tp`); ValueError naming what exists."""
    try:
        thr, p, s, large = _distserve.FITS[(engine, model, tp)]
    except KeyError:
        have = sorted(f"{e}/{m}/tp{t}" for e, m, t in _distserve.FITS)
        raise ValueError(
            f"DistServe published no {engine} fit for {model} at TP {tp}; have: {', '.join(have)}"
        ) from None
    return DistServeFit(thr, p, s, large)


def distserve_models(engine: str) -> tuple[tuple[str, int], ...]:
    """(model, tp) pairs with a published fit for `engine`."""
    return tuple(sorted((m, t) for e, m, t in _distserve.FITS if e == engine))


def max_num_tokens(model: str, tp: int) -> int | None:
    """KV tokens that fit on one TP group (DistServe's `max_num_tokens.csv`, PP 1)."""
    return _distserve.MAX_NUM_TOKENS.get((model, tp, 1))


@dataclass(frozen=True, slots=True)
class DistServeModel:
    engine: str
    model: str
    tp: int
    kv_link: KvLink
    time_scale: float = 1.0
    fit: DistServeFit = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ValueError(f"unknown DistServe engine {self.engine!r}; valid: {ENGINES}")
        if self.time_scale <= 0:
            raise ValueError(f"time_scale must be > 0, got {self.time_scale}")
        object.__setattr__(self, "fit", distserve_fit(self.engine, self.model, self.tp))

    @property
    def ready(self) -> bool:
        return True

    def step_s(self, batch: BatchShape) -> float:
        chunks = batch.prefill_chunks
        contexts = batch.decode_contexts
        if not chunks and not contexts:
            return 0.0
        fit = self.fit
        ms = 0.0
        if chunks:
            sum_len = float(sum(n for n, _ in chunks))
            sum_sq = float(sum(n * (n + 2 * ctx) for n, ctx in chunks))
            ms = fit.prefill_ms(sum_len, sum_sq)
        if contexts:
            b = len(contexts)
            decode = fit.decode_ms(b, float(sum(contexts) + b))
            ms += decode - fit.decode_const_ms(b) if chunks else decode
        return max(ms, 0.0) / 1000.0 * self.time_scale

    def kv_transfer_s(self, num_bytes: int) -> float:
        return self.kv_link.transfer_s(num_bytes) * self.time_scale
