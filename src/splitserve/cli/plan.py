"""`splitserve plan`: an `LLMService` for a model, hardware, SLO and workload, by simulation.

Thin: builds the workload and calls `splitserve.sim.plan`.
"""

from __future__ import annotations

import re
from pathlib import Path

import click

from splitserve.cli.numbers import FiniteFloat

_POSITIVE = FiniteFloat(min=0, min_open=True)

MAX_WORKERS = 10_000
"""`--max-workers` at most: a scenario pool's replicas bound (`sim.config.MAX_REPLICAS`)."""

MAX_REQUESTS = 20_000
"""`--requests` at most: the bundled Azure conversation trace (19,365 rows) fits. The search
simulates the workload once per candidate pool size for every TP degree (about a minute per
10,000 requests per degree on a 2-core machine); a count with no bound ran for ever."""


@click.command()
@click.option("--model", default="llama-2-13b", show_default=True, help="Model preset.")
@click.option("--hardware", default="a100-80g", show_default=True, help="Hardware preset.")
@click.option(
    "--source",
    default=None,
    help="Weights for the printed service, as LLMService model.source takes them: a Hugging "
    "Face id (org/name[@revision]), an absolute path, or hf://, pvc://, oci://, file://.",
)
@click.option("--name", default="planned", show_default=True, help="LLMService name.")
@click.option(
    "--rate", type=_POSITIVE, default=None, help="Arrival rate (req/s); rescales a trace."
)
@click.option("--prompt-median", type=_POSITIVE, default=1000.0, show_default=True)
@click.option("--output-median", type=_POSITIVE, default=200.0, show_default=True)
@click.option(
    "--sigma",
    type=FiniteFloat(min=0),
    default=0.6,
    show_default=True,
    help="Lognormal spread.",
)
@click.option(
    "--trace",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Azure-format CSV (TIMESTAMP, ContextTokens, GeneratedTokens) instead of --*-median.",
)
@click.option(
    "--requests",
    "num_requests",
    type=click.IntRange(min=2, max=MAX_REQUESTS),
    default=1000,
    show_default=True,
    help="Requests to simulate (the first N of a trace); at least 2, one arrival has no rate; "
    f"at most {MAX_REQUESTS} (the search simulates them many times).",
)
@click.option("--ttft-ms", type=_POSITIVE, default=2000.0, show_default=True)
@click.option("--tpot-ms", type=_POSITIVE, default=100.0, show_default=True)
@click.option("--percentile", type=FiniteFloat(0, 1, min_open=True), default=0.9, show_default=True)
@click.option(
    "--attainment", type=FiniteFloat(0, 1, min_open=True), default=0.99, show_default=True
)
@click.option("--tp", "tps", default="1,2,4,8", show_default=True, help="TP degrees to try.")
@click.option(
    "--per-pool-tp",
    is_flag=True,
    help="Search the prefill and the decode pool's TP separately (every pair of --tp degrees; "
    "DistServe Alg. 1). A plan with two TPs has one worker group per role (no flips).",
)
@click.option(
    "--seed", type=click.IntRange(min=0), default=0, show_default=True, help="Lengths' seed."
)
@click.option(
    "--max-workers",
    type=click.IntRange(min=2, max=MAX_WORKERS),
    default=64,
    show_default=True,
    help="The most workers (prefill and decode together) a plan may have; a TP that needs more "
    f"is listed as not met (at most {MAX_WORKERS}: every worker is simulated).",
)
def plan(
    model: str,
    hardware: str,
    source: str | None,
    name: str,
    rate: float | None,
    prompt_median: float,
    output_median: float,
    sigma: float,
    trace: Path | None,
    num_requests: int,
    ttft_ms: float,
    tpot_ms: float,
    percentile: float,
    attainment: float,
    tps: str,
    per_pool_tp: bool,
    seed: int,
    max_workers: int,
) -> None:
    """Search pool sizes and TP with the simulator; print the candidates and an LLMService."""
    import numpy as np

    from splitserve.api.v1alpha1 import DNS_LABEL, parse_model_source
    from splitserve.core.perf import HARDWARE, MODELS
    from splitserve.core.roles import Role
    from splitserve.policy.planner.tp import split_tps
    from splitserve.sim import plan as planner
    from splitserve.sim.autoscale import SloTarget, with_class
    from splitserve.sim.workload import LogNormal, Poisson, parse_azure_trace, scale_to_rate
    from splitserve.sim.workload import synthetic as make_synthetic

    if model not in MODELS:
        raise click.BadParameter(
            f"unknown model; valid: {', '.join(sorted(MODELS))}", param_hint="--model"
        )
    if hardware not in HARDWARE:
        raise click.BadParameter(
            f"unknown hardware; valid: {', '.join(sorted(HARDWARE))}", param_hint="--hardware"
        )
    entries = [x.strip() for x in tps.split(",")]
    if any(entries) and not all(entries):  # `1,,4` was planned as 1,4
        raise click.BadParameter(f"an empty degree in {tps!r} (e.g. 1,2,4,8)", param_hint="--tp")
    entries = [x for x in entries if x]
    if not entries:
        raise click.BadParameter(f"no TP degree in {tps!r} (e.g. 1,2,4,8)", param_hint="--tp")
    for entry in entries:  # name the bad entry: "1,0" is not "no degree >= 1"
        if not re.fullmatch(r"[0-9]+", entry) or int(entry) < 1:
            raise click.BadParameter(
                f"{entry!r} in {tps!r}: every degree must be an integer >= 1", param_hint="--tp"
            )
    degrees = tuple(int(x) for x in entries)
    shape = MODELS[model]
    degrees_ok, refused = split_tps(shape.num_heads, shape.num_kv_heads, degrees)
    explicit = click.get_current_context().get_parameter_source("tps") not in (
        click.core.ParameterSource.DEFAULT,
        None,
    )
    if refused and (explicit or not degrees_ok):
        # vLLM refuses such a worker at start-up; a default degree is skipped (said below)
        raise click.BadParameter(
            f"{model} ({shape.num_heads} attention heads, {shape.num_kv_heads} KV heads): "
            + "; ".join(refused.values())
            + " (vLLM needs heads % TP == 0, and KV heads % TP == 0 or TP % KV heads == 0)",
            param_hint="--tp",
        )
    if refused:
        click.echo(
            f"# skipped default TP {', '.join(str(t) for t in refused)}: "
            + "; ".join(refused.values())
            + f" of {model} (vLLM would refuse it)"
        )
    degrees = tuple(degrees_ok)
    for degree in degrees:  # the search skips them (`fits`); an asked-for one vanished unsaid
        why = planner.memory_misfit(model, hardware, degree)
        if why is not None:
            click.echo(f"# skipped {why}")
    if len(name) > 63 or not re.fullmatch(DNS_LABEL, name):  # printed a service kubectl refuses
        raise click.BadParameter(
            f"{name!r} is not a Kubernetes name (lower-case letters, digits and '-', starting "
            "with a letter, at most 63)",
            param_hint="--name",
        )
    if source is not None:  # printed a service `operator render` refuses ('' became the preset)
        try:
            if not source.strip():
                raise ValueError(f"{source!r} is empty")
            if len(source) > 1024:
                raise ValueError(f"{len(source)} characters, LLMService takes at most 1024")
            parse_model_source(source)
        except ValueError as err:
            raise click.BadParameter(
                str(err).removeprefix("model.source: ")
                + " (a Hugging Face id org/name[@revision], an absolute path, or hf://, "
                "pvc://, oci://, file://)",
                param_hint="--source",
            ) from err
    if trace is not None:
        ctx = click.get_current_context()
        synthetic_only = [  # the trace's lengths and arrivals are used; these were ignored
            f"--{p.replace('_', '-')}"
            for p in ("prompt_median", "output_median", "sigma", "seed")
            if ctx.get_parameter_source(p) is not click.core.ParameterSource.DEFAULT
        ]
        if synthetic_only:
            raise click.UsageError(
                f"{', '.join(synthetic_only)}: lognormal lengths for --rate alone; "
                "--trace replays the trace's own lengths and arrivals"
            )
        try:
            items = parse_azure_trace(trace.read_text().splitlines(), max_requests=num_requests)
        except ValueError as err:  # was a traceback
            raise click.BadParameter(str(err), param_hint="--trace") from err
        if not items:  # was a traceback from the search
            raise click.BadParameter(
                "no requests in the trace (every row has a zero length)", param_hint="--trace"
            )
        if not items[-1].arrival_s > items[0].arrival_s:  # no rate, and --rate cannot rescale
            raise click.BadParameter(
                f"its {len(items)} request(s) arrive at once: no arrival rate to plan for",
                param_hint="--trace",
            )
        if rate is not None:
            items = scale_to_rate(items, rate)
    else:
        if rate is None:
            raise click.UsageError("give --rate (or --trace)")
        items = make_synthetic(
            Poisson(rate),
            LogNormal(prompt_median, sigma),
            LogNormal(output_median, sigma),
            num_requests,
            np.random.default_rng(seed),
        )
    items = with_class(items, "default")
    slo = SloTarget("default", ttft_ms / 1000, tpot_ms / 1000, percentile, attainment)
    candidates = planner.plan(
        items, model, hardware, slo, degrees, limit=max_workers, per_pool=per_pool_tp
    )
    if not candidates:
        raise click.ClickException(f"{model} fits on none of TP {tps} of {hardware}")
    click.echo("| TP (P / D) | prefill | decode | GPUs | attainment | TTFT p | TPOT p |")
    click.echo("|---|---|---|---|---|---|---|")
    for c in candidates:
        tp = f"{c.tps[Role.PREFILL]} / {c.tps[Role.DECODE]}"
        if c.result is None:
            click.echo(
                f"| {tp} | - | - | - | not met by {max_workers} workers (--max-workers) | | |"
            )
            continue
        cls = c.result.classes[0]
        click.echo(
            f"| {tp} | {c.pools[Role.PREFILL]} | {c.pools[Role.DECODE]} "
            f"| {c.gpus} | {c.result.attainment:.2%} | {cls.ttft_p or 0:.3f} s "
            f"| {(cls.tpot_p or 0) * 1000:.1f} ms |"
        )
    best = candidates[0]
    if best.result is None:
        need = max(w.num_prompt_tokens + w.num_output_tokens for w in items)
        room, top_tp = max(
            (planner.kv_room_tokens(model, hardware, t), t)
            for c in candidates
            for t in c.tps.values()
        )
        if need > room:  # was the bare sentence below: the search could not tell why
            raise click.ClickException(
                f"no candidate met the attainment target: the longest request needs KV for "
                f"{need:,} tokens (prompt and output), and one {model} worker at the largest "
                f"TP searched ({top_tp} on {hardware}) holds {room:,}: no pool size can serve it"
            )
        missed = "; ".join(  # was the bare "no candidate met the attainment target"
            f"TP {c.tps[Role.PREFILL]}"
            + ("" if c.uniform else f" / {c.tps[Role.DECODE]}")
            + (
                f" missed it at P{c.pools[Role.PREFILL]}:D{c.pools[Role.DECODE]}"
                if sum(c.pools.values()) <= max_workers
                else ": its load is too large to size"
            )
            for c in candidates
        )
        raise click.ClickException(
            f"no candidate met the attainment target with at most {max_workers} workers "
            f"(--max-workers): {missed}; raise --max-workers (the search scans down from a "
            "size that meets), or loosen the SLO or the rate"
        )
    click.echo(
        f"\n# predicted attainment {best.result.attainment:.2%} on {len(items)} simulated "
        f"requests; P:D = {best.pools[Role.PREFILL]}:{best.pools[Role.DECODE]}"
        + (
            "; searched: TP per pool, pool sizes"
            if per_pool_tp
            else "; searched: TP per service (--per-pool-tp: per pool), pool sizes"
        )
        + " (not pipeline parallelism, mixed pools, other hardware)"
    )
    if source is None:
        click.echo(
            f"# model.source below is the preset's name {model!r}, not weights: "
            "give --source (a Hugging Face id or a path) before applying it"
        )
    click.echo(planner.service_yaml(name, model, source or model, slo, best))
