"""`splitserve sim`: run scenarios, reproduce paper headlines, benchmark the simulator.

Thin: parses options and calls `splitserve.sim.runner` / `splitserve.sim.bench`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import click

from splitserve.cli.numbers import FiniteFloat
from splitserve.cli.paths import OutDir
from splitserve.sim.reproductions import REPRODUCTIONS


@click.group()
def sim() -> None:
    """Discrete-event simulator running the live placement and step policies."""


@sim.command("run")
@click.argument("config", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--out",
    "out_dir",
    type=OutDir(),
    default=None,
    help="Write summary.md, requests.csv, config.yaml and plots here.",
)
def run_cmd(config: Path, out_dir: Path | None) -> None:
    """Simulate the scenario in CONFIG (YAML) and print its summary."""
    from splitserve.core.errors import ConfigError
    from splitserve.sim import runner

    try:
        cfg = runner.load_scenario(config)
        output = runner.run_scenario(cfg, out_dir, base_dir=config.parent)
    except ConfigError as err:  # the file's content: a usage error (was exit 1 / a traceback)
        raise click.BadParameter(str(err), param_hint="CONFIG") from err
    except ValueError as err:
        raise click.ClickException(str(err)) from err
    click.echo(output.markdown)
    for path in output.files:
        click.echo(f"wrote {path}")


@sim.command("reproduce")
@click.argument("paper", type=click.Choice(sorted(REPRODUCTIONS)))
@click.option("--quick", is_flag=True, help="Fewer requests and a coarser search (seconds).")
@click.option(
    "--out",
    "out_dir",
    type=OutDir(),
    default=None,
    help="Write the table and attainment plots here.",
)
@click.option(
    "--latency",
    type=click.Choice(["roofline", "gpu"]),
    default="roofline",
    show_default=True,
    help="Step pricing: the roofline, or the nearest model from published GPU measurements.",
)
@click.option(
    "--jobs",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Worker processes for the run's independent probes (distserve, bros, alise); the "
    "results are the same for every value.",
)
@click.option(
    "--cases",
    type=click.Choice(["default", "all"]),
    default="default",
    show_default=True,
    help="bros only: 'all' runs every model × rate case the paper's averaged figures are "
    "means over (OPT-13B, OPT-30B, Llama-3-70B at 3-15 req/s), 'default' OPT-13B only "
    "(quick: at 9 req/s).",
)
def reproduce_cmd(
    paper: str, quick: bool, out_dir: Path | None, latency: str, jobs: int, cases: str
) -> None:
    """Re-run PAPER's headline comparison and print paper vs ours."""
    from splitserve.sim import runner
    from splitserve.sim.reproductions import CASES, PARALLEL

    if jobs > 1 and paper not in PARALLEL:
        raise click.BadParameter(
            f"{jobs}: {paper}'s reproduction runs in one process; --jobs acts on "
            f"{', '.join(sorted(PARALLEL))}",
            param_hint="'--jobs'",
        )
    if cases != "default" and paper not in CASES:
        raise click.BadParameter(
            f"{cases}: {paper}'s reproduction has no cases mode; --cases acts on "
            f"{', '.join(sorted(CASES))}",
            param_hint="'--cases'",
        )
    try:
        repro = runner.run_reproduction(paper, quick, out_dir, latency, jobs, cases)
    except ValueError as err:
        raise click.ClickException(str(err)) from err
    click.echo(repro.markdown())


