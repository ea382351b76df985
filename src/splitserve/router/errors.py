"""Errors the router raises while serving a request; the HTTP and gRPC faces map them.

`NoEligibleEndpoint` (from `core.errors`) -> 503 / UNAVAILABLE; `InvalidRequest` -> 400 /
INVALID_ARGUMENT; `WorkersFailed` -> 503 / UNAVAILABLE; `RequestTimeout` -> 504 / DEADLINE_EXCEEDED;
`RouterShuttingDown` -> 503 / UNAVAILABLE (an error event on a stream already under way).
"""

from __future__ import annotations

from splitserve.core.errors import EngineError, SplitserveError


class InvalidRequest(SplitserveError):  # noqa: N818 - reads as a condition, like the core errors
    """The request can never be served as given (too long, cannot fit, bad parameters).

    `param` names the offending request field when there is one.
    """

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class WorkersFailed(EngineError):  # noqa: N818
    """Every worker tried for the request failed."""


class RequestTimeout(SplitserveError):  # noqa: N818
    """The request ran past the router's request timeout."""


class Overloaded(SplitserveError):  # noqa: N818 - reads as a condition
    """The router refuses the request for now (admission): HTTP 429 with `Retry-After`,
    gRPC RESOURCE_EXHAUSTED. Shed (a sheddable class that cannot meet its SLO) or rejected
    (the admission queue is full of requests that may not be shed)."""

    def __init__(self, message: str, retry_after_s: float, slo_class: str) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
        self.slo_class = slo_class


class RouterShuttingDown(SplitserveError):  # noqa: N818
    """The router is shutting down and its drain grace period is over: the request is cut."""
