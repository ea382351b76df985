"""`splitserve profile`: measure a live worker's step times into a latency table (issue 4.2).

Thin: parses options, runs `splitserve.worker.profiler` against the worker, and writes what
`splitserve.core.perf.samples` makes of the samples: `samples.csv` (raw), `profile.csv` (a
`ProfiledModel` table for the scenario key `latency_profile:`) and `fit.json` (FittedModel
coefficients and held-out errors); with the worker's own step samples (`--method steps`, what
`auto` picks when the worker serves `WatchSteps`) also `steps.csv`, every step the worker ran,
and a fit on all of them in `fit.json`. `--from-samples` rebuilds `profile.csv` and `fit.json`
from a samples CSV.
"""

from __future__ import annotations

import asyncio
import json
import math
from datetime import UTC, datetime
from pathlib import Path

import click

from splitserve.cli import logs
from splitserve.cli.paths import OutDir
from splitserve.cli.tls_option import tls_option
from splitserve.core.perf.samples import (
    Measurement,
    ReportedStep,
    build_table,
    evaluate,
    fit_steps,
    parse_samples_csv,
    samples_csv,
    steps_csv,
    table_csv,
)
from splitserve.worker.profiler import (
    METHODS,
    Method,
    ProfileError,
    ProfileGrid,
    ProfileStats,
    profile_worker,
)


def _ints(text: str, flag: str) -> tuple[int, ...]:
    """`64,256` -> (64, 256); anything else is refused naming `flag` (it named no flag), an
    empty item too (`128,,512` was read as 128,512)."""
    items = text.split(",")
    if any(v.strip() for v in items) and not all(v.strip() for v in items):
        raise click.BadParameter(f"an empty item in {text!r}", param_hint=flag)
    try:
        values = tuple(int(v) for v in items if v.strip())
    except ValueError as err:
        raise click.BadParameter(
            f"want comma-separated integers, got {text!r}", param_hint=flag
        ) from err
    if not values or min(values) < 1:
        raise click.BadParameter(f"want positive integers, got {text!r}", param_hint=flag)
    return values


def _token_range(text: str) -> tuple[int, int]:
    lo, sep, hi = text.partition(":")
    try:
        out = (int(lo), int(hi))
    except ValueError:
        out = (0, 0)
    if not sep or not 0 <= out[0] < out[1]:
        raise click.BadParameter(
            f"want LOW:HIGH token ids, got {text!r}", param_hint="--token-range"
        )
    return out


