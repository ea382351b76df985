"""Structured logs: a JSON formatter and the router's one line per finished request.

`--log-format json` (router, worker, up; env `SPLITSERVE_LOG_FORMAT`) writes one JSON object per
line: `ts`, `level`, `component`, `logger`, `message`, the trace id when a span is current, and a
record's structured fields. The router logs each finished request once on the
`splitserve.access` logger (INFO) with `request_id` (router-minted), `client_request_id` (the
client's validated `x-request-id`, echoed in the response), `trace_id`, `slo_class`, `path`,
`outcome`, token counts and latencies; text logs show the same fields as `key=value`.
"""

from __future__ import annotations

import json
import logging
import time
from contextvars import ContextVar
from typing import Any, Final

from splitserve.obs import tracing

ACCESS: Final = logging.getLogger("splitserve.access")
FIELDS: Final = "splitserve_fields"
"""The `LogRecord` attribute holding a record's structured fields."""

client_request_id: ContextVar[str | None] = ContextVar("client_request_id", default=None)
"""The client's `x-request-id` of the request being handled (set by the HTTP edge)."""


def request_finished(
    request_id: str,
    *,
    outcome: str,
    path: str,
    slo_class: str,
    prompt_tokens: int,
    output_tokens: int,
    ttft_s: float | None,
    e2e_s: float | None,
    trace_id: str = "",
) -> None:
    """The per-request log line (INFO on `splitserve.access`)."""
    if not ACCESS.isEnabledFor(logging.INFO):
        return
    fields: dict[str, Any] = {
        "request_id": request_id,
        "client_request_id": client_request_id.get(),
        "trace_id": trace_id or tracing.current_trace_id() or None,
        "slo_class": slo_class,
        "path": path,
        "outcome": outcome,
        "prompt_tokens": prompt_tokens,
        "output_tokens": output_tokens,
        "ttft_ms": None if ttft_s is None else round(ttft_s * 1000, 3),
        "e2e_ms": None if e2e_s is None else round(e2e_s * 1000, 3),
    }
    text = " ".join(f"{k}={v}" for k, v in fields.items() if v is not None and k != "request_id")
    ACCESS.info("request %s finished: %s", request_id, text, extra={FIELDS: fields})


class JsonFormatter(logging.Formatter):
    def __init__(self, component: str) -> None:
        super().__init__()
        self.component = component

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "component": self.component,
            "logger": record.name,
            "message": record.getMessage(),
        }
        trace_id = tracing.current_trace_id()
        if trace_id:
            out["trace_id"] = trace_id
        fields = getattr(record, FIELDS, None)
        if isinstance(fields, dict):
            out.update({k: v for k, v in fields.items() if v is not None})
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)
