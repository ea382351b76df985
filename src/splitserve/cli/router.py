"""`splitserve router serve`: the router process."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from pathlib import Path

import click
from pydantic import ValidationError

from splitserve.api.router import RouterConfig
from splitserve.cli import logs
from splitserve.cli.process import run_until_signalled
from splitserve.router.server import RouterServer


@click.group()
def router() -> None:
    """Run the router."""


@router.command("serve")
@click.option("--worker", "workers", multiple=True, help="Worker gRPC address (repeatable).")
@click.option("--model", default="splitserve-sim", show_default=True, help="Served model name.")
@click.option(
    "--tokenizer",
    type=click.Path(path_type=Path),
    default=None,
    help="Hugging Face tokenizer directory. Default: the local byte-level BPE.",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="HTTP and gRPC interface.")
@click.option("--port", type=int, default=8000, show_default=True, help="HTTP port (0: any).")
@click.option("--grpc-port", type=int, default=0, show_default=True, help="gRPC port (0: any).")
@click.option("--max-model-len", type=int, default=4096, show_default=True)
@click.option("--default-max-tokens", type=int, default=256, show_default=True)
@click.option("--min-prompt-tokens-for-pd", type=int, default=1, show_default=True)
@click.option("--ready-file", type=click.Path(path_type=Path), default=None)
@click.option("--log-level", default="INFO", show_default=True, envvar="SPLITSERVE_LOG_LEVEL")
def serve_cmd(
    workers: tuple[str, ...],
    model: str,
    tokenizer: Path | None,
    host: str,
    port: int,
    grpc_port: int,
    max_model_len: int,
    default_max_tokens: int,
    min_prompt_tokens_for_pd: int,
    ready_file: Path | None,
    log_level: str,
) -> None:
    """Serve the OpenAI HTTP API and the gRPC Router over the given workers."""
    logs.setup(log_level, "router")
    if tokenizer is None:
        from splitserve.cli.up import default_tokenizer_path

        tokenizer = default_tokenizer_path()
    try:
        config = RouterConfig(
            model_name=model,
            tokenizer_dir=str(tokenizer),
            worker_addresses=workers,
            http_host=host,
            http_port=port,
            grpc_host=host,
            grpc_port=grpc_port,
            max_model_len=max_model_len,
            default_max_tokens=default_max_tokens,
            placement={"min_prompt_tokens_for_pd": min_prompt_tokens_for_pd},
        )
    except ValidationError as err:
        raise click.BadParameter(str(err)) from err

    async def main(stop: asyncio.Event) -> None:
        server = RouterServer(config)
        await server.start()
        if ready_file is not None:
            info = {
                "host": host,
                "port": server.http_port,
                "grpc_port": server.grpc_port,
                "pid": os.getpid(),
            }
            tmp = ready_file.with_suffix(".tmp")
            tmp.write_text(json.dumps(info))
            tmp.replace(ready_file)
        try:
            done = asyncio.create_task(server.wait())
            stopped = asyncio.create_task(stop.wait())
            await asyncio.wait({done, stopped}, return_when=asyncio.FIRST_COMPLETED)
            for task in (done, stopped):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        finally:
            await server.stop()

    run_until_signalled(main)
