"""gRPC channel options every splitserve client channel uses (router -> worker, worker -> worker).

gRPC's default reconnect back-off starts at 1 s and grows by 1.6x (with jitter) up to 120 s, so a
worker that restarts is used again only seconds after it is ready. These options retry a broken
connection at least every 0.5 s (plus gRPC's 20 % jitter): a restarted worker is reconnected
within about a second of listening.
A frozen peer (SIGSTOP) keeps its TCP connection open and is not detected here: the router's
per-token stall timeout handles it (`DispatchSettings.token_stall_timeout_s`).
"""

from __future__ import annotations

from typing import Final

RECONNECT_MIN_MS: Final = 100
RECONNECT_MAX_MS: Final = 500

FAST_RECONNECT_OPTIONS: Final[tuple[tuple[str, int], ...]] = (
    ("grpc.initial_reconnect_backoff_ms", RECONNECT_MIN_MS),
    ("grpc.min_reconnect_backoff_ms", RECONNECT_MIN_MS),
    ("grpc.max_reconnect_backoff_ms", RECONNECT_MAX_MS),
)
