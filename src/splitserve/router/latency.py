"""Per-worker latency models the router fits online (`policy.predict.latency`), by endpoint."""

from __future__ import annotations

from dataclasses import dataclass, field

from splitserve.core.ids import EndpointId
from splitserve.policy.predict.latency import PrefillRate, StepFit


@dataclass(slots=True)
class _Models:
    prefill: PrefillRate = field(default_factory=PrefillRate)
    step: StepFit = field(default_factory=StepFit)


class LatencyBook:
    def __init__(self) -> None:
        self._by_ep: dict[EndpointId, _Models] = {}

    def _get(self, eid: EndpointId) -> _Models:
        m = self._by_ep.get(eid)
        if m is None:
            m = self._by_ep[eid] = _Models()
        return m

    def observe_prefill(self, eid: EndpointId, tokens: int, seconds: float) -> None:
        """`tokens` computed (queue ahead of the prompt plus the prompt) in `seconds`."""
        self._get(eid).prefill.observe(tokens, seconds)

    def observe_decode(self, eid: EndpointId, batch: int, tpot_s: float) -> None:
        self._get(eid).step.observe(batch, tpot_s)

    def estimates(self, eid: EndpointId) -> tuple[float, float, float]:
        """(prefill tokens/s, step base s, step per-seq s); zeros: no estimate."""
        m = self._by_ep.get(eid)
        if m is None:
            return (0.0, 0.0, 0.0)
        base, per = m.step.params
        return (m.prefill.tokens_per_s, base, per)

    def forget(self, eid: EndpointId) -> None:
        self._by_ep.pop(eid, None)
