"""Reports: markdown tables and PNG plots of simulation results.

Owns: rendering results to text and to PNG bytes (matplotlib's Agg canvas on a private `Figure`,
never pyplot's global state). Returns strings and bytes; the runner writes them to files.
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence

from splitserve.core.ids import SloClassName
from splitserve.core.request import SloClass
from splitserve.sim.metrics import SimResult, summarize


def fmt(value: object) -> str:
    """Compact cell text: 3 significant figures for floats, '-' for NaN/None."""
    if value is None:
        return "-"
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        return f"{value:.3g}" if abs(value) < 1e4 else f"{value:,.0f}"
    return str(value)


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(fmt(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def summary_markdown(
    result: SimResult, slos: Mapping[SloClassName, SloClass], title: str = "Simulation"
) -> str:
    """Totals, per-class SLO attainment and latency, and per-worker utilisation."""
    out = [f"## {title}\n"]
    out.append(
        markdown_table(
            [
                "arrived",
                "finished",
                "dropped",
                "in flight",
                "preemptions",
                "span s",
                "GPU-s",
                "busy GPU-s",
                "events",
            ],
            [
                [
                    result.num_arrived,
                    result.num_finished,
                    result.num_dropped,
                    result.num_in_flight,
                    result.num_preemptions,
                    result.end_s,
                    result.gpu_seconds,
                    result.busy_gpu_seconds,
                    result.num_events,
                ]
            ],
        )
    )
    rows = [
        [
            s.slo_class,
            s.num_requests,
            s.attainment,
            s.ttft_attainment,
            s.tpot_attainment,
            s.ttft_p50_s * 1e3,
            s.ttft_p90_s * 1e3,
            s.tpot_p50_s * 1e3,
            s.tpot_p90_s * 1e3,
            s.e2e_mean_s,
        ]
        for s in summarize(result, slos)
    ]
    out.append("\n### SLO classes\n")
    out.append(
        markdown_table(
            [
                "class",
                "requests",
                "attainment",
                "TTFT att.",
                "TPOT att.",
                "TTFT p50 ms",
                "TTFT p90 ms",
                "TPOT p50 ms",
                "TPOT p90 ms",
                "E2E mean s",
            ],
            rows,
        )
    )
    out.append("\n### Workers\n")
    span = result.end_s or 1.0
    out.append(
        markdown_table(
            ["worker", "role", "GPUs", "steps", "busy", "preemptions"],
            [
                [w.id, w.role, w.num_gpus, w.num_steps, w.busy_s / span, w.num_preemptions]
                for w in result.workers
            ],
        )
    )
    return "".join(out)


def requests_csv(result: SimResult) -> str:
    header = (
        "id,slo_class,path,arrival_s,prompt_tokens,output_tokens,ttft_s,tpot_s,e2e_s,kv_s,dropped"
    )
    lines = [header]
    for r in result.requests:
        cells = [
            r.id,
            r.slo_class,
            r.path,
            r.arrival_s,
            r.num_prompt_tokens,
            r.num_output_tokens,
            r.ttft_s,
            r.tpot_s,
            r.e2e_s,
            r.kv_transfer_s,
            r.dropped,
        ]
        lines.append(
            ",".join(
                "" if c is None else (f"{c:.6g}" if isinstance(c, float) else str(c)) for c in cells
            )
        )
    return "\n".join(lines) + "\n"


def attainment_plot_png(
    curves: Mapping[str, Sequence[tuple[float, float]]],
    target: float,
    title: str,
    xlabel: str = "rate per GPU (req/s)",
) -> bytes:
    """SLO attainment against rate, one line per system, with the target as a dashed line."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5.5, 3.6), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for label, points in curves.items():
        pts = sorted(points)
        ax.plot([p[0] for p in pts], [100 * p[1] for p in pts], marker="o", ms=3, label=label)
    ax.axhline(100 * target, color="grey", ls="--", lw=1)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("SLO attainment (%)")
    ax.set_ylim(0, 102)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()
