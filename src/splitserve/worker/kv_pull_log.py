"""Decode-worker per-request hand-off log: one JSON line per KV pull, for `splitserve sim
validate --run-steps` (the P/D hand-off each request paid, measured on the worker).

Turned on by `SPLITSERVE_KV_PULL_LOG=<path>` in the worker's environment (`tools/record_run.py
--steps-out DIR` sets it to `DIR/kv_pulls.jsonl` for every worker `splitserve up` starts);
appends, one line per pull the engine reports (`on_kv_pull`), flushed per line. Lines are short
(well under the pipe-buffer size), so workers sharing the file append whole lines:

    {"id": "...", "received_s": 12.301, "pull_start_s": 12.303, "pull_end_s": 12.331,
     "bytes": 262144}

Times are the worker's monotonic clock (the router log's clock on one machine): `received_s`
when the `Decode` RPC reached the worker (null if not seen), `pull_start_s` / `pull_end_s` the
engine's pull (for vLLM: its `add_request` to the step that lists the request in
`finished_recving`, `vllm_adapter.stats.KvPullTimer`), the end read when the report reaches the
worker's event loop (the engine thread's hop, sub-millisecond when the loop is free), the start
that end less the pull's own duration.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import IO

ENV = "SPLITSERVE_KV_PULL_LOG"


class KvPullLog:
    """Appends one JSON line per KV pull to `path`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file: IO[str] | None = path.open("a", buffering=1, encoding="utf-8")

    @classmethod
    def from_env(cls) -> KvPullLog | None:
        value = os.environ.get(ENV, "")
        return cls(Path(value)) if value else None

    def record(
        self,
        request_id: str,
        received_s: float | None,
        end_s: float,
        seconds: float,
        num_bytes: int,
    ) -> None:
        if self._file is None:
            return
        row = {
            "id": request_id,
            "received_s": None if received_s is None else round(received_s, 6),
            "pull_start_s": round(end_s - seconds, 6),
            "pull_end_s": round(end_s, 6),
            "bytes": num_bytes,
        }
        self._file.write(json.dumps(row) + "\n")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