@sim.command("validate")
@click.argument("recording", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--cluster",
    "cluster_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    required=True,
    help="Cluster YAML: a scenario's model, hardware, latency_model / latency_profile, pools.",
)
@click.option(
    "--out",
    "out_dir",
    type=OutDir(),
    default=None,
    help="Write validation.md and requests.csv (measured vs simulated per request) here.",
)
@click.option(
    "--target",
    type=FiniteFloat(min=0, min_open=True),
    default=0.05,
    show_default=True,
    help="Error target (relative, > 0).",
)
@click.option(
    "--speed-trace",
    "speed_trace",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="The speed probe's log of the run (tools/record_run.py --speed-probe): each step is "
    "scaled by the machine's speed at that moment over its speed while the profile ran.",
)
@click.option(
    "--run-steps",
    "run_steps",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=None,
    help="The run's worker step logs (tools/record_run.py --steps-out: <worker>.steps.csv): "
    "each pool is priced by a model fitted to its workers' own steps during the run.",
)
@click.option(
    "--run-speed/--no-run-speed",
    default=True,
    show_default=True,
    help="With --run-steps: also scale each pool's steps by its workers' speed over the run.",
)
@click.option(
    "--run-gaps/--no-run-gaps",
    default=True,
    show_default=True,
    help="With --run-steps: a step lasts until the worker's next step when that one carries on "
    "its sequences (the engine's time between steps); off: engine.step() only.",
)
@click.option(
    "--run-overheads/--no-run-overheads",
    default=True,
    show_default=True,
    help="With --run-steps: add the per-request time outside the steps measured in the run "
    "(router arrival to the prompt's step on an idle worker, plus that step's end to the first "
    "token) to every simulated TTFT and latency, and the run's first request's cold dispatch "
    "(its dispatch over the median) to that request alone.",
)
@click.option(
    "--run-speed-steps",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="With --run-steps: a simulated step is scaled by the median speed of this many recorded "
    "steps nearest its start (1: the recorded step running then, so short stalls land where "
    "they happened).",
)
@click.option(
    "--run-handoff/--no-run-handoff",
    default=True,
    show_default=True,
    help="With --run-steps: price each P/D request's KV transfer as its hand-off measured in "
    "the run (kv_pulls.jsonl beside the steps: the router's first token to the Decode at the "
    "decode worker, plus the KV pull); off: the cluster's link.",
)
def validate_cmd(
    recording: Path,
    cluster_file: Path,
    out_dir: Path | None,
    target: float,
    speed_trace: Path | None,
    run_steps: Path | None,
    run_speed: bool,
    run_gaps: bool,
    run_overheads: bool,
    run_speed_steps: int,
    run_handoff: bool,
) -> None:
    """Replay RECORDING (the router's per-request log) in the simulator; print the errors."""
    from splitserve.core.errors import ConfigError
    from splitserve.sim import runner

    needing = [
        flag
        for flag, given in (
            ("--no-run-speed", not run_speed),
            ("--no-run-gaps", not run_gaps),
            ("--no-run-overheads", not run_overheads),
            ("--run-speed-steps", run_speed_steps != 1),
            ("--no-run-handoff", not run_handoff),
        )
        if given
    ]
    if needing and run_steps is None:  # named: the ones given (was all five, whichever)
        raise click.UsageError(
            f"{', '.join(needing)} {'needs' if len(needing) == 1 else 'need'} --run-steps"
        )
    if speed_trace is not None and run_steps is not None:  # was exit 1 after reading the files
        raise click.UsageError(
            "--speed-trace and --run-steps both scale the steps: give one, not both "
            "(--run-steps has each worker's speed over the run)"
        )
    try:  # the profile and pools too (a bad latency_profile was exit 1, after the checks)
        runner.cluster_of(runner.load_cluster(cluster_file), cluster_file.parent)
    except ConfigError as err:  # was pydantic's block, or a YAML parser traceback
        raise click.BadParameter(str(err), param_hint="--cluster") from err
    _check_recording(recording)
    try:
        _, text = runner.run_validation(
            recording,
            cluster_file,
            out_dir,
            target,
            speed_trace,
            run_steps,
            run_speed,
            run_gaps,
            run_overheads,
            run_speed_steps,
            run_handoff,
        )
    except runner.RunFileError as err:  # was exit 1 naming neither the option nor the file
        flag = {"speed_trace": "--speed-trace", "run_steps": "--run-steps"}[err.source]
        raise click.BadParameter(str(err), param_hint=flag) from None
    except (ConfigError, ValueError) as err:
        raise click.ClickException(str(err)) from err
    click.echo(text)


def _check_recording(recording: Path) -> None:
    """A usage error (exit 2) naming the file and its line for a recording that cannot be read
    (was exit 1 naming neither, or a traceback)."""
    from splitserve.sim.validate import parse_recording

    raw = recording.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw.count(b"\n", 0, err.start) + 1
        raise click.BadParameter(
            f"{recording}: recording line {line}: not UTF-8 text (byte {err.start})",
            param_hint="'RECORDING'",
        ) from None
    try:
        parse_recording(text.splitlines())
    except ValueError as err:
        raise click.BadParameter(f"{recording}: {err}", param_hint="'RECORDING'") from None


