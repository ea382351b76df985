"""`splitserve worker serve`: one worker process."""

from __future__ import annotations

import json
from pathlib import Path

import click

from splitserve.cli import logs
from splitserve.cli.numbers import FiniteFloat
from splitserve.cli.process import bind_errors_named, ready_file_option, run_until_signalled
from splitserve.cli.tls_option import tls_option
from splitserve.cli.tokenizer_check import load_tokenizer
from splitserve.cli.up import answer_tokens_for, check_sim_options, tokenizer_vocab
from splitserve.core.errors import ConfigError
from splitserve.core.roles import Role, parse_role
from splitserve.policy.batching.builtin import BATCHING, checked_batching_policy
from splitserve.policy.batching.tokens import (
    DEFAULT_ANSWER_SIGMA,
    DEFAULT_ANSWER_TOKENS,
    DEFAULT_EOS_TOKEN_ID,
)
from splitserve.worker.runtime import WorkerConfig, serve, vllm_engine_kwargs


@click.group()
def worker() -> None:
    """Run a worker."""


_PORT = click.IntRange(0, 65535)
"""A port (0: any free); out-of-range values wrapped modulo 65536 before (70000 bound 4464)."""


@worker.command("serve", context_settings={"ignore_unknown_options": False})
@tls_option
@click.option("--role", default="mixed", show_default=True, help="prefill | decode | mixed")
@click.option("--engine", type=click.Choice(["sim", "vllm"]), default="sim", show_default=True)
@click.option(
    "--nixl-port",
    type=_PORT,
    default=None,
    help="vLLM: NIXL side-channel port (default vLLM's 5600; 0: any free port).",
)
@click.option(
    "--model",
    default="splitserve-sim",
    show_default=True,
    help="Model: a name (sim engine) or a model directory (vLLM).",
)
@click.option("--served-model-name", default="", help="Name reported to clients; default --model.")
@click.option(
    "--tokenizer",
    default="",
    help="Tokenizer directory or hub id. vLLM: if not the model's (loaded once to check it). "
    "Sim: the engine draws its tokens from this vocabulary (the ids between its special "
    "tokens that decode to printable text) and ends answers with its end-of-text token, "
    "in place of --vocab-size, --first-token-id, --token-ids-file and --eos-token-id.",
)
@click.option("--revision", default="", help="Model revision (vLLM).")
@click.option("--tensor-parallel-size", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to bind.")
@click.option(
    "--advertise-host",
    default="",
    envvar="SPLITSERVE_POD_IP",
    help="Address other workers reach this one at (default: --host; in a pod, the pod IP).",
)
@click.option(
    "--port", "--grpc-port", type=_PORT, default=0, show_default=True, help="gRPC port (0: any)."
)
@click.option("--metrics-port", type=_PORT, default=0, show_default=True, help="0: any free.")
@click.option(
    "--link-port",
    type=click.IntRange(min=-1, max=65535),
    default=0,
    show_default=True,
    help="Port of the stream link (Multiplex without gRPC, for routers with pool.link: "
    "stream; advertised in load reports): 0: any free; -1: none.",
)
@click.option(
    "--health-port",
    type=_PORT,
    default=None,
    help="Also serve grpc.health.v1 alone, in plaintext, on this port (0: any free): for "
    "kubelet's gRPC probes when the gRPC port requires mutual TLS. Default: none.",
)
@click.option("--worker-id", default="", envvar="SPLITSERVE_POD_NAME", help="Default: address.")
@ready_file_option()
@click.option("--sim-shape", default="llama-2-7b", show_default=True, help="Model shape to time.")
@click.option("--sim-hardware", default="a100-80g", show_default=True)
@click.option(
    "--sim-time-scale",
    type=FiniteFloat(min=0),
    default=1.0,
    show_default=True,
    help="Multiplies the sim engine's step times; 0: no delay (tokens as fast as the engine "
    "loop runs, to measure the router alone).",
)
@click.option(
    "--sim-latency-model",
    default="roofline",
    show_default=True,
    help="Step pricing: roofline, distserve-a100, distserve-vllm-a100, vidur-a100, vidur-h100, "
    "measured-h100, measured-h200.",
)
@click.option(
    "--sim-kv-blocks",
    type=click.IntRange(min=1),
    default=None,
    help="Default: from hardware memory.",
)
@click.option(
    "--sim-max-model-len",
    type=click.IntRange(min=1),
    default=None,
    help="Context limit of the simulated engine (prompt + new tokens). Default: none.",
)
@click.option("--vocab-size", type=click.IntRange(min=1), default=4096, show_default=True)
@click.option(
    "--first-token-id",
    type=click.IntRange(min=0),
    default=16,
    show_default=True,
    help="Sim engine: the lowest token id it emits (below --vocab-size).",
)
@click.option(
    "--token-ids-file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="JSON list of token ids simulated engines may emit (default: the id range).",
)
@click.option(
    "--eos-token-id",
    type=click.IntRange(min=-1),
    default=DEFAULT_EOS_TOKEN_ID,
    show_default=True,
    help="Sim engine: the end-of-text id it emits where an answer ends (the default tokenizer's "
    "<|end_of_text|>); -1: answers never end by themselves.",
)
@click.option(
    "--sim-answer-tokens",
    type=click.IntRange(min=0),
    default=DEFAULT_ANSWER_TOKENS,
    show_default=True,
    help="Sim engine: median answer length (lognormal per prompt; the answer then ends with "
    "--eos-token-id unless the request sets ignore_eos); 0: answers run to max_tokens.",
)
@click.option(
    "--sim-answer-sigma",
    type=FiniteFloat(min=0, max=4),
    default=DEFAULT_ANSWER_SIGMA,
    show_default=True,
    help="Sim engine: log-space spread of the answer length.",
)
@click.option("--batching", default="fcfs", show_default=True, help="Step policy name.")
@click.option("--batching-params", default="{}", help="JSON object of step-policy params.")
@logs.log_level_option()
@logs.log_format_option
@click.argument("engine_args", nargs=-1, type=click.UNPROCESSED)
def serve_cmd(
    role: str,
    engine: str,
    nixl_port: int | None,
    model: str,
    served_model_name: str,
    tokenizer: str,
    revision: str,
    tensor_parallel_size: int,
    host: str,
    advertise_host: str,
    port: int,
    metrics_port: int,
    link_port: int,
    health_port: int | None,
    worker_id: str,
    ready_file: Path | None,
    sim_shape: str,
    sim_hardware: str,
    sim_time_scale: float,
    sim_latency_model: str,
    sim_kv_blocks: int | None,
    sim_max_model_len: int | None,
    vocab_size: int,
    first_token_id: int,
    token_ids_file: Path | None,
    eos_token_id: int,
    sim_answer_tokens: int,
    sim_answer_sigma: float,
    batching: str,
    batching_params: str,
    log_level: str,
    log_format: str,
    engine_args: tuple[str, ...],
) -> None:
    """Serve the Worker gRPC API over one engine.

    Arguments after `--` go to the engine unchanged (vLLM engine arguments; refused with
    --engine sim).
    """
    logs.setup(log_level, "worker", log_format)
    _check_engine_flags(engine)
    if engine != "vllm" and engine_args:  # was a warning at start-up, the arguments ignored
        raise click.UsageError(
            f"engine arguments after `--` ({' '.join(engine_args)}) apply to --engine vllm "
            f"only; the {engine} engine takes none (its options are the --sim-* flags)"
        )
    try:
        parsed_role: Role = parse_role(role)
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--role") from err
    try:
        params = json.loads(batching_params)
    except json.JSONDecodeError as err:
        raise click.BadParameter(f"not JSON ({err})", param_hint="--batching-params") from err
    try:
        ids = json.loads(token_ids_file.read_text()) if token_ids_file else []
        token_ids = tuple(int(i) for i in ids)
    except (ValueError, TypeError) as err:  # JSONDecodeError is a ValueError
        raise click.BadParameter(str(err), param_hint="--token-ids-file") from err
    if engine == "sim" and tokenizer:
        vocab_size, first_token_id, token_ids, eos_token_id, sim_answer_tokens = _sim_vocabulary(
            tokenizer, sim_answer_tokens
        )
    if first_token_id >= vocab_size:  # these two were tracebacks at start-up
        raise click.BadParameter(
            f"{first_token_id} is not below --vocab-size {vocab_size}",
            param_hint="--first-token-id",
        )
    if any(not 0 <= i < vocab_size for i in token_ids):
        raise click.BadParameter(
            f"token ids must lie in [0, --vocab-size {vocab_size})", param_hint="--token-ids-file"
        )
    if sim_answer_tokens and eos_token_id < 0:
        raise click.BadParameter(
            "answers that end need an end-of-text id: give --eos-token-id, or "
            "--sim-answer-tokens 0",
            param_hint="--sim-answer-tokens",
        )
    _check_batching(batching, params, parsed_role)
    if engine == "vllm" and tokenizer:  # vLLM loads it at start-up: a traceback there
        load_tokenizer(tokenizer, "--tokenizer")
    if engine == "sim":  # the same refusals as `up`, naming the flag (they were tracebacks)
        opts = {"engine": engine, "sim_shape": sim_shape, "sim_hardware": sim_hardware}
        check_sim_options(opts | {"sim_latency_model": sim_latency_model}, lambda _name: False)
    cfg = WorkerConfig(
        role=parsed_role,
        engine=engine,
        model=model,
        served_model_name=served_model_name,
        tokenizer=tokenizer,
        revision=revision,
        tensor_parallel_size=tensor_parallel_size,
        engine_args=engine_args,
        host=host,
        advertise_host=advertise_host,
        port=port,
        metrics_port=metrics_port,
        link_port=None if link_port < 0 else link_port,
        health_port=health_port,
        worker_id=worker_id,
        ready_file=ready_file,
        sim_model_shape=sim_shape,
        sim_hardware=sim_hardware,
        sim_time_scale=sim_time_scale,
        sim_latency_model=sim_latency_model,
        sim_num_kv_blocks=sim_kv_blocks,
        sim_max_model_len=sim_max_model_len,
        vocab_size=vocab_size,
        first_token_id=first_token_id,
        token_ids=token_ids,
        eos_token_id=None if eos_token_id < 0 else eos_token_id,
        sim_answer_tokens=sim_answer_tokens,
        sim_answer_sigma=sim_answer_sigma,
        nixl_port=nixl_port,
        batching_policy=batching,
        batching_params=params,
    )
    if engine == "vllm":  # engine arguments that contradict a flag: refused before start-up
        try:
            vllm_engine_kwargs(cfg)
        except ConfigError as err:
            raise click.UsageError(str(err)) from None
    with bind_errors_named("--port / --metrics-port / --link-port / --health-port / --host"):
        run_until_signalled(lambda stop: serve(cfg, stop))


VLLM_ONLY: tuple[str, ...] = ("nixl_port", "revision")
"""`worker serve` options only the vLLM engine reads (the sim engine ignored them silently)."""
SIM_ONLY: tuple[str, ...] = (
    "sim_shape",
    "sim_hardware",
    "sim_time_scale",
    "sim_latency_model",
    "sim_kv_blocks",
    "sim_max_model_len",
    "vocab_size",
    "first_token_id",
    "token_ids_file",
    "eos_token_id",
    "sim_answer_tokens",
    "sim_answer_sigma",
)
"""`worker serve` options only the simulated engine reads (vLLM ignored them silently)."""


_FROM_TOKENIZER: tuple[str, ...] = (
    "vocab_size",
    "first_token_id",
    "token_ids_file",
    "eos_token_id",
)
"""Simulated-engine settings that `--tokenizer` sets."""


def _sim_vocabulary(
    tokenizer: str, answer_tokens: int
) -> tuple[int, int, tuple[int, ...], int, int]:
    """(vocab size, first id, allowed ids, end-of-text id (-1: none), answer median) for a
    simulated engine from its tokenizer, as `splitserve up` derives them (`answer_tokens_for`).
    Refused: one of `_FROM_TOKENIZER` given too."""
    ctx = click.get_current_context()
    explicit = click.core.ParameterSource.COMMANDLINE, click.core.ParameterSource.ENVIRONMENT
    given = [
        "--" + n.replace("_", "-")
        for n in _FROM_TOKENIZER
        if ctx.get_parameter_source(n) in explicit
    ]
    if given:
        raise click.UsageError(
            f"{', '.join(given)}: set by --tokenizer for the sim engine (its vocabulary and "
            "end-of-text token); give one or the other"
        )
    vocab, first, clean, eos = tokenizer_vocab(tokenizer, "--tokenizer")
    answers = answer_tokens_for(tokenizer, eos, answer_tokens)
    return vocab, first, tuple(clean), -1 if eos is None else eos, answers


def _check_engine_flags(engine: str) -> None:
    """Refuse a flag the chosen engine would ignore, naming it and the engine it needs."""
    ctx = click.get_current_context()
    other, needs = (VLLM_ONLY, "vllm") if engine == "sim" else (SIM_ONLY, "sim")
    named = [
        "--" + n.replace("_", "-")
        for n in other
        if ctx.get_parameter_source(n) not in (click.core.ParameterSource.DEFAULT, None)
    ]
    if named:
        raise click.UsageError(
            f"{', '.join(named)}: {'needs' if len(named) == 1 else 'need'} --engine {needs} "
            f"(the {engine} engine would ignore {'it' if len(named) == 1 else 'them'})"
        )


def _check_batching(name: str, params: object, role: Role) -> None:
    """Build the step policy once, so an unknown name or parameter is refused naming the flag
    before anything starts (it was a ConfigError / TypeError traceback from the engine); and
    refuse a policy this worker could not serve with: one that never runs the decode hand-offs
    a decode or mixed worker receives (a request then hung for ever), or a simulator-only mode
    (an oracle reading true output lengths a live worker does not have)."""
    if not isinstance(params, dict):
        raise click.BadParameter("want a JSON object", param_hint="--batching-params")
    try:
        BATCHING.get(name)
    except ConfigError as err:
        raise click.BadParameter(str(err), param_hint="--batching") from err
    try:
        policy = checked_batching_policy(name, params)
    except (ConfigError, TypeError, ValueError) as err:
        raise click.BadParameter(f"{name}: {err}", param_hint="--batching-params") from err
    if role is not Role.PREFILL and not getattr(policy, "runs_handoffs", True):
        raise click.BadParameter(
            f"{name} never runs a decode hand-off (remote KV), which a {role} worker receives "
            "behind prefill workers: its requests would never finish; run it with --role "
            "prefill, and a decode policy here (fcfs, tetriinfer-decode, ...)",
            param_hint="--batching",
        )
    if why := getattr(policy, "simulator_only", None):
        raise click.BadParameter(f"{name}: {why}", param_hint="--batching-params")
