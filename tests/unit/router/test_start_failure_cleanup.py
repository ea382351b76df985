"""A router whose start-up fails part way stops what it had started.

Before the fix `router serve --port <busy>` (or a busy `--metrics-port`) printed its one-line
error and then "Error in sys.excepthook: ... Original exception was:" at exit: the gRPC server,
already listening when the HTTP port failed to bind, was never stopped. Here: after the failed
start the gRPC port is free again.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from splitserve.api.router import RouterConfig
from splitserve.router.server import RouterServer
from splitserve.router.tokenizer import TextTokenizer
from tests.unit.router.conftest import FAST_POOL, MODEL


async def test_a_busy_http_port_leaves_no_grpc_server_listening(
    tokenizer: TextTokenizer, tokenizer_dir: Path
) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        config = RouterConfig(
            model_name=MODEL,
            tokenizer_dir=str(tokenizer_dir),
            worker_addresses=("127.0.0.1:1",),
            http_host="127.0.0.1",
            http_port=int(busy.getsockname()[1]),
            grpc_host="127.0.0.1",
            grpc_port=0,
            pool=FAST_POOL,
        )
        server = RouterServer(config, tokenizer=tokenizer)
        with pytest.raises(OSError, match="in use"):
            await server.start()
    assert server.grpc_port
    with socket.socket() as again:
        again.bind(("127.0.0.1", server.grpc_port))  # EADDRINUSE while gRPC still listens
