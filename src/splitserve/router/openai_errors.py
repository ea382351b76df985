"""OpenAI-style errors: `{"error": {message, type, param, code}}` with the matching status.

Serving errors map as: `InvalidRequest` -> 400, `Overloaded` (admission) -> 429 with
`Retry-After`, `NoEligibleEndpoint` -> 503 naming the condition, `RequestTimeout` -> 504, any
other `SplitserveError` (every worker failed) -> 503, anything else -> 500.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi.responses import JSONResponse

from splitserve.core.errors import NoEligibleEndpoint, SplitserveError
from splitserve.router.errors import (
    InvalidRequest,
    Overloaded,
    RequestTimeout,
    RouterShuttingDown,
)

log = logging.getLogger(__name__)


def error_body(
    message: str, type_: str, param: str | None = None, code: str | int | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


class ApiError(Exception):
    """An error to answer with an OpenAI error body."""

    def __init__(
        self,
        status: int,
        message: str,
        type_: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.headers = headers
        self.status = status
        self.message = message
        self.type = type_
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def api_error_from(err: BaseException) -> ApiError:
    """Map a serving error to its HTTP status and OpenAI error type."""
    if isinstance(err, InvalidRequest):
        return ApiError(400, str(err), param=err.param)
    if isinstance(err, Overloaded):
        retry = str(max(1, int(err.retry_after_s)))
        return ApiError(
            429, str(err), "requests", code="rate_limit_exceeded", headers={"Retry-After": retry}
        )
    if isinstance(err, NoEligibleEndpoint):
        return ApiError(503, f"no worker can take the request: {err}", "service_unavailable")
    if isinstance(err, RequestTimeout):
        return ApiError(504, str(err), "timeout")
    if isinstance(err, RouterShuttingDown):
        return ApiError(503, str(err), "service_unavailable", code="router_shutting_down")
    if isinstance(err, SplitserveError):
        return ApiError(503, f"the request failed on every worker tried: {err}", "server_error")
    log.error("unexpected error while serving: %r", err, exc_info=err)
    return ApiError(500, "internal error", "server_error")
