"""Compare the simulator's latency models with the whole steps measured on real GPUs.

Usage: python tools/compare_gpu_steps.py   (prints Markdown for docs/simulator.md)

For every step in `splitserve/core/perf/published/_gpu_steps.py` (H100 and H200, TP 1): the
measured time and each model's prediction as a ratio to it — the roofline on the GPU's hardware
preset, Vidur's H100 tables where Vidur covers the model (H100 only), and the `measured-*` model
fitted on these very steps (an in-sample check of the fit, not a validation). Then one layer's
non-attention operators: ours against Vidur's H100 tables. Last, the carrying method the
`--latency gpu` reproductions use (`RescaledModel`: DistServe's A100-80GB fits of OPT-13B moved
to another GPU by the roofline's per-shape ratio) checked against OPT-13B measured on the H100:
an out-of-sample test of that method, both of DistServe's engines.
"""

from __future__ import annotations

import statistics

from splitserve.core.perf import BatchShape, LatencyModel, build_latency_model
from splitserve.core.perf.catalog import RescaledModel
from splitserve.core.perf.distserve import DistServeModel
from splitserve.core.perf.kvlink import kv_link
from splitserve.core.perf.published import _gpu_steps
from splitserve.core.perf.roofline import RooflineModel
from splitserve.core.perf.shapes import HARDWARE as PRESETS
from splitserve.core.perf.shapes import MODELS
from splitserve.core.perf.vidur import VidurModel, vidur_models

HARDWARE = {"h100": "h100-80g", "h200": "h200"}


def _shape(kind: str, batch: int, n: int) -> BatchShape:
    if kind == "prefill":
        return BatchShape(prefill_chunks=((n, 0),) * batch)
    return BatchShape(decode_contexts=(n,) * batch)


def _models(gpu: str, model: str) -> tuple[LatencyModel, LatencyModel, LatencyModel | None]:
    """The roofline on the GPU's preset, the `measured-*` fit, and Vidur's H100 model where
    Vidur covers the model on that GPU (else None)."""
    hw = HARDWARE[gpu]
    vidur = None
    if gpu == "h100" and (model, 1) in vidur_models("h100"):
        vidur = build_latency_model("vidur-h100", model, hw)
    roof = build_latency_model("roofline", model, hw)
    return roof, build_latency_model(f"measured-{gpu}", model, hw), vidur


def main() -> None:
    summary: list[str] = []
    print("| GPU | model | step | measured ms | roofline | Vidur H100 | measured-* fit |")
    print("|---|---|---|---:|---:|---:|---:|")
    for (gpu, model), rows in sorted(_gpu_steps.STEPS.items()):
        roof, fit, vidur = _models(gpu, model)
        errs: dict[str, list[float]] = {"roofline": [], "vidur": []}
        for kind, b, n, secs in rows:
            shape = _shape(kind, b, n)
            r = roof.step_s(shape) / secs
            v = vidur.step_s(shape) / secs if vidur else None
            f = fit.step_s(shape) / secs
            errs["roofline"].append(abs(r - 1))
            if v is not None:
                errs["vidur"].append(abs(v - 1))
            step = f"prefill {n}" if kind == "prefill" else f"decode {b} x {n}"
            vs = f"{v:.2f}x" if v is not None else "-"
            print(f"| {gpu} | {model} | {step} | {secs * 1e3:.2f} | {r:.2f}x | {vs} | {f:.2f}x |")
        for name, e in errs.items():
            if e:
                summary.append(
                    f"| {gpu} | {model} | {name} | {100 * statistics.median(e):.1f} % | "
                    f"{100 * max(e):.1f} % | {sum(x <= 0.1 for x in e)}/{len(e)} |"
                )
    print()
    print("| GPU | model | model priced | median abs. error | max | within 10 % |")
    print("|---|---|---|---:|---:|---:|")
    print("\n".join(summary))
    print()
    print("| GPU | model | chunk + decodes | measured ms | roofline | Vidur H100 | measured-* |")
    print("|---|---|---|---:|---:|---:|---:|")
    for (gpu, model), mrows in sorted(_gpu_steps.MIXED.items()):
        roof, fit, vidur = _models(gpu, model)
        for n, b, c, secs in mrows:
            shape = BatchShape(prefill_chunks=((n, 0),), decode_contexts=(c,) * b)
            vs = f"{vidur.step_s(shape) / secs:.2f}x" if vidur else "-"
            print(
                f"| {gpu} | {model} | {n} + {b} x {c} | {secs * 1e3:.2f} | "
                f"{roof.step_s(shape) / secs:.2f}x | {vs} | {fit.step_s(shape) / secs:.2f}x |"
            )
    print()
    print("One layer's non-attention operators (sum of medians, ms): ours / Vidur H100")
    print()
    vidur = VidurModel("h100", "llama-2-7b", 1, kv_link("nvlink-h100"))
    tokens, ours = _gpu_steps.LAYER_OPS[("h100", "llama-2-7b")]
    print("| tokens | " + " | ".join(str(t) for t in tokens) + " |")
    print("|---|" + "---:|" * len(tokens))
    print("| ours H100 | " + " | ".join(f"{ms:.3f}" for ms in ours) + " |")
    print(
        "| Vidur H100 | " + " | ".join(f"{vidur.layer_ops_s(t) * 1e3:.3f}" for t in tokens) + " |"
    )
    ratio = [ms / (vidur.layer_ops_s(t) * 1e3) for t, ms in zip(tokens, ours, strict=True)]
    print("| ratio | " + " | ".join(f"{x:.2f}" for x in ratio) + " |")
    if ("h100", "opt-13b") in _gpu_steps.STEPS:
        print()
        _carried_opt_13b()


def _carried_opt_13b() -> None:
    """DistServe's A100 fits of OPT-13B carried to the H100 (as `gpu_or` carries them to a
    paper's GPU, the per-step residual held) against the OPT-13B steps measured on an H100."""
    shape = MODELS["opt-13b"]
    a100 = RooflineModel(shape, PRESETS["a100-80g"])
    h100 = RooflineModel(shape, PRESETS["h100-80g"])
    carried = {}
    for engine in ("distserve", "vllm"):
        fit = DistServeModel(engine, "opt-13b", 1, kv_link("nvlink-a100"))
        carried[engine] = RescaledModel(fit, a100, h100, RescaledModel.fixed_overhead(fit, a100))
    print("OPT-13B, TP 1: DistServe's A100 fits carried to the H100 / measured on the H100")
    print()
    print("| step | measured H100 ms | DistServe engine carried | vLLM (2023) carried |")
    print("|---|---:|---:|---:|")
    for kind, b, n, secs in _gpu_steps.STEPS[("h100", "opt-13b")]:
        s = _shape(kind, b, n)
        step = f"prefill {n}" if kind == "prefill" else f"decode {b} x {n}"
        d, v = (carried[e].step_s(s) / secs for e in ("distserve", "vllm"))
        print(f"| {step} | {secs * 1e3:.2f} | {d:.2f}x | {v:.2f}x |")


if __name__ == "__main__":
    main()
