"""CPU cost of the system calls the router's HTTP side makes per streamed request.

One small loopback TCP write (an SSE event: ~150 bytes, `TCP_NODELAY`) that wakes a reader
blocked on the other core, as each event write wakes the client; and one `TCP_QUICKACK`
`setsockopt`. CPU of the writing thread (core 0), minus the same loop without the call; the
reader runs on core 1. Used with `syscalls.py` (calls per request) to price a change in counts.

    python -m tests.bench_router.syscost
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable

_QUICKACK = getattr(socket, "TCP_QUICKACK", 12)
EVENT = b"9a\r\ndata: " + b"x" * 140 + b"\n\n\r\n"


def _per_call_us(call: Callable[[], object], n: int) -> float:
    start = time.thread_time()
    for _ in range(n):
        call()
        time.sleep(0.0002)  # the reader goes back to sleep between writes
    return (time.thread_time() - start) / n * 1e6


def main(n: int = 3000) -> None:
    os.sched_setaffinity(0, {0})
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    client = socket.create_connection(listener.getsockname())
    server, _ = listener.accept()
    server.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def drain() -> None:
        os.sched_setaffinity(0, {1})
        while client.recv(1 << 20):
            pass

    threading.Thread(target=drain, daemon=True).start()
    for _ in range(2):
        base = _per_call_us(lambda: None, n)
        write = _per_call_us(lambda: server.send(EVENT), n) - base
        quickack = (
            _per_call_us(lambda: server.setsockopt(socket.IPPROTO_TCP, _QUICKACK, 1), n) - base
        )
        print(f"write {write:.1f} us, setsockopt(TCP_QUICKACK) {quickack:.1f} us", flush=True)
    server.close()
    client.close()
    listener.close()


if __name__ == "__main__":
    main()
