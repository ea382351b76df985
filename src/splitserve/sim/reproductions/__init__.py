"""Paper reproductions: each seed paper's set-up and headline claims, re-run in the simulator.

One module per paper (`<paper>.py`: workloads, systems compared, claims) and, where the paper
needs a cluster of its own, `<paper>_cluster.py` (its set-up or driver); `common` holds what they
share. `REPRODUCTIONS` maps a paper name to its run function, imported when run.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from splitserve.sim.reproductions.common import LATENCY_SOURCES, Reproduction, latency_source


def _lazy(target: str) -> Callable[[bool], Reproduction]:
    """A reproduction living in its own module (`module:function`), imported when run."""

    def run(quick: bool) -> Reproduction:
        module, attr = target.split(":")
        fn: Callable[[bool], Reproduction] = getattr(importlib.import_module(module), attr)
        return fn(quick)

    return run


REPRODUCTIONS: dict[str, Callable[[bool], Reproduction]] = {
    "distserve": _lazy("splitserve.sim.reproductions.distserve:distserve"),
    "tetriinfer": _lazy("splitserve.sim.reproductions.tetriinfer:tetriinfer"),
    "pastfuture": _lazy("splitserve.sim.reproductions.pastfuture:pastfuture"),
    "splitwise": _lazy("splitserve.sim.reproductions.splitwise:splitwise"),
    "accelgen": _lazy("splitserve.sim.reproductions.accelgen:accelgen"),
    "bros": _lazy("splitserve.sim.reproductions.bros:bros"),
    "alise": _lazy("splitserve.sim.reproductions.alise:alise"),
    "aladdin": _lazy("splitserve.sim.reproductions.aladdin:aladdin"),
}

PARALLEL = frozenset({"distserve", "bros", "alise"})
"""The papers whose runs are split into independent units (`common.parallel_map`), so that
`--jobs` above 1 acts on them; the others run in one process and refuse it."""


CASES = frozenset({"bros"})
"""The papers with a `--cases all` mode: their headline figures average over set-ups (models ×
rates) that the default run covers only in part."""


def run_cases(paper: str, quick: bool, cases: str) -> Reproduction:
    """`paper`'s reproduction over `cases` ("default": `REPRODUCTIONS[paper]`; "all": every
    case the paper averages, for the papers in `CASES`; others are refused naming the flag)."""
    if cases == "default":
        return REPRODUCTIONS[paper](quick)
    if paper not in CASES:
        raise ValueError(
            f"--cases {cases}: {paper}'s reproduction has no cases mode; --cases acts on "
            f"{', '.join(sorted(CASES))}"
        )
    from splitserve.sim.reproductions.bros import bros

    return bros(quick, cases)


def run(paper: str, quick: bool = False, latency: str = "roofline") -> Reproduction:
    """Run `paper`'s reproduction with `latency`'s step pricing (`LATENCY_SOURCES`)."""
    with latency_source(latency):
        return REPRODUCTIONS[paper](quick)


__all__ = [
    "CASES",
    "LATENCY_SOURCES",
    "PARALLEL",
    "REPRODUCTIONS",
    "Reproduction",
    "run",
    "run_cases",
]
