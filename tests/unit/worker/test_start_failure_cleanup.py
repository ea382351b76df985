"""A worker whose start-up fails part way stops what it had started.

Before the fix `worker serve --metrics-port <busy>` printed its one-line error and then a
traceback from the gRPC server's finalizer ("RuntimeError: Event loop is closed", "coroutine
'AioServer.shutdown' was never awaited"): the gRPC server, already listening, was never
stopped. Here: after the failed start the gRPC port is free again.
"""

from __future__ import annotations

import socket

import pytest

from splitserve.core.roles import Role
from splitserve.worker.runtime import WorkerConfig, serve


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_a_busy_metrics_port_leaves_no_grpc_server_listening() -> None:
    grpc_port = _free_port()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        cfg = WorkerConfig(
            role=Role.DECODE,
            port=grpc_port,
            metrics_port=int(busy.getsockname()[1]),
            link_port=None,
            sim_time_scale=0.0,
            sim_num_kv_blocks=16,
        )
        with pytest.raises(OSError, match="in use"):
            await serve(cfg)
    with socket.socket() as again:
        again.bind(("127.0.0.1", grpc_port))  # EADDRINUSE while the gRPC server still listens