@click.command()
@tls_option
@click.option("--worker", "address", default=None, help="The worker's gRPC address, host:port.")
@click.option(
    "--out",
    "out_dir",
    type=OutDir(),
    required=True,
    help="Writes samples.csv, profile.csv and fit.json here.",
)
@click.option(
    "--from-samples",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Rebuild profile.csv and fit.json from a samples.csv instead of measuring.",
)
@click.option(
    "--prefill-tokens",
    default="128,512,2048",
    show_default=True,
    help="Total new tokens per prefill step.",
)
@click.option(
    "--prefill-batch", default="1,4,16", show_default=True, help="Requests sharing those tokens."
)
@click.option(
    "--decode-batch", default="1,4,16,64", show_default=True, help="Requests decoding together."
)
@click.option(
    "--decode-context",
    default="128,1024",
    show_default=True,
    help="Prompt tokens per decoding request.",
)
@click.option(
    "--decode-tokens",
    type=click.IntRange(min=3),
    default=32,
    show_default=True,
    help="Decode steps measured per probe.",
)
@click.option("--repeats", type=click.IntRange(min=1), default=3, show_default=True)
@click.option(
    "--extra-repeats",
    type=click.IntRange(min=0),
    default=3,
    show_default=True,
    help="Further repetitions of cells whose repetitions disagree by > 10%.",
)
@click.option("--warmup", type=click.IntRange(min=0), default=1, show_default=True)
@click.option(
    "--max-batch-tokens",
    type=click.IntRange(min=1),
    default=2048,
    show_default=True,
    help="The engine's token budget per step (vLLM max_num_batched_tokens).",
)
@click.option("--max-model-len", type=click.IntRange(min=2), default=2048, show_default=True)
@click.option("--max-num-seqs", type=click.IntRange(min=1), default=64, show_default=True)
@click.option(
    "--token-range",
    default="16:1000",
    show_default=True,
    help="Prompt token ids are drawn from [LOW, HIGH): within the model's vocabulary.",
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--set-mixed",
    is_flag=True,
    help="Switch a prefill worker to mixed for the run (restored after).",
)
@click.option(
    "--holdout-every",
    type=click.IntRange(min=0),
    default=4,
    show_default=True,
    help="Hold out every Nth interior cell to score the table and fit (0: none).",
)
@click.option(
    "--method",
    type=click.Choice(METHODS),
    default="auto",
    show_default=True,
    help="steps: the worker's own step samples (WatchSteps); outside: client-side timing; "
    "auto: steps when the worker serves WatchSteps, else outside.",
)
@logs.log_level_option("WARNING")
def profile(
    address: str | None,
    out_dir: Path,
    from_samples: Path | None,
    prefill_tokens: str,
    prefill_batch: str,
    decode_batch: str,
    decode_context: str,
    decode_tokens: int,
    repeats: int,
    extra_repeats: int,
    warmup: int,
    max_batch_tokens: int,
    max_model_len: int,
    max_num_seqs: int,
    token_range: str,
    seed: int,
    set_mixed: bool,
    holdout_every: int,
    method: Method,
    log_level: str,
) -> None:
    """Measure a live worker's step times into a latency table.

    Drives the worker (sim or vLLM engine, mixed or decode role, idle) through its own gRPC API
    with controlled prefill and decode batches, and writes the raw samples, a profile table for
    the simulator (`latency_profile: OUT/profile.csv`) and a fit summary. See docs/profiling.md.
    """
    logs.setup(log_level, "profile")
    stats: ProfileStats | None = None
    steps: list[ReportedStep] = []
    if from_samples is not None:
        ctx = click.get_current_context()
        given = click.core.ParameterSource.COMMANDLINE
        measuring = [  # nothing is measured: these were ignored without a word
            p.opts[0]
            for p in ctx.command.params
            if (
                p.name in _MEASURING
                and ctx.get_parameter_source(p.name) is not click.core.ParameterSource.DEFAULT
            )
            # --tls-dir: also set by SPLITSERVE_TLS_DIR for every command; refused when given
            or (p.name == "tls_dir" and ctx.get_parameter_source(p.name) is given)
        ]
        if measuring:
            raise click.UsageError(
                f"{', '.join(measuring)}: measuring a worker; --from-samples measures nothing "
                "(it rebuilds the table and fit from the samples)"
            )
        _make_out(out_dir)
        try:
            samples = parse_samples_csv(from_samples.read_text().splitlines())
        except ValueError as err:  # a ValueError / UnicodeDecodeError traceback
            raise click.BadParameter(f"{from_samples}: {err}", param_hint="--from-samples") from err
        if not samples:  # was exit 1, "cannot build a table: no usable samples", no file named
            raise click.BadParameter(
                f"{from_samples}: holds no samples", param_hint="--from-samples"
            )
        source = f"samples from {from_samples}"
    else:
        if not address:
            raise click.UsageError("give --worker HOST:PORT (or --from-samples FILE)")
        host, _, port = address.rpartition(":")
        if not host or not (port.isascii() and port.isdigit()) or not 1 <= int(port) <= 65535:
            raise click.BadParameter(  # was 'no worker answers at ...' after a connect timeout
                f"{address!r}: expected HOST:PORT with a port from 1 to 65535",
                param_hint="--worker",
            )
        grid = ProfileGrid(
            prefill_tokens=_ints(prefill_tokens, "--prefill-tokens"),
            prefill_batch_sizes=_ints(prefill_batch, "--prefill-batch"),
            decode_batch_sizes=_ints(decode_batch, "--decode-batch"),
            decode_contexts=_ints(decode_context, "--decode-context"),
            decode_tokens=decode_tokens,
            repeats=repeats,
            extra_repeats=extra_repeats,
            warmup=warmup,
            max_batch_tokens=max_batch_tokens,
            max_model_len=max_model_len,
            max_num_seqs=max_num_seqs,
        )
        _check_fits(grid)
        _make_out(out_dir)
        try:
            samples, stats, reported = asyncio.run(
                profile_worker(
                    address,
                    grid,
                    token_range=_token_range(token_range),
                    seed=seed,
                    set_mixed=set_mixed,
                    progress=lambda msg: click.echo(msg, err=True),
                    method=method,
                )
            )
        except ProfileError as err:
            raise click.ClickException(str(err)) from err
        source = f"worker {address}"
        steps = [(s.index, s.start_s, s.duration_s, s.batch) for s in reported]
    files = _write(
        out_dir, samples, source, stats, holdout_every, from_samples, steps, _earlier(from_samples)
    )
    for path in files:
        click.echo(f"wrote {path}")


