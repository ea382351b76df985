"""Runs scenarios and reproductions and writes their outputs: the simulator's only file I/O.

Owns: reading a scenario file (YAML) and any trace it names, running it (and its goodput search
when configured), replaying a recorded run for `sim validate`, and writing `summary.md`,
`requests.csv`, `config.yaml` and PNG plots into an output directory. Everything it computes
comes from the pure modules.
"""

from __future__ import annotations

import csv
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from splitserve.api.validation import one_line, yaml_problem
from splitserve.core.errors import ConfigError
from splitserve.core.ids import SloClassName
from splitserve.sim.cluster import ClusterSpec, simulate
from splitserve.sim.config import (
    ClusterConfig,
    ScenarioConfig,
    build_workload,
    cluster_spec,
    slo_classes,
)
from splitserve.sim.metrics import SimResult, goodput, overall_attainment
from splitserve.sim.report import (
    attainment_plot_png,
    fmt,
    markdown_table,
    requests_csv,
    summary_markdown,
)
from splitserve.sim.reproductions import PARALLEL, Reproduction, run_cases
from splitserve.sim.reproductions.common import latency_source, parallel
from splitserve.sim.speed import parse_speed_trace
from splitserve.sim.validate import Recording, Validation, parse_recording, replay
from splitserve.sim.validate_steps import (
    Calibration,
    calibrate,
    handoffs,
    parse_kv_pulls,
    parse_steps_csv,
)

_M = TypeVar("_M", bound=BaseModel)


@dataclass(frozen=True, slots=True)
class ScenarioOutput:
    result: SimResult
    markdown: str
    files: tuple[Path, ...]


class RunFileError(ValueError):
    """A file of the recorded run that cannot be read: `source` says which input it came
    through (`speed_trace` or `run_steps`), so the command can name its option."""

    def __init__(self, source: str, message: str) -> None:
        super().__init__(message)
        self.source = source


def load_scenario(path: Path) -> ScenarioConfig:
    """The scenario in `path`; a file that is not one is a one-line `ConfigError`."""
    return _validated(path, ScenarioConfig)


def _mapping(path: Path) -> dict[str, Any]:
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:  # was the parser's traceback
        raise ConfigError(f"{path}: {yaml_problem(err)}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: not a mapping of keys (got {type(raw).__name__})")
    return raw


def _validated(path: Path, model: type[_M]) -> _M:
    try:
        return model.model_validate(_mapping(path))
    except ValidationError as err:  # one line per bad key (was pydantic's block, with its URL)
        raise ConfigError(f"{path}: {one_line(err)}") from None


def _lines(path_text: str | None, base: Path, key: str = "") -> list[str] | None:
    if path_text is None:
        return None
    path = Path(path_text)
    if not path.is_absolute():
        path = base / path
    where = "" if Path(path_text).is_absolute() else " (relative to the file's directory)"
    try:
        with path.open(encoding="utf-8") as f:
            return f.readlines()
    except OSError as err:  # was a FileNotFoundError / IsADirectoryError traceback
        raise ConfigError(f"{key} {path_text!r} ({path}): {err.strerror or err}{where}") from None
    except UnicodeDecodeError as err:  # was "'utf-8' codec can't decode ...", naming no file
        raise ConfigError(
            f"{key} {path_text!r} ({path}): not UTF-8 text (byte {err.start}){where}"
        ) from None


def cluster_of(cfg: ClusterConfig, base_dir: Path) -> ClusterSpec:
    """The cluster `cfg` describes, its `latency_profile` read relative to `base_dir`: a
    `ConfigError` for a profile that cannot be read or parsed, or pools it cannot run."""
    return cluster_spec(cfg, _lines(cfg.latency_profile, base_dir, "latency_profile"))


