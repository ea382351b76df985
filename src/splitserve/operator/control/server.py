"""The operator's own HTTP endpoint: `/metrics` (Prometheus text) and `/healthz`.

`/healthz` answers 503 while the operator's start-up has not succeeded ("starting", or
"start-up failing: <error>, retrying in N s" — a missing kubeconfig, an unreachable API server),
then 200 while every service's control loop ticked within three of its intervals (or none runs
yet: "ok: no service yet"), 503 otherwise, with one line per service either way.

It is a *readiness* check, and the chart probes it as one: a readiness failure marks the pod not
ready (visible in `kubectl get pods`, `kubectl rollout status`, `helm --wait`) without restarting
it. A restart would not fix what makes start-up fail — the kubeconfig or ServiceAccount token is
the same after it, an API server outage is outside the pod — and the operator already retries its
start-up in-process (`handlers.STARTUP_RETRY_S`); a liveness restart would only add the kubelet's
crash-loop back-off to the recovery once the cause is gone.
"""

from __future__ import annotations

import threading
import time
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


class Startup:
    """The operator's start-up as `/healthz` reports it. Untracked until `begin()` (a process
    that serves `/healthz` without kopf's start-up, e.g. a test, is judged by its loops only);
    then "starting" until `succeeded()`, and "failing" with the error and the time of the next
    try after each `failed()`. Thread-safe: kopf records, the HTTP thread reads."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._guard = threading.Lock()
        self._phase = "untracked"
        self._error = ""
        self._retry_at: float | None = None

    def begin(self) -> None:
        """Start-up is about to run: not healthy until it succeeds."""
        with self._guard:
            if self._phase == "untracked":
                self._phase = "starting"

    def failed(self, error: BaseException | str, retry_in_s: float | None) -> None:
        """A try failed; the next one in `retry_in_s` seconds (None: not retried)."""
        text = str(error).strip().splitlines()
        with self._guard:
            self._phase = "failing"
            self._error = text[0].rstrip(".") if text else type(error).__name__
            self._retry_at = None if retry_in_s is None else self._clock() + retry_in_s

    def succeeded(self) -> None:
        with self._guard:
            self._phase, self._error, self._retry_at = "started", "", None

    def verdict(self) -> tuple[bool, str] | None:
        """(False, reason) while start-up has not succeeded; None once it has (or untracked)."""
        with self._guard:
            if self._phase == "starting":
                return False, "starting: start-up not finished"
            if self._phase != "failing":
                return None
            if self._retry_at is None:
                return False, f"start-up failed: {self._error}; not retried"
            wait = max(0.0, self._retry_at - self._clock())
            return False, f"start-up failing: {self._error}, retrying in {wait:.0f} s"


def health_of(
    last_ticks: Callable[[], Mapping[str, tuple[float, float]]],
    now: Callable[[], float],
    startup: Callable[[], tuple[bool, str] | None] | None = None,
) -> Health:
    """A health check over the start-up (`Startup.verdict`, when given) and {service: (last tick
    time, interval)}."""

    def check() -> tuple[bool, str]:
        verdict = startup() if startup is not None else None
        if verdict is not None:
            return verdict[0], verdict[1] + "\n"
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