def _make_out(out_dir: Path) -> None:
    """`--out`, made before anything is measured (a directory it could not make was a
    traceback after the whole measurement, which was lost)."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise click.BadParameter(str(err), param_hint="--out") from err


def _check_fits(grid: ProfileGrid) -> None:
    """A usage error naming the flags when no prefill or no decode probe fits the limits (was
    exit 1 after connecting, naming only --max-batch-tokens / --max-model-len)."""
    problems = []
    if not grid.prefill_cells():
        problems.append(
            "no prefill probe fits: each needs --prefill-tokens <= --max-batch-tokens "
            f"({grid.max_batch_tokens}), --prefill-batch <= --max-num-seqs "
            f"({grid.max_num_seqs}), and --prefill-tokens / --prefill-batch tokens per request "
            f"from {grid.min_prompt_tokens} to below --max-model-len ({grid.max_model_len})"
        )
    if not grid.decode_cells():
        problems.append(
            "no decode probe fits: each needs --decode-batch <= --max-num-seqs "
            f"({grid.max_num_seqs}) and --decode-context + --decode-tokens "
            f"({grid.decode_tokens}) + its prefill steps + 3 <= --max-model-len "
            f"({grid.max_model_len})"
        )
    if problems:
        raise click.UsageError("; ".join(problems))


_MEASURING = frozenset(
    {
        "address",
        "prefill_tokens",
        "prefill_batch",
        "decode_batch",
        "decode_context",
        "decode_tokens",
        "repeats",
        "extra_repeats",
        "warmup",
        "max_batch_tokens",
        "max_model_len",
        "max_num_seqs",
        "token_range",
        "seed",
        "set_mixed",
        "method",
    }
)
"""Parameters that only shape a measurement (refused beside --from-samples)."""


def _write(
    out_dir: Path,
    samples: list[Measurement],
    source: str,
    stats: ProfileStats | None,
    holdout_every: int,
    from_samples: Path | None = None,
    steps: list[ReportedStep] | None = None,
    earlier: dict[str, object] | None = None,
) -> list[Path]:
    files = [out_dir / "samples.csv", out_dir / "profile.csv", out_dir / "fit.json"]
    if from_samples is None or from_samples.resolve() != files[0].resolve():
        # First: a measurement the table cannot be built from is kept (it was lost)
        files[0].write_text("\n".join(samples_csv(samples)) + "\n")
    if steps:
        files.append(out_dir / "steps.csv")
        files[-1].write_text("\n".join(steps_csv(steps)) + "\n")
    try:
        table = build_table(samples)
        ev = evaluate(samples, holdout_every)
    except ValueError as err:
        why = str(err)
        if samples and all(m.seconds == 0 for m in samples):
            why = (
                f"every one of the {len(samples)} samples took 0 s (a sim worker started with "
                "--sim-time-scale 0 prices every step 0 s: profile one with a time scale > 0)"
            )
        kept = ", ".join(str(f) for f in (files[0], *files[3:]))
        raise click.ClickException(
            f"cannot build a table: {why}; the samples are in {kept}"
        ) from err
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    earlier = earlier or {}
    method = stats.method if stats is not None else str(earlier.get("method") or "")
    notes = [
        f"splitserve profile of {source}, {stamp}" + (f" (method {method})" if method else ""),
        _SECONDS.get(method, _SECONDS[""]),
    ]
    files[1].write_text("\n".join(table_csv(table, notes)) + "\n")
    summary = ev.summary()
    if stats is not None:
        summary["probes"] = {
            "round_trip_s": stats.rtt_s,
            "gate_tokens": stats.gate_tokens,
            "gate_step_s": stats.gate_step_s,
            "run": stats.probes,
            "rejected": stats.rejected,
            "notes": stats.notes,
        }
        summary["method"] = stats.method
    else:  # rebuilt from samples: what only the live run knew stays as it said
        summary |= {k: earlier[k] for k in _CARRIED if k in earlier}
    if steps:
        summary["steps"] = fit_steps(steps, table.model) | {"dropped": _dropped(stats)}
    summary["source"] = source
    summary["samples"] = len(samples)
    files[2].write_text(json.dumps(_finite(summary), indent=2) + "\n")
    click.echo(
        f"{len(samples)} samples in {ev.train_cells + ev.heldout_cells} cells; table MAPE "
        f"{_pct(ev.table_mape_in_sample)} in sample, {_pct(ev.table_mape_heldout)} held out; "
        f"fit MAPE {_pct(ev.fit_mape_heldout)} held out"
        + ("" if ev.fit.ready else f" (fit not ready: {ev.fit.reason})")
    )
    for note in stats.notes if stats is not None else ():  # were in fit.json alone
        click.echo(f"note: {note}")
    if steps:
        st = summary["steps"]
        assert isinstance(st, dict)
        click.echo(
            f"{st['steps']} worker-reported steps ({st['mixed']} mixed prefill+decode); "
            f"fit on every step MAPE {_pct(float(st['mape']))}"
        )
    return files


_SECONDS = {
    "steps": "seconds are the worker's own step times (engine.step(); sim: the latency model)",
    "outside": "seconds are whole step periods: forward pass + scheduling + sampling + output "
    "hand-off",
    "": "seconds as the run that wrote the samples measured them (its method is not known: no "
    "fit.json beside the samples)",
}
"""profile.csv's note on what its seconds are, by method."""

_CARRIED = ("probes", "method", "steps")
"""fit.json keys a rebuild from samples cannot recompute (the probes, the method, the fit on
every reported step): kept from the fit.json beside the samples."""


def _earlier(from_samples: Path | None) -> dict[str, object]:
    """The fit.json written with `from_samples` (same folder), or {} when there is none."""
    if from_samples is None:
        return {}
    try:
        data = json.loads((from_samples.parent / "fit.json").read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _dropped(stats: ProfileStats | None) -> int:
    return stats.steps_dropped if stats is not None else 0


def _pct(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{x:.1%}"


def _finite(value: object) -> object:
    """JSON has no NaN: write null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value