def run_scenario(
    cfg: ScenarioConfig, out_dir: Path | None, base_dir: Path = Path()
) -> ScenarioOutput:
    """Simulate the scenario at its configured rate (and search goodput if asked)."""
    trace = cfg.workload.trace.path if cfg.workload.trace else None
    lines = _lines(trace, base_dir, "workload.trace.path")
    spec = cluster_of(cfg, base_dir)
    slos = slo_classes(cfg)
    items = build_workload(cfg.workload, lines)
    if cfg.goodput is not None:  # refused before the run: a trace of no span cannot be paced
        build_workload(cfg.workload, lines, cfg.goodput.low_rate)
    result = simulate(spec, items)
    md = summary_markdown(result, slos, title=cfg.name)
    png: bytes | None = None
    if cfg.goodput is not None:
        # the workload's class: every request is of it (the first declared class was used)
        target = slos[SloClassName(cfg.workload.slo_class)].percentile

        def attainment_at(rate: float) -> float:
            return overall_attainment(
                simulate(spec, build_workload(cfg.workload, lines, rate)), slos
            )

        g = goodput(
            attainment_at,
            target,
            cfg.goodput.low_rate,
            cfg.goodput.high_rate,
            cfg.goodput.tolerance,
        )
        gpus = result.num_gpus
        at_least = ">= " if g.lower_bound else ""
        md += "\n### Goodput\n\n" + markdown_table(
            ["goodput req/s", "per GPU req/s", "target", "probes"],
            [
                [
                    at_least + fmt(g.rate_per_s),
                    at_least + fmt(g.rate_per_s / gpus),
                    target,
                    len(g.probes),
                ]
            ],
        )
        if g.lower_bound:
            md += (
                f"\nA lower bound: attainment still met the target at every rate probed (up "
                f"to {fmt(g.rate_per_s)} req/s) when the search ran out of probes; the goodput "
                "is higher, by how much is unknown.\n"
            )
        png = attainment_plot_png(
            {cfg.name: [(r / gpus, a) for r, a in g.probes]}, target, f"{cfg.name}: SLO attainment"
        )
    files: list[Path] = []
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        files.append(_write(out_dir / "summary.md", md))
        files.append(_write(out_dir / "requests.csv", requests_csv(result)))
        files.append(_write(out_dir / "config.yaml", yaml.safe_dump(_dumped(cfg, base_dir))))
        if png is not None:
            files.append(_write_bytes(out_dir / "attainment.png", png))
    return ScenarioOutput(result, md, tuple(files))


def _dumped(cfg: ScenarioConfig, base_dir: Path) -> dict[str, Any]:
    """The scenario as run, its file paths absolute: `config.yaml` runs again as it is from
    the output directory (a relative `trace.path` / `latency_profile` was written as given,
    relative to the scenario's directory, and did not)."""
    dumped: dict[str, Any] = cfg.model_dump(mode="json")
    if cfg.latency_profile is not None:
        dumped["latency_profile"] = str((base_dir / cfg.latency_profile).absolute())
    trace = dumped["workload"].get("trace")
    if isinstance(trace, dict) and isinstance(trace.get("path"), str):
        trace["path"] = str((base_dir / trace["path"]).absolute())
    return dumped


NO_GPU_MODEL: Final[dict[str, str]] = {
    "aladdin": "no GPU-measured model covers the paper's set-up (its vLLM TP-4 baseline has no "
    "measured counterpart), so steps stay on the roofline",
    "pastfuture": "the paper's protocol counts decode steps without a clock, so no latency model "
    "is used",
    "splitwise": "steps are always priced by SplitwiseSim's GPU profile of the paper's own "
    "DGX-A100 / DGX-H100 set-up",
}
"""Papers whose `--latency gpu` run is their roofline run (docs/simulator.md): said in the
notes, since the flag is accepted for every paper."""


def run_reproduction(
    paper: str,
    quick: bool,
    out_dir: Path | None,
    latency: str = "roofline",
    jobs: int = 1,
    cases: str = "default",
) -> Reproduction:
    """Run one paper's headline comparison; write its table and plots when `out_dir` is set.
    `latency`: "roofline" or "gpu" (the nearest published GPU-measured model). `jobs`: worker
    processes for the run's independent units (the same results for every value; papers
    without units run in this process). `cases`: "default", or "all" for the papers whose
    figures average over set-ups (`reproductions.CASES`; others refuse it)."""
    if jobs > 1 and paper not in PARALLEL:
        raise ValueError(
            f"--jobs {jobs}: {paper}'s reproduction runs in one process; "
            f"--jobs acts on {', '.join(sorted(PARALLEL))}"
        )
    with latency_source(latency), parallel(jobs):
        repro = run_cases(paper, quick, cases)
    if latency == "gpu" and paper in NO_GPU_MODEL:
        note = f"Latency (--latency gpu): {NO_GPU_MODEL[paper]}; the flag changes nothing here"
        repro = dataclasses.replace(repro, notes=(*repro.notes, note))
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        _write(out_dir / f"{paper}.md", repro.markdown())
        for i, workload in enumerate(repro.systems):
            png = attainment_plot_png(repro.curves(workload), 0.9, f"{repro.paper}: {workload}")
            _write_bytes(out_dir / f"{paper}-{i}.png", png)
    return repro


def load_cluster(path: Path) -> ClusterConfig:
    """A cluster file (a scenario without `workload`, `slo_classes`, `goodput`)."""
    return _validated(path, ClusterConfig)


