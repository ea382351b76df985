"""TetriInfer's decode-instance selection as a placement scorer: power-of-two over heavy:light mix.

TetriInfer's dispatcher (research/seed-splitwise-tetriinfer.md B3.6, B6.5-B6.8; seeds/
tetriinfer.txt §3.4) splits the decode instances into α (enough free KV for this request's prompt
plus its predicted decode) and β (the rest), samples two instances from α at random, and sends
the request to the one where it causes the least interference: the lowest heavy-decode :
light-decode ratio after placing it, so heavy decodes spread evenly. Ties go to more free KV.

As a scorer (`TetriPowerOfTwo`, registered as "tetriinfer-p2c") over the endpoints a profile
passes it:
* the two sampled α candidates score in [0.5, 1]: 0.5 + 0.489 / (1 + ratio after placement) +
  0.01 · free-KV fraction, so the better-balanced one ranks first and free KV only breaks
  (near-)ties (research B6.7); exact ties go to the first drawn;
* the other α endpoints score in [0.25, 0.5) by free-KV fraction (fallbacks);
* β endpoints score in [0, 0.25) by free-KV fraction: with α empty the request goes to the β
  instance with the most free KV (B6.6).

Inputs beyond `EndpointView`: the heavy/light counts per decode endpoint come from `mix_of`, a
function the owner injects (the simulator counts requests it routed and has not seen finish; a
live router would read its request table or the cluster monitor's broadcast). The predicted output
length is `RequestView.predicted_output_tokens` when set, else `max_tokens` (in the simulator the
true length), bucketed as the decode policy does (`length_granularity_tokens`, lower end).

Randomness: the two candidates are drawn by a `random.Random` seeded from (`seed`, request id), so
the pick is deterministic for a given seed and request, and no state survives between calls.

Invariants (property-tested): scores lie in [0, 1]; a sampled α candidate always outranks every
other endpoint; with at least one α endpoint no β endpoint ranks first.
Pure: no I/O, no clock, no global state.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from splitserve.core.ids import EndpointId
from splitserve.core.kv import blocks_for
from splitserve.policy.placement.base import EndpointView, RequestView, Scorer


@dataclass(frozen=True, slots=True)
class HeavyLightMix:
    """Decodes an instance holds (or has been sent), split by predicted length."""

    num_heavy: int = 0
    num_light: int = 0

    def __post_init__(self) -> None:
        if self.num_heavy < 0 or self.num_light < 0:
            raise ValueError("num_heavy and num_light must be >= 0")

    def ratio_with(self, heavy: bool) -> float:
        """Heavy : light ratio once one more (heavy or light) decode lands here."""
        h = self.num_heavy + (1 if heavy else 0)
        light = self.num_light + (0 if heavy else 1)
        return h / max(light, 1)


def _no_mix(_: EndpointId) -> HeavyLightMix:
    return HeavyLightMix()


def predicted_output_tokens(req: RequestView, granularity_tokens: int) -> int:
    """Lower end of the predicted length bucket (the paper's estimate)."""
    length = req.predicted_output_tokens
    if length is None:
        length = req.max_tokens
    return (length // granularity_tokens) * granularity_tokens


@dataclass(frozen=True, slots=True)
class TetriPowerOfTwo:
    kind: ClassVar[str] = "tetriinfer-p2c"
    seed: int = 0
    heavy_threshold_tokens: int = 128
    """A decode is heavy when its predicted length is at least this (paper: > 128 generated)."""
    length_granularity_tokens: int = 200
    """Predictor bucket width G (paper: 200); 1 = exact length."""
    mix_of: Callable[[EndpointId], HeavyLightMix] = field(default=_no_mix, compare=False)

    def __post_init__(self) -> None:
        if self.heavy_threshold_tokens < 1 or self.length_granularity_tokens < 1:
            raise ValueError("heavy_threshold_tokens and length_granularity_tokens must be >= 1")

    def is_heavy(self, req: RequestView) -> bool:
        predicted = predicted_output_tokens(req, self.length_granularity_tokens)
        return predicted >= self.heavy_threshold_tokens

    def alpha(self, req: RequestView, eps: Sequence[EndpointView]) -> list[EndpointView]:
        """Endpoints with free KV for the prompt plus the predicted decode."""
        predicted = predicted_output_tokens(req, self.length_granularity_tokens)
        tokens = req.num_prompt_tokens + max(predicted, 1)
        return [e for e in eps if blocks_for(tokens, e.kv_block_size) <= e.kv_free_blocks]

    def candidates(self, req: RequestView, alpha: Sequence[EndpointView]) -> list[EndpointView]:
        """Two α endpoints drawn at random (all of α when it has fewer than two)."""
        if len(alpha) <= 2:
            return list(alpha)
        ordered = sorted(alpha, key=lambda e: e.id)  # draw independent of the input order
        return random.Random(f"{self.seed}:{req.id}").sample(ordered, 2)

    def score(self, req: RequestView, eps: Sequence[EndpointView]) -> Mapping[EndpointId, float]:
        alpha = self.alpha(req, eps)
        alpha_ids = {e.id for e in alpha}
        drawn = [e.id for e in self.candidates(req, alpha)]
        picked = set(drawn)
        heavy = self.is_heavy(req)
        scores: dict[EndpointId, float] = {}
        for e in eps:
            headroom = _free_fraction(e)
            if e.id in picked:
                balance = 1.0 / (1.0 + self.mix_of(e.id).ratio_with(heavy))
                first = 1e-6 if e.id == drawn[0] else 0.0  # exact ties: the first drawn wins
                scores[e.id] = 0.5 + 0.489 * balance + 0.01 * headroom + first
            elif e.id in alpha_ids:
                scores[e.id] = 0.25 + 0.2499 * headroom
            else:
                scores[e.id] = 0.2499 * headroom
        return scores


def _free_fraction(e: EndpointView) -> float:
    if e.kv_total_blocks <= 0:
        return 0.0
    return min(1.0, max(0.0, e.kv_free_blocks / e.kv_total_blocks))


_conforms: tuple[type[Scorer], ...] = (TetriPowerOfTwo,)
