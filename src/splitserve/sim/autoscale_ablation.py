"""`splitserve sim autoscale --ablation`: what each safety margin of the loop buys and costs.

The evaluated policy (`Setup().params`, the operator's `live_params` with the evaluation's
scale-down utilisation) is run once as is and once per variant with one margin removed or
halved, on the same workload; each run is set against the same loop-independent yardstick
(`static-planned`, computed once per scenario with the evaluated policy's sizing, so a variant
cannot move it). Oscillations are counted over the evaluated policy's stabilization window for
every variant (a variant with a shorter window is not let off by its own definition).

A margin that only costs GPU-hours shows a lower ratio at the same attainment when removed; one
that buys attainment shows the attainment falling (below the 99 % target) when removed.
Pure apart from the simulation (no I/O).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from splitserve.core.roles import Role
from splitserve.sim.autoscale import ROLES, RunResult, Setup, reversals, run_autoscaled
from splitserve.sim.autoscale_eval import Planned, Scenario, planned_static


@dataclass(frozen=True, slots=True)
class Variant:
    """One margin removed or halved: a name, what it changes, and the change."""

    name: str
    change: str
    apply: Callable[[Setup], Setup]


def _params(setup: Setup, **kw: object) -> Setup:
    return replace(setup, params=replace(setup.params, **kw))  # type: ignore[arg-type]


def _halved_band(setup: Setup) -> Setup:
    p = setup.params
    down = p.target_utilization - (p.target_utilization - p.scale_down_utilization) / 2
    return _params(setup, scale_down_utilization=down)


VARIANTS: tuple[Variant, ...] = (
    Variant("evaluated", "the evaluated policy", lambda s: s),
    Variant(
        "no burst",
        "burst_weight 1 -> 0 (size for the window's mean rate)",
        lambda s: _params(s, burst_weight=0.0),
    ),
    Variant("half burst", "burst_weight 1 -> 0.5", lambda s: _params(s, burst_weight=0.5)),
    Variant(
        "full burst",
        "burst_poisson off: headroom for the busiest 10 s's whole excess (the previous policy)",
        lambda s: _params(s, burst_poisson=False),
    ),
    Variant(
        "no tail sizing",
        "ttft_tail_fraction 0.8 -> 0 (prefill: mean-wait M/D/1 rule only)",
        lambda s: _params(s, ttft_tail_fraction=0.0),
    ),
    Variant(
        "no band",
        "scale_down_utilization 0.5 -> 0.8 (= the scale-up threshold: no hysteresis band)",
        lambda s: _params(s, scale_down_utilization=s.params.target_utilization),
    ),
    Variant("half band", "scale_down_utilization 0.5 -> 0.65", _halved_band),
    Variant(
        "no feedback",
        "SLO / queue pressure off (min_samples and queue_per_worker infinite)",
        lambda s: _params(s, min_samples=2**62, queue_per_worker=math.inf),
    ),
    Variant("no settle", "feedback_settle off", lambda s: _params(s, feedback_settle=False)),
    Variant(
        "half stabilization",
        "scale-down stabilization 120 -> 60 s",
        lambda s: _params(s, scale_down_stabilization_s=s.params.scale_down_stabilization_s / 2),
    ),
    Variant(
        "no backoff",
        "adaptive stabilization off (reversal_backoff 2 -> 1)",
        lambda s: _params(s, reversal_backoff=1.0),
    ),
    Variant(
        "no trend",
        "forecast trend off (forecast_beta 0.3 -> 0)",
        lambda s: _params(s, forecast_beta=0.0),
    ),
    Variant(
        "no occupancy floor",
        "decode occupancy floor off",
        lambda s: _params(s, occupancy_floor=False),
    ),
    Variant("min 0", "min per pool 1 -> 0", lambda s: replace(s, min_replicas=0)),
    Variant(
        "lean",
        "no burst, no tail sizing, no band, no feedback at once (the margins that cost "
        "GPU-hours without attainment on the step, mix shift and conversation)",
        lambda s: _params(
            s,
            burst_weight=0.0,
            ttft_tail_fraction=0.0,
            scale_down_utilization=s.params.target_utilization,
            min_samples=2**62,
            queue_per_worker=math.inf,
        ),
    ),
)

CANDIDATES: tuple[Variant, ...] = (
    Variant(
        "noise band",
        "scale-down band from the rate's noise, z = 2 (band_z), at most the fixed band",
        lambda s: _params(s, band_z=2.0),
    ),
)
"""Reshaped margins not adopted (docs/autoscaling.md: it helps the steady scenarios and costs
the code trace), run beside the ablation."""


def variant(name: str) -> Variant:
    for v in VARIANTS + CANDIDATES:
        if v.name == name:
            return v
    valid = ", ".join(v.name for v in VARIANTS + CANDIDATES)
    raise ValueError(f"unknown variant {name!r}; valid: {valid}")


@dataclass(frozen=True, slots=True)
class Row:
    scenario: str
    variant: Variant
    result: RunResult
    oscillations: int
    """Reversals within the evaluated policy's stabilization window (not the variant's)."""
    yardstick_gpu_hours: float | None

    @property
    def ratio(self) -> float | None:
        if not self.yardstick_gpu_hours:
            return None
        return self.result.gpu_hours / self.yardstick_gpu_hours


def oscillations(result: RunResult, window_s: float, interval_s: float) -> int:
    """Scale direction reversals within `window_s`, per pool, from the run's ticks."""
    ticks = int(window_s / interval_s)
    return sum(reversals([t.workers[r] for t in result.ticks], ticks) for r in ROLES)