def run_validation(
    recording: Path,
    cluster: Path,
    out_dir: Path | None = None,
    target: float = 0.05,
    speed_trace: Path | None = None,
    run_steps: Path | None = None,
    run_speed: bool = True,
    run_gaps: bool = True,
    run_overheads: bool = True,
    run_speed_steps: int = 1,
    run_handoff: bool = True,
) -> tuple[Validation, str]:
    """Replay `recording` (JSON lines or CSV) on the cluster in `cluster`; write
    validation.md and requests.csv (per request, measured vs simulated) when `out_dir` is set.
    `speed_trace`: the speed probe's log of the run (`sim.speed`); steps are scaled by it.
    `run_steps`: a directory of the run's worker step logs (`<worker>.steps.csv`); each pool is
    priced by a model fitted to its workers' steps and, with `run_speed`, scaled by their speed
    over the run (`sim.validate_steps`); `run_gaps`: a step lasts until the next one while the
    worker had work; `run_overheads`: add the measured per-request time outside the steps
    (and the first request's cold dispatch to it);
    `run_speed_steps`: the factor pricing a step is the median over this many recorded steps
    nearest it (1: the step running then); `run_handoff`: charge each P/D request's measured
    hand-off (`kv_pulls.jsonl` in `run_steps`) as its KV transfer."""
    if speed_trace is not None and run_steps is not None:
        raise ValueError("give either a speed trace or the run's steps, not both")
    cfg = load_cluster(cluster)
    spec = cluster_of(cfg, cluster.parent)
    with recording.open() as f:
        rec = parse_recording(f)
    speed = None
    pool_speed = None
    overhead = 0.0
    cold = 0.0
    side_by_side = False
    note = ""
    if speed_trace is not None:
        try:
            with speed_trace.open() as f:
                speed = parse_speed_trace(f)
        except ValueError as err:
            raise RunFileError("speed_trace", f"{speed_trace}: {err}") from None
        note = f"Steps scaled by the machine's speed from {speed_trace.name}.\n\n"
    if run_steps is not None:
        try:
            cal = calibrate_from_dir(
                spec,
                rec,
                run_steps,
                run_speed,
                run_gaps,
                run_overheads,
                run_speed_steps,
                run_handoff,
            )
        except RunFileError:
            raise
        except ValueError as err:  # a step log or kv_pulls.jsonl it cannot read
            raise RunFileError("run_steps", str(err)) from None
        spec, pool_speed, overhead = cal.spec, cal.pool_speed, cal.request_overhead_s
        cold = cal.first_request_extra_s
        side_by_side = cal.side_by_side_transfers
        note = cal.markdown()
    v = replay(spec, rec, speed, pool_speed, overhead, side_by_side, cold)
    priced = "the run's own steps" if run_steps is not None else cfg.latency_model
    text = f"## Validation: {recording.name} on {cfg.name} ({priced})\n\n" + note
    text += v.markdown(target)
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        _write(out_dir / "validation.md", text)
        with (out_dir / "requests.csv").open("w", newline="") as f:
            csv.writer(f).writerows(v.csv_rows())
    return v, text


def calibrate_from_dir(
    spec: ClusterSpec,
    rec: Recording,
    run_steps: Path,
    timed: bool = True,
    gaps: bool = True,
    overheads: bool = True,
    price_nearest: int = 1,
    handoff: bool = True,
) -> Calibration:
    """`validate_steps.calibrate` on every `<worker>.steps.csv` in `run_steps`; with
    `handoff`, the P/D hand-off from its `kv_pulls.jsonl` when the run wrote one (a run
    recorded without it says so in the report: the link prices the transfers)."""
    files = sorted(run_steps.glob("*.steps.csv"))
    if not files:
        raise RunFileError("run_steps", f"no <worker>.steps.csv in {run_steps}")
    steps = {}
    for path in files:
        try:
            with path.open() as f:
                steps[path.name.removesuffix(".steps.csv")] = parse_steps_csv(f)
        except ValueError as err:
            raise ValueError(f"{path.name}: {err}") from None
    reqs = rec.requests
    end = max(r.arrival_s + r.latency_s for r in reqs)
    requests = [(r.arrival_s, r.prompt_tokens, r.ttft_s) for r in reqs] if overheads else None
    measured = None
    pulls_path = run_steps / "kv_pulls.jsonl"
    has_decode = any(p.role.value == "decode" and p.replicas > 0 for p in spec.pools)
    if handoff and has_decode and pulls_path.exists():
        try:
            with pulls_path.open() as f:
                pulls = parse_kv_pulls(f)
        except ValueError as err:
            raise ValueError(f"{pulls_path.name}: {err}") from None
        measured = handoffs([(r.id, r.arrival_s, r.prompt_tokens, r.ttft_s) for r in reqs], pulls)
    cal = calibrate(
        spec,
        steps,
        reqs[0].arrival_s,
        end,
        timed,
        gaps=gaps,
        requests=requests,
        price_nearest=price_nearest,
        handoff=measured,
    )
    if handoff and measured is None and has_decode:
        note = "P/D hand-off: not recorded (no kv_pulls.jsonl); the link prices it.\n\n"
        return dataclasses.replace(cal, note=note)
    return cal


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _write_bytes(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path
