"""Router-side per-request log: one JSON line per finished request, for `splitserve sim validate`.

Turned on by `SPLITSERVE_REQUEST_LOG=<path>` in the router's environment (or a `RequestLog`
handed to `RouterServer`); appends to the file, one line per request when it ends, flushed per
line: outcome `ok` when it produced its final chunk, else the `splitserve_router_requests_total`
outcome (`cancelled`: the client left; `error`, `timeout`, `unavailable`, `shed`, ...) with the
tokens it had produced by then (`splitserve.sim.validate` replays those with one token or more
as load, not scored: they kept the workers busy until then). The format (documented in
docs/simulator.md, read back by `splitserve.sim.validate`):

    {"id": "...", "arrival_s": 12.345, "prompt_tokens": 512, "output_tokens": 64,
     "ttft_s": 0.081, "tpot_s": 0.0213, "latency_s": 1.423, "path": "disaggregated",
     "outcome": "ok"}

`arrival_s` is the router clock's reading when the request was built (only differences matter);
`ttft_s` is arrival to the first token leaving the dispatcher; `tpot_s` is (latency - ttft) /
(output_tokens - 1), null for one-token outputs; times are seconds.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import IO, Any

ENV = "SPLITSERVE_REQUEST_LOG"


class RequestLog:
    """Appends one JSON line per request to `path`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file: IO[str] | None = path.open("a", buffering=1, encoding="utf-8")

    @classmethod
    def from_env(cls) -> RequestLog | None:
        value = os.environ.get(ENV, "")
        return cls(Path(value)) if value else None

    def record(
        self,
        request_id: str,
        arrival_s: float,
        prompt_tokens: int,
        output_tokens: int,
        first_token_s: float | None,
        end_s: float,
        path: str,
        outcome: str,
    ) -> None:
        if self._file is None:
            return
        ttft = None if first_token_s is None else first_token_s - arrival_s
        tpot = None
        if first_token_s is not None and output_tokens > 1:
            tpot = (end_s - first_token_s) / (output_tokens - 1)
        row: dict[str, Any] = {
            "id": request_id,
            "arrival_s": round(arrival_s, 6),
            "prompt_tokens": prompt_tokens,
            "output_tokens": output_tokens,
            "ttft_s": None if ttft is None else round(ttft, 6),
            "tpot_s": None if tpot is None else round(tpot, 6),
            "latency_s": round(end_s - arrival_s, 6),
            "path": path,
            "outcome": outcome,
        }
        self._file.write(json.dumps(row) + "\n")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
