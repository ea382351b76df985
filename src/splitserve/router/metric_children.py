"""A labelled metric's children kept after the first look-up (issue 17, the eighteenth pass).

`prometheus_client`'s `labels(*values)` checks and converts its arguments and takes the metric's
lock on every call (~3 µs here); the router calls it several times per request (placement,
admission, the SLO book's lengths and outcomes) with a handful of distinct label values. A
`Children` keeps the child of each value tuple, so a look-up after the first is one dict
`get` (~0.3 µs). The children are the metric's own: what is recorded through one is what
`metric.labels(*values)` records. The router never removes a labelled series, so a kept child
is never orphaned.
"""

from __future__ import annotations

from typing import Any


class Children:
    """`metric.labels(*values)`, each child looked up once (values are strings)."""

    __slots__ = ("_kids", "_metric")

    def __init__(self, metric: Any) -> None:
        self._metric = metric
        self._kids: dict[tuple[str, ...], Any] = {}

    def __call__(self, *values: str) -> Any:
        kid = self._kids.get(values)
        if kid is None:
            kid = self._kids[values] = self._metric.labels(*values)
        return kid