def ablate(
    scenario: Scenario,
    setup: Setup,
    variants: Sequence[Variant] = VARIANTS,
    yardstick: Planned | None = None,
    planned: bool = True,
) -> tuple[Planned | None, list[Row]]:
    """Run `scenario` autoscaled under each variant of `setup`; the yardstick is `static-planned`
    of the unchanged `setup` (computed here unless given; `planned=False`: none, no ratio)."""
    target = min(c.attainment for c in setup.classes)
    if yardstick is None and planned:
        yardstick = planned_static(scenario.items, setup, target)
    base = setup.params
    rows = []
    for v in variants:
        s = v.apply(setup)
        if scenario.initial is not None:
            s = replace(s, initial=scenario.initial)
        r = run_autoscaled(scenario.items, s, v.name, step_at_s=scenario.step_at_s)
        osc = oscillations(r, base.scale_down_stabilization_s, base.interval_s)
        gpu = yardstick.result.gpu_hours if yardstick is not None else None
        rows.append(Row(scenario.name, v, r, osc, gpu))
    return yardstick, rows


def _pools(p: dict[Role, int] | object) -> str:
    assert isinstance(p, dict)
    return f"P{p.get(Role.PREFILL, 0)}:D{p.get(Role.DECODE, 0)}"


def markdown(results: Sequence[tuple[Planned | None, list[Row]]]) -> str:
    """One table per scenario: each variant's attainment, GPU-hours, ratio to static-planned,
    the change against the evaluated policy, reaction and oscillations."""
    out = []
    for yard, rows in results:
        if not rows:
            continue
        base = rows[0].result
        head = f"**{rows[0].scenario}**"
        if yard is not None:
            head += (
                f" (static-planned {_pools(dict(yard.result.peak_workers))}: "
                f"{yard.result.gpu_hours:.2f} GPU-h, {yard.result.attainment:.2%})"
            )
        out += [
            head,
            "",
            "| variant | change | in SLO | GPU-h | vs static-planned | ΔGPU-h | Δ in SLO (pts) "
            "| peak | reaction (s) | oscillations |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for row in rows:
            r = row.result
            ratio = "-" if row.ratio is None else f"{row.ratio:.2f}x"
            react = "-" if r.reaction_s is None else f"{r.reaction_s:.0f}"
            out.append(
                f"| {row.variant.name} | {row.variant.change} | {r.attainment:.2%} "
                f"| {r.gpu_hours:.2f} | {ratio} | {r.gpu_hours - base.gpu_hours:+.2f} "
                f"| {(r.attainment - base.attainment) * 100:+.2f} "
                f"| {_pools(dict(r.peak_workers))} | {react} | {row.oscillations} |"
            )
        out.append("")
    return "\n".join(out)