@sim.command("bench")
@click.option(
    "--trace",
    "trace_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="CSV with TIMESTAMP, ContextTokens, GeneratedTokens. Default: the bundled Azure 2023 "
    "conversation trace.",
)
@click.option(
    "--workers",
    type=click.IntRange(min=2, max=10_000),
    default=16,
    show_default=True,
    help="Workers (half prefill, half decode; 2 to 10000: the router looks at every worker "
    "for every request, 10000 take about a minute for 2000 requests).",
)
@click.option(
    "--max-requests",
    type=click.IntRange(min=1),
    default=None,
    help="Replay only the first N requests.",
)
@click.option(
    "--report-interval",
    "report_interval_s",
    type=FiniteFloat(min=0),
    default=0.0,
    show_default=True,
    help="Router load reports every this many seconds (0: exact worker state at every arrival).",
)
def bench_cmd(
    trace_path: Path | None, workers: int, max_requests: int | None, report_interval_s: float
) -> None:
    """Replay an Azure trace on a disaggregated cluster; print simulated requests per second."""
    from splitserve.sim import bench

    if trace_path is None:
        trace_path = bundled_trace("conv")
    try:
        items, parse_s = bench.load_trace(trace_path, max_requests)
    except (ValueError, UnicodeDecodeError) as err:  # was a traceback
        raise click.BadParameter(str(err), param_hint="--trace") from err
    if not items:  # printed a table of zeros
        raise click.BadParameter(
            "no requests in the trace (every row has a zero length)", param_hint="--trace"
        )
    report = replace(bench.run_items(items, workers, report_interval_s), parse_s=parse_s)
    click.echo(report.markdown())


def _ablation(
    names: Sequence[str],
    lines: Callable[[str], list[str]],
    quick: bool,
    variants: tuple[str, ...],
    out_dir: Path | None,
) -> None:
    """`sim autoscale --ablation`: one table per scenario, printed as each finishes."""
    from splitserve.sim import autoscale_ablation as ab
    from splitserve.sim import autoscale_eval
    from splitserve.sim.autoscale import Setup

    try:
        chosen = [ab.variant(v) for v in variants]
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--variant") from e
    runs = (
        [ab.variant("evaluated"), *(v for v in chosen if v.name != "evaluated")]
        if chosen
        else [*ab.VARIANTS, *ab.CANDIDATES]
    )
    tables = []
    for name in names:
        scenario = autoscale_eval.build_scenario(name, lines, quick)
        tables.append(ab.markdown([ab.ablate(scenario, Setup(), runs)]))
        click.echo(tables[-1])
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "ablation.md").write_text("\n".join(tables))
        click.echo(f"wrote {out_dir / 'ablation.md'}")


def bundled_trace(kind: str) -> Path:
    """The Azure LLM inference trace (2023) shipped with the package: "conv" or "code"."""
    from splitserve.sim.traces import bundled_trace as bundled

    return bundled(kind)


def _progress_to_stderr() -> Callable[[str], None]:
    """Each run's start on stderr with the seconds since the command began (the report itself
    goes to stdout only when every run is done, minutes later at full length)."""
    start = time.monotonic()

    def say(what: str) -> None:
        click.echo(f"[{time.monotonic() - start:6.0f} s] {what}", err=True)

    return say


