"""The operator's own HTTP endpoint: `/metrics` (Prometheus text) and `/healthz`.

`/healthz` answers 200 while every service's control loop ticked within three of its intervals
(or none runs yet), 503 otherwise, with one line per service either way.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

Health = Callable[[], tuple[bool, str]]


def serve(
    registry: CollectorRegistry, health: Health, host: str = "0.0.0.0", port: int = 8081
) -> ThreadingHTTPServer:
    """Start serving in a daemon thread; returns the server (`.shutdown()` to stop)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?")[0] == "/metrics":
                body, ctype, code = generate_latest(registry), CONTENT_TYPE_LATEST, 200
            elif self.path.split("?")[0] == "/healthz":
                ok, text = health()
                body, ctype, code = text.encode(), "text/plain; charset=utf-8", 200 if ok else 503
            else:
                body, ctype, code = b"not found\n", "text/plain", 404
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: object) -> None:
            return

    server = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, name="operator-metrics", daemon=True).start()
    return server


def health_of(
    last_ticks: Callable[[], Mapping[str, tuple[float, float]]], now: Callable[[], float]
) -> Health:
    """A health check over {service: (last tick time, interval)}."""

    def check() -> tuple[bool, str]:
        lines, ok = [], True
        t = now()
        for service, (last, interval) in sorted(last_ticks().items()):
            age = t - last
            fine = age <= 3 * interval
            ok = ok and fine
            lines.append(
                f"{service}: last tick {age:.0f} s ago (interval {interval:g} s)"
                f"{'' if fine else ' STALLED'}"
            )
        return ok, "\n".join(lines or ["ok: no service yet"]) + "\n"

    return check
