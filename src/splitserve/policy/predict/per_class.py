"""The router's default output-length predictor: learns online, per SLO class and prompt bucket.

One `BucketedPredictor` (P(output bin | power-of-two prompt bin), median bin) per class, so an
interactive class's short answers and a batch class's long ones are not mixed. Classes are the
service's (bounded); an unknown class name shares the `other` table.
"""

from __future__ import annotations

from collections.abc import Iterable

from splitserve.policy.predict.base import LengthQuery, OutputLengthPredictor
from splitserve.policy.predict.bucketed import BucketedParams, BucketedPredictor


class PerClassPredictor:
    def __init__(self, classes: Iterable[str], params: BucketedParams | None = None) -> None:
        self._params = params or BucketedParams()
        self._tables = {c: BucketedPredictor(self._params) for c in classes}
        self._other = BucketedPredictor(self._params)

    def _table(self, slo_class: str) -> BucketedPredictor:
        return self._tables.get(slo_class, self._other)

    def predict(self, slo_class: str, query: LengthQuery) -> int:
        return self._table(slo_class).predict(query)

    def observe(self, slo_class: str, num_prompt_tokens: int, num_output_tokens: int) -> None:
        self._table(slo_class).observe(num_prompt_tokens, num_output_tokens)


class ClasslessPredictor:
    """Any `OutputLengthPredictor` shared by every class (the CRD's other predictor choices)."""

    def __init__(self, inner: OutputLengthPredictor) -> None:
        self._inner = inner

    def predict(self, slo_class: str, query: LengthQuery) -> int:
        return self._inner.predict(query)

    def observe(self, slo_class: str, num_prompt_tokens: int, num_output_tokens: int) -> None:
        self._inner.observe(num_prompt_tokens, num_output_tokens)