@sim.command("autoscale")
@click.option(
    "--scenario",
    "scenarios",
    multiple=True,
    type=click.Choice(["azure-conv", "azure-code", "step-5x", "mix-shift", "step-5x-fleet"]),
    help="Scenario to run (repeatable). Default: the first four (step-5x-fleet, the step at "
    "10 req/s, runs only when named).",
)
@click.option(
    "--quick",
    is_flag=True,
    help="Shorter workloads: on a 2-core machine about 1.5 min for the four scenarios, seconds "
    "with --shortfall, over 5 min for step-5x-fleet (full length: many minutes).",
)
@click.option(
    "--no-search",
    is_flag=True,
    help="Skip the search for the smallest static split that meets the target (slow part).",
)
@click.option(
    "--out",
    "out_dir",
    type=OutDir(),
    default=None,
    help="Write summary.md and one PNG per scenario here.",
)
@click.option(
    "--shortfall",
    is_flag=True,
    help="Only print what a reactive loop can reach at all (share of requests arriving in "
    "surges faster than the reaction lag; no simulation; docs/benchmarks.md).",
)
@click.option(
    "--burst-weight",
    type=FiniteFloat(0.0, 1.0),
    default=None,
    help="The autoscaler's burst headroom: 0 sizes for the window's mean arrival rate, 1 for "
    "its busiest 10 s (default: the evaluation's, 1).",
)
@click.option(
    "--ablation",
    is_flag=True,
    help="Instead of the static comparison: run the loop with each safety margin removed or "
    "halved (and the reshaped margins), each against static-planned (docs/autoscaling.md).",
)
@click.option(
    "--variant",
    "variants",
    multiple=True,
    help="With --ablation: only these variants (repeatable; the evaluated policy always runs "
    "first). Names as in the table, e.g. 'no burst', 'noise band'.",
)
@click.option(
    "--cold-start",
    "cold_start_s",
    type=FiniteFloat(0.0, 3600.0),
    default=None,
    help="Diagnostic: the workers' cold start in seconds (default: the evaluation's, 20); "
    "loop, oracle and static runs all use it.",
)
@click.option(
    "--stabilization",
    "stabilization_s",
    type=FiniteFloat(0.0, 86400.0),
    default=None,
    help="Diagnostic: the loop's scale-down stabilization window in seconds (default: the "
    "evaluation's, 120).",
)
@click.option(
    "--admission/--no-admission",
    default=True,
    help="Place requests through the router's admission gate (default, as the live router: "
    "arrivals without room wait in its queue and are placed later) or every request at "
    "arrival (the simulator before the gate).",
)
@click.option(
    "--sheddable",
    is_flag=True,
    help="Make the SLO class sheddable: the router's gate sheds (429) requests predicted to "
    "miss their TTFT deadline; each counts as a miss (default: not sheddable, they wait).",
)
def autoscale_cmd(
    scenarios: tuple[str, ...],
    quick: bool,
    no_search: bool,
    out_dir: Path | None,
    shortfall: bool,
    burst_weight: float | None,
    ablation: bool,
    variants: tuple[str, ...],
    cold_start_s: float | None,
    stabilization_s: float | None,
    admission: bool,
    sheddable: bool,
) -> None:
    """Replay traces with the autoscaler and flipper in the loop vs static provisioning."""
    from splitserve.sim import autoscale_eval

    def lines(kind: str) -> list[str]:
        return bundled_trace(kind).read_text().splitlines()

    for flag, given in (("--scenario", scenarios), ("--variant", variants)):
        twice = sorted({g for g in given if given.count(g) > 1})
        if twice:  # was run (and printed) once per mention
            raise click.BadParameter(f"{', '.join(twice)} given twice", param_hint=flag)
    names = scenarios or autoscale_eval.SCENARIOS
    if variants and not ablation:
        raise click.UsageError("--variant needs --ablation")
    diagnostic = cold_start_s is not None or stabilization_s is not None
    if sheddable and not admission:
        raise click.UsageError("--sheddable acts through the admission gate: drop --no-admission")
    gate_flags = sheddable or not admission
    if gate_flags and (ablation or shortfall):
        raise click.UsageError(
            "--no-admission / --sheddable change the evaluation's runs: drop --ablation / "
            "--shortfall"
        )
    if ablation:
        if shortfall or no_search or burst_weight is not None or diagnostic:
            raise click.UsageError(
                "--ablation runs its own variants of the evaluated policy and no search: "
                "drop --shortfall / --no-search / --burst-weight / --cold-start / "
                "--stabilization"
            )
        _ablation(names, lines, quick, variants, out_dir)
        return
    if shortfall:
        if no_search or out_dir is not None or burst_weight is not None or diagnostic:
            raise click.UsageError(
                "--shortfall runs no simulation: drop --no-search / --out / --burst-weight / "
                "--cold-start / --stabilization"
            )
        click.echo(autoscale_eval.shortfall_markdown(names, lines, quick=quick))
        return
    setup = None
    if burst_weight is not None or diagnostic or gate_flags:
        from splitserve.sim.autoscale import Setup

        setup = Setup()
        if burst_weight is not None:
            setup = replace(setup, params=replace(setup.params, burst_weight=burst_weight))
        if cold_start_s is not None:
            setup = replace(setup, startup_s=cold_start_s)
        if stabilization_s is not None:
            params = replace(setup.params, scale_down_stabilization_s=stabilization_s)
            setup = replace(setup, params=params)
        if not admission:
            setup = replace(setup, admission=None)
        if sheddable:
            setup = replace(setup, classes=tuple(replace(c, sheddable=True) for c in setup.classes))
    report = autoscale_eval.run(
        names,
        lines,
        setup=setup,
        quick=quick,
        search=not no_search,
        plots=bool(out_dir),
        progress=_progress_to_stderr(),
    )
    click.echo(report.markdown)
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "summary.md").write_text(report.markdown)
        click.echo(f"wrote {out_dir / 'summary.md'}")
        for name, data in report.plots.items():
            (out_dir / name).write_bytes(data)
            click.echo(f"wrote {out_dir / name}")
