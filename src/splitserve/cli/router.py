"""`splitserve router serve`: the router process.

Configured by flags, or by `--config FILE` (the `router.yaml` the operator renders into the
router's ConfigMap, which turns on Kubernetes worker discovery); flags given explicitly override
the file.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from pathlib import Path
from typing import Any, Final

import click
from pydantic import ValidationError

from splitserve.aio import stop_task
from splitserve.api import v1alpha1 as v1
from splitserve.api.auth import API_KEY, API_KEY_RULE, SECRET_KEYS, AuthSettings
from splitserve.api.backends import HttpBackend, parse_backend_flag
from splitserve.api.router import DispatchSettings, RouterConfig, RouterFile, port_clash
from splitserve.api.router_edge import EdgeSettings
from splitserve.api.validation import one_line, validation_lines
from splitserve.cli import logs
from splitserve.cli.numbers import FiniteFloat, NonBlank
from splitserve.cli.process import (
    API_KEY_ENV,
    bind_errors_named,
    ready_file_option,
    run_until_signalled,
    without_torch,
)
from splitserve.cli.slo_options import read_yaml, slo_options, slo_settings
from splitserve.cli.tls_option import tls_option
from splitserve.cli.tokenizer_check import load_tokenizer
from splitserve.router import gc_tuning
from splitserve.router.auth import key_sha256_hex, load_key_file, tenant_specs
from splitserve.router.server import RouterServer
from splitserve.router.tokenizer import TextTokenizer

_PORT: Final = click.IntRange(0, 65535)


@click.group()
def router() -> None:
    """Run the router."""


@router.command("serve")
@tls_option
@click.option(
    "--config",
    "config_file",
    type=click.Path(path_type=Path, exists=True, dir_okay=False),
    default=None,
    envvar="SPLITSERVE_ROUTER_CONFIG",
    help="router.yaml (the operator's ConfigMap): model, ports, Kubernetes discovery. "
    "Flags given explicitly override it.",
)
@click.option(
    "--worker",
    "workers",
    multiple=True,
    callback=lambda _ctx, _param, value: _worker_addresses(value),
    help="Worker gRPC address, HOST:PORT (repeatable).",
)
@click.option(
    "--backend",
    "backends",
    multiple=True,
    metavar="[ROLE=]URL",
    help="A stock `vllm serve` server as a worker (repeatable), e.g. --backend "
    "prefill=http://10.0.0.5:8000; ROLE: prefill, decode or mixed (default). P/D needs vLLM's "
    "NIXL --kv-transfer-config on both servers (docs/engines.md).",
)
@click.option(
    "--workers-file",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="A JSON file of worker endpoints, re-read at run time (what `splitserve up "
    "--autoscale` writes; docs/autoscaling.md).",
)
@click.option(
    "--model",
    type=NonBlank(),
    default="splitserve-sim",
    show_default=True,
    help="Served model name.",
)
@click.option(
    "--tokenizer",
    type=click.Path(path_type=Path),
    default=None,
    help="Hugging Face tokenizer directory. Default: the local byte-level BPE.",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="HTTP and gRPC interface.")
@click.option("--port", type=_PORT, default=8000, show_default=True, help="HTTP port (0: any).")
@click.option("--grpc-port", type=_PORT, default=0, show_default=True, help="gRPC port (0: any).")
@click.option("--max-model-len", type=click.IntRange(min=2), default=4096, show_default=True)
@click.option(
    "--default-max-tokens",
    type=click.IntRange(min=1),
    default=None,
    help="Cap for requests without max_tokens. Default: until end of text or max_model_len.",
)
@click.option(
    "--min-prompt-tokens-for-pd", type=click.IntRange(min=0), default=1, show_default=True
)
@click.option(
    "--token-stall-timeout-s",
    type=FiniteFloat(min=0, min_open=True),
    default=DispatchSettings().token_stall_timeout_s,
    show_default=True,
    help="A worker with no next token for this long is treated as dead (request moved).",
)
@click.option(
    "--cold-start-wait-s",
    type=FiniteFloat(min=0, max=86400),
    default=None,
    help="Hold a request that finds no decode-capable worker ready (none yet, all starting, "
    "fenced or draining, only prefill workers) up to this long for one to become ready, "
    'instead of a 503 at once (a pool scaled to zero; docs/operations.md "Scale to zero"). '
    "Default 0 (a 503 at once), or the config file's admission.coldStartWaitSeconds.",
)
@click.option(
    "--cold-start-max-held",
    type=click.IntRange(0, 1_000_000),
    default=None,
    help="Requests held for a cold start at most; beyond it a 503 at once naming the bound. "
    "Default 1024, or the config file's admission.coldStartMaxHeld.",
)
@click.option(
    "--early-decode",
    is_flag=True,
    default=False,
    help="P/D: send the Decode when the pair is placed, its first token and KV handle after the "
    "prefill (Multiplex links only; every decode worker must understand kv_follows). Off by "
    "default.",
)
@ready_file_option()
@click.option(
    "--processes",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Router processes sharing the HTTP and gRPC ports (SO_REUSEPORT; the kernel spreads "
    "connections). Each runs its own event loop on its own core; a supervisor restarts one "
    "that dies and drains them all on SIGTERM.",
)
@click.option(
    "--edge",
    "edge_values",
    multiple=True,
    metavar="KEY=VALUE",
    help="An edge limit (repeatable), e.g. --edge max_body_bytes=1048576 --edge "
    "header_timeout_s=5: any field of RouterConfig.edge (docs/reliability.md).",
)
@click.option("--reuse-port", is_flag=True, hidden=True, help="Bind with SO_REUSEPORT.")
@click.option(
    "--config-json",
    type=click.Path(path_type=Path, exists=True, dir_okay=False),
    default=None,
    hidden=True,
    help="A whole RouterConfig as JSON (what --processes hands its children).",
)
@click.option(
    "--api-key",
    "api_keys",
    multiple=True,
    envvar="SPLITSERVE_API_KEY",
    help="A client API key (repeatable; SPLITSERVE_API_KEY: space-separated). Clients then need "
    "`Authorization: Bearer KEY`. Kept only as its SHA-256 digest (docs/security.md).",
)
@click.option(
    "--api-key-file",
    type=click.Path(path_type=Path, exists=True, dir_okay=False),
    default=None,
    envvar="SPLITSERVE_API_KEY_FILE",
    help="Tenants and their keys (YAML; docs/security.md); re-read when it changes.",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    default=None,
    help="Serve /metrics on this port instead of the HTTP port (which then needs a key for "
    "it). With --processes N: process i on this port + i (each process's own metrics).",
)
@click.option(
    "--link",
    type=click.Choice(["grpc", "stream"]),
    default=None,
    help="pool.link: how Multiplex traffic reaches a worker: stream (default: the worker's "
    "stream link, where it advertises one; no grpc.aio per message), or grpc (the "
    "Worker.Multiplex gRPC stream). Overrides the config file's.",
)
@logs.log_level_option()
@logs.log_format_option
@slo_options
@click.pass_context
def serve_cmd(
    ctx: click.Context,
    config_file: Path | None,
    workers: tuple[str, ...],
    backends: tuple[str, ...],
    workers_file: Path | None,
    model: str,
    tokenizer: Path | None,
    host: str,
    port: int,
    grpc_port: int,
    max_model_len: int,
    default_max_tokens: int | None,
    min_prompt_tokens_for_pd: int,
    token_stall_timeout_s: float,
    cold_start_wait_s: float | None,
    cold_start_max_held: int | None,
    early_decode: bool,
    ready_file: Path | None,
    processes: int,
    edge_values: tuple[str, ...],
    reuse_port: bool,
    config_json: Path | None,
    api_keys: tuple[str, ...],
    api_key_file: Path | None,
    metrics_port: int | None,
    link: str | None,
    log_level: str,
    log_format: str,
    slo_classes: tuple[str, ...],
    default_slo_class: str | None,
    slo_config: Path | None,
    placement_profile: str | None,
    disaggregation: str | None,
) -> None:
    """Serve the OpenAI HTTP API and the gRPC Router over the given workers."""
    without_torch()
    logs.setup(log_level, "router", log_format)
    os.environ["SPLITSERVE_LOG_FORMAT"] = log_format  # --processes children log alike
    if config_json is not None:
        try:
            config = RouterConfig.model_validate_json(config_json.read_text())
        except ValidationError as err:  # was a traceback
            raise click.BadParameter(
                validation_lines(config_json, err, secret=SECRET_KEYS), param_hint="--config-json"
            ) from None
        _serve(config, ready_file, reuse_port, False, "--config-json (tokenizer_dir)")
        return
    given = ctx.get_parameter_source("api_keys") is click.core.ParameterSource.COMMANDLINE
    if given and set(os.environ.get(API_KEY_ENV, "").split()) - set(api_keys):
        raise click.BadParameter(  # the variable's keys were silently left out
            f"{API_KEY_ENV} is set too, to other keys: give the keys one way",
            param_hint="--api-key",
        )
    if tokenizer is not None:
        _check_tokenizer_dir(tokenizer)
        tokenizer_flag = "--tokenizer"
    elif config_file is not None:
        tokenizer_flag = f"--config {config_file} (model.tokenizer, else model.source)"
    else:
        tokenizer_flag = "--tokenizer (default: the local byte-level BPE)"
    flags: dict[str, Any] = {
        "edge": ("edge_values", edge_settings(edge_values)),
        "worker_addresses": ("workers", workers),
        "backends": ("backends", _backends(backends)),
        "workers_file": ("workers_file", None if workers_file is None else str(workers_file)),
        "model_name": ("model", model),
        "http_host": ("host", host),
        "grpc_host": ("host", host),
        "http_port": ("port", port),
        "grpc_port": ("grpc_port", grpc_port),
        "max_model_len": ("max_model_len", max_model_len),
        "default_max_tokens": ("default_max_tokens", default_max_tokens),
        "placement": (
            "min_prompt_tokens_for_pd",
            {"min_prompt_tokens_for_pd": min_prompt_tokens_for_pd},
        ),
        "dispatch": ("token_stall_timeout_s", {"token_stall_timeout_s": token_stall_timeout_s}),
    }
    try:
        if config_file is None:
            if tokenizer is None:
                from splitserve.cli.up import default_tokenizer_path

                tokenizer = default_tokenizer_path()
            values = {field: value for field, (_, value) in flags.items()}
            config = RouterConfig(tokenizer_dir=str(tokenizer), **values)
        else:
            explicit = {
                field: value
                for field, (param, value) in flags.items()
                if ctx.get_parameter_source(param)
                in (click.core.ParameterSource.COMMANDLINE, click.core.ParameterSource.ENVIRONMENT)
            }
            if tokenizer is not None:
                explicit["tokenizer_dir"] = str(tokenizer)
            config = config_from_file(config_file, explicit)
        slo, placement = slo_settings(
            slo_classes,
            default_slo_class,
            slo_config,
            placement_profile,
            disaggregation,
            config.placement,
            config.slo,
        )
        update: dict[str, Any] = {"placement": placement}
        auth = auth_settings(
            config.auth, api_keys, api_key_file, (slo or config.slo).class_names, config_file
        )
        if auth != config.auth:
            update["auth"] = auth
        if metrics_port is not None:
            update["metrics_port"] = metrics_port
        if slo is not None:
            update["slo"] = slo
        if link is not None:
            update["pool"] = config.pool.model_copy(update={"link": link})  # a Choice
        dispatch: dict[str, Any] = {"early_decode": True} if early_decode else {}
        if cold_start_wait_s is not None:
            dispatch["cold_start_wait_s"] = cold_start_wait_s
        if cold_start_max_held is not None:
            dispatch["cold_start_max_held"] = cold_start_max_held
        if dispatch:
            update["dispatch"] = config.dispatch.model_copy(update=dispatch)
        config = config.model_copy(update=update)
    except ValidationError as err:  # was pydantic's block, naming neither file nor key
        where = config_file if config_file is not None else Path("router serve")
        raise click.BadParameter(
            validation_lines(where, err, secret=SECRET_KEYS),
            param_hint="--config" if config_file is not None else None,
        ) from None
    if why := port_clash(config.http_port, config.grpc_port, config.metrics_port):
        raise click.UsageError(why)  # `model_copy` above does not validate
    _refuse_inert_flags(ctx, config, cold_start_max_held, early_decode)
    try:
        settle_gc = gc_tuning.enabled_from_env()
    except ValueError as err:
        raise click.UsageError(str(err)) from err
    if processes > 1:
        from splitserve.cli.router_processes import supervise

        _router_tokenizer(config, tokenizer_flag)  # refused here, not in each child's log
        supervise(config, processes, ready_file)
        return
    _serve(config, ready_file, reuse_port, settle_gc, tokenizer_flag)


def _worker_addresses(values: tuple[str, ...]) -> tuple[str, ...]:
    """`--worker` values as HOST:PORT, port 1-65535 (any other string was watched for ever as a
    worker that never answers, with nothing logged)."""
    for value in values:
        host, _, port = value.rpartition(":")
        if not host or not (port.isascii() and port.isdigit()) or not 1 <= int(port) <= 65535:
            raise click.BadParameter(
                f"{value!r}: expected HOST:PORT with a port from 1 to 65535", param_hint="--worker"
            )
    return values


def _check_tokenizer_dir(path: Path) -> None:
    """`--tokenizer` must be a directory (a missing one got transformers' traceback from deep
    inside the router's start-up). A path that does not exist but could be a Hugging Face hub
    id (`name` or `org/name`, relative) is left to the loader, as `router.yaml`'s may be one. The
    directory's files are the loader's to check (`_router_tokenizer`, which refuses in one line
    what it cannot load)."""
    text = str(path)
    hub_id = (
        not path.exists()
        and not path.is_absolute()
        and not text.startswith((".", "~"))
        and len(path.parts) <= 2
    )
    if path.is_dir() or hub_id:
        return
    what = "does not exist" if not path.exists() else "is not a directory"
    raise click.BadParameter(
        f"{text!r} {what}: expected a Hugging Face tokenizer directory", param_hint="--tokenizer"
    )


def _refuse_inert_flags(
    ctx: click.Context, config: RouterConfig, cold_start_max_held: int | None, early_decode: bool
) -> None:
    """Flags that could not act with the rest of the configuration: refused, named, instead of
    accepted without effect."""
    given = (click.core.ParameterSource.COMMANDLINE, click.core.ParameterSource.ENVIRONMENT)
    if (
        ctx.get_parameter_source("min_prompt_tokens_for_pd") in given
        and config.placement.disaggregation is v1.Disaggregation.NEVER
    ):
        raise click.UsageError(
            "--min-prompt-tokens-for-pd has no effect with disaggregation Never (no request is "
            "split); leave it out or choose Auto"
        )
    if cold_start_max_held is not None and not config.dispatch.cold_start_wait_s:
        raise click.UsageError(
            "--cold-start-max-held has no effect without a cold-start wait: give "
            "--cold-start-wait-s too (the wait is 0: no request is held)"
        )
    multiplexed = config.worker_addresses or config.workers_file or config.discovery
    if early_decode and config.backends and not multiplexed:
        raise click.UsageError(
            "--early-decode acts on Multiplex links to splitserve workers; with only --backend "
            "(stock vLLM servers) it has nothing to act on"
        )


def _backends(values: tuple[str, ...]) -> tuple[HttpBackend, ...]:
    out = []
    for value in values:
        try:
            out.append(parse_backend_flag(value))
        except ValidationError as err:  # one line (was pydantic's block, with its URL)
            raise click.BadParameter(
                f"{value!r}: {one_line(err)}", param_hint="--backend"
            ) from None
        except ValueError as err:
            raise click.BadParameter(str(err), param_hint="--backend") from err
    return tuple(out)


def _router_tokenizer(config: RouterConfig, flag: str) -> TextTokenizer:
    """The router's tokenizer, loaded before anything starts: a hub id it cannot load or a
    directory without tokenizer files is a usage error naming `flag` (it was transformers'
    traceback from inside the server's start-up)."""
    return TextTokenizer(load_tokenizer(config.tokenizer_dir, flag, config.tokenizer_revision))


def _serve(
    config: RouterConfig,
    ready_file: Path | None,
    reuse_port: bool,
    settle_gc: bool = False,
    tokenizer_flag: str = "--tokenizer",
) -> None:
    host = config.http_host
    _raise_fd_limit(config.edge.max_connections)
    tokenizer = _router_tokenizer(config, tokenizer_flag)

    async def main(stop: asyncio.Event) -> None:
        server = RouterServer(config, reuse_port=reuse_port, tokenizer=tokenizer)
        server.settle_gc = settle_gc  # read by `start()` (an attribute: test doubles ignore it)
        await server.start()
        if ready_file is not None:
            info = {
                "host": host,
                "port": server.http_port,
                "grpc_port": server.grpc_port,
                "metrics_port": server.metrics_port,
                "pid": os.getpid(),
            }
            tmp = ready_file.with_suffix(".tmp")
            tmp.write_text(json.dumps(info))
            tmp.replace(ready_file)
        try:
            done = asyncio.create_task(server.wait())
            stopped = asyncio.create_task(stop.wait())
            await asyncio.wait({done, stopped}, return_when=asyncio.FIRST_COMPLETED)
            await stop_task(done, stopped)
        finally:
            await server.stop()

    policy = asyncio.get_event_loop_policy()
    _use_uvloop()
    try:
        with bind_errors_named("--port / --grpc-port / --metrics-port / --host"):
            run_until_signalled(main)
    finally:
        asyncio.set_event_loop_policy(policy)  # this process's later loops are not ours


_FD_HEADROOM = 1024
"""File descriptors beyond the client connections: worker channels, tokenizer files, logs."""


def _raise_fd_limit(max_connections: int) -> None:
    """Raise the soft open-files limit so `max_connections` clients fit (the process would
    otherwise hit EMFILE first, and asyncio logs an accept error per attempt)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = max_connections + _FD_HEADROOM
    if soft >= want:
        return
    new = want if hard == resource.RLIM_INFINITY else min(want, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
    if new < want:
        logging.getLogger(__name__).warning(
            "open-files limit %d is below edge.max_connections %d + %d; lower max_connections "
            "or raise the hard limit",
            new,
            max_connections,
            _FD_HEADROOM,
        )


def _use_uvloop() -> None:
    """uvloop as the event loop when installed (a cheaper loop for the router's hot path)."""
    try:
        import uvloop
    except ImportError:
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def auth_settings(
    base: AuthSettings,
    api_keys: tuple[str, ...],
    api_key_file: Path | None,
    slo_classes: tuple[str, ...],
    config_file: Path | None = None,
) -> AuthSettings:
    """`base` (the config file's, `config_file`) plus `--api-key` (hashed here) and
    `--api-key-file`, whose tenants are checked as the router will (`slo_classes`: the
    service's)."""
    digests = [*base.key_sha256]
    for key in api_keys:
        if not API_KEY.fullmatch(key):
            raise click.BadParameter(API_KEY_RULE, param_hint="--api-key")
        digests.append(key_sha256_hex(key))
    key_file = str(api_key_file) if api_key_file is not None else base.key_file
    hint = (
        "--api-key-file" if api_key_file is not None else f"auth.keyFile of --config {config_file}"
    )
    settings = base.model_copy(update={"key_sha256": tuple(digests), "key_file": key_file})
    if key_file is not None:
        try:
            file = load_key_file(Path(key_file))
        except (OSError, ValueError) as err:
            raise click.BadParameter(str(err), param_hint=hint) from err
        try:
            tenant_specs(settings, file, slo_classes)  # as the router will (was a traceback)
        except ValueError as err:
            raise click.BadParameter(f"{key_file}: {err}", param_hint=hint) from None
    return settings


def edge_settings(values: tuple[str, ...]) -> EdgeSettings:
    """`EdgeSettings` from `KEY=VALUE` strings (values read as JSON where they parse).

    Raises:
        click.BadParameter: not KEY=VALUE, an unknown key, or a bad value (named).
    """
    fields: dict[str, Any] = {}
    for item in values:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{item!r}: expected KEY=VALUE", param_hint="--edge")
        if key not in EdgeSettings.model_fields:
            known = ", ".join(EdgeSettings.model_fields)
            raise click.BadParameter(f"unknown key {key!r}; known: {known}", param_hint="--edge")
        try:
            fields[key] = json.loads(raw)
        except json.JSONDecodeError:
            fields[key] = raw
    try:
        return EdgeSettings(**fields)
    except ValidationError as err:  # one line per bad key (was pydantic's block, with its URL)
        why = "; ".join(
            f"{'.'.join(map(str, e['loc']))}={e['input']!r}: {e['msg']}" for e in err.errors()
        )
        raise click.BadParameter(why, param_hint="--edge") from err


def config_from_file(path: Path, overrides: dict[str, Any]) -> RouterConfig:
    """`RouterConfig` from a `router.yaml` plus explicit flag values (`RouterConfig` fields).

    Keys the file has and this router does not know are logged and ignored.

    Raises:
        click.BadParameter: not UTF-8 text, not YAML, not a YAML mapping, or a bad value
            (one line per problem).
    """
    data = read_yaml(path, "--config")
    if not isinstance(data, dict):
        raise click.BadParameter(f"{path}: not a YAML mapping", param_hint="--config")
    try:
        parsed, ignored = RouterFile.from_configmap(data)
    except ValidationError as err:
        raise click.BadParameter(
            validation_lines(path, err, secret=SECRET_KEYS), param_hint="--config"
        ) from None
    if ignored:
        logging.getLogger(__name__).warning(
            "%s: ignoring keys this router does not know: %s", path, ", ".join(ignored)
        )
    if parsed.needs_default_tokenizer and "tokenizer_dir" not in overrides:
        from splitserve.cli.up import default_tokenizer_path

        overrides = {**overrides, "tokenizer_dir": str(default_tokenizer_path())}
    if "tokenizer_dir" in overrides:  # another tokenizer than the file's: not its revision
        overrides = {**overrides, "tokenizer_revision": None}
    return parsed.router_config(**overrides)
