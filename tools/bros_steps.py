"""Why BROS stops packing: count, over every step of one BROS run, what ended the RT pass.

Usage:
    python tools/bros_steps.py [--latency gpu|roofline] [--case opt-13b|opt-30b|llama-3-70b]
        [--rate 9] [--trace-s 120] [PARAM=VALUE ...]

Runs the BROS reproduction's set-up (ShareGPT; by default OPT-13B TP 2, A100-40GB, or another
of the paper's cases, `bros.CASES`, priced as `--cases all` prices it; `sim/reproductions/
bros.py`) for BROS alone with the given policy parameters (e.g. `adaptive_batch=False`,
`sum_intercepts=False`) and prints the outcome, the share of steps whose RT pass stopped on
each reason (`policy.batching.bros.Stop`: the τ_min deadline, the batch size, blocks, or
nothing left), the mean batch size and the mean number of RT requests present, per quarter of
the run. The numbers in docs/reproductions/latency-models.md (BROS) come from it. Single
process; a 120-s trace takes about a minute of CPU on the fit.
"""

from __future__ import annotations

import argparse
import ast
from collections import Counter
from typing import Any

import numpy as np

from splitserve.policy.batching import bros as policy
from splitserve.policy.batching.base import StepDecision, StepView
from splitserve.sim.reproductions import bros as repro
from splitserve.sim.reproductions.common import latency_source


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--latency", choices=("gpu", "roofline"), default="gpu")
    p.add_argument("--case", choices=tuple(repro.CASES), default="opt-13b")
    p.add_argument("--rate", type=float, default=9.0)
    p.add_argument("--trace-s", type=float, default=120.0)
    p.add_argument("params", nargs="*", help="BrosParams overrides, NAME=VALUE")
    args = p.parse_args()
    params: dict[str, Any] = {}
    for item in args.params:
        name, _, value = item.partition("=")
        params[name] = ast.literal_eval(value)

    steps: list[tuple[int, int, str, int]] = []
    decide = policy.BrosPolicy.decide

    def counted(self: policy.BrosPolicy, view: StepView) -> StepDecision:
        bsz = self.bsz
        d = decide(self, view)
        rt = sum(1 for s in (*view.running, *view.waiting) if s.slo_class in self.slos)
        steps.append((bsz, len(d.chunks), self.last_stop.value, rt))
        return d

    policy.BrosPolicy.decide = counted  # type: ignore[method-assign]
    with latency_source(args.latency):
        case = repro.CASES[args.case]
        out = repro.run(
            ("bros", params),
            repro.DATASETS[0],
            args.rate,
            args.trace_s,
            case.shape,
            case.tp,
            hardware=case.hardware,
        )
    print(out)
    stops = Counter(s[2] for s in steps)
    print(
        f"{len(steps)} steps; RT pass stopped by: "
        + ", ".join(f"{k} {v} ({v / len(steps):.0%})" for k, v in stops.most_common())
    )
    a = np.array([(s[0], s[1], s[3]) for s in steps], dtype=float)
    print(
        f"mean Bsz {a[:, 0].mean():.1f}, mean batch {a[:, 1].mean():.1f}, "
        f"mean RT present {a[:, 2].mean():.1f}"
    )
    for q in range(4):
        part = a[q * len(a) // 4 : (q + 1) * len(a) // 4]
        print(
            f"quarter {q + 1}: Bsz {part[:, 0].mean():.1f}, batch {part[:, 1].mean():.1f}, "
            f"RT present {part[:, 2].mean():.1f}"
        )


if __name__ == "__main__":
    main()
