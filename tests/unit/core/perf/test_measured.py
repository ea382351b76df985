"""The GPU-measured latency models (`measured-h100`, `measured-h200`) reproduce the steps they
were fitted on, separate their components correctly, and are chosen and refused by name."""

from __future__ import annotations

import json
import runpy
import shutil
from pathlib import Path
from typing import Any

import pytest

from splitserve.core.perf import BatchShape, build_latency_model
from splitserve.core.perf.kvlink import kv_link
from splitserve.core.perf.measured import (
    PREFILL_FIT_MIN_TOKENS,
    MeasuredGpuModel,
    fit_steps,
    measured_models,
    measurements,
)
from splitserve.core.perf.published import _gpu_steps
from splitserve.core.perf.samples import Measurement

NVLINK = kv_link("nvlink-h100")


def test_vendored_steps_are_the_measured_figures() -> None:
    # Typed in from the raw run files (steps-<model>.csv of tools/gpu_step_profile.py).
    h200 = {(k, b, n): s for k, b, n, s in _gpu_steps.STEPS[("h200", "llama-2-7b")]}
    assert h200[("decode", 1, 512)] == pytest.approx(0.005689984, rel=1e-5)
    assert h200[("prefill", 1, 8192)] == pytest.approx(0.231190010, rel=1e-5)
    h100 = {(k, b, n): s for k, b, n, s in _gpu_steps.STEPS[("h100", "llama-3-8b")]}
    assert h100[("decode", 256, 256)] == pytest.approx(0.012998032, rel=1e-5)
    assert _gpu_steps.ENV["h200"]["gpu"] == "NVIDIA H200"
    # The 2026-11-27 H100 run (OPT-13B; decode b >= 32 at the context that fits: 32 x 1024).
    opt = {(k, b, n): s for k, b, n, s in _gpu_steps.STEPS[("h100", "opt-13b")]}
    assert opt[("prefill", 1, 2048)] == pytest.approx(0.086054657, rel=1e-5)
    assert opt[("decode", 32, 1024)] == pytest.approx(0.019770480, rel=1e-5)
    assert measured_models("h100") == (
        ("codellama-34b", 1),
        ("llama-2-13b", 1),
        ("llama-2-7b", 1),
        ("llama-3-8b", 1),
        ("opt-13b", 1),
    )
    assert measured_models("h200") == (("llama-2-7b", 1), ("llama-3-8b", 1))


@pytest.mark.parametrize(
    ("gpu", "model"),
    [(g, m) for g in ("h100", "h200") for m, _tp in measured_models(g)],
)
def test_model_reproduces_the_fitted_steps(gpu: str, model: str) -> None:
    m = MeasuredGpuModel(gpu, model, NVLINK)
    for s in measurements(gpu, model):
        err = m.step_s(s.batch) / s.seconds - 1
        if s.kind == "prefill" and s.prompt_tokens < PREFILL_FIT_MIN_TOKENS:
            # Not fitted: eager and launch-bound for the 7-8B models (priced below it), GEMM-bound
            # for CodeLlama-34B (the line from 512 tokens on prices it a little above).
            assert abs(err) < 0.4, (s.prompt_tokens, err)
            continue
        tol = 0.12 if s.kind == "prefill" and s.prompt_tokens == PREFILL_FIT_MIN_TOKENS else 0.05
        assert abs(err) < tol, (s.kind, s.batch_size, s.prompt_tokens, err)


def _synthetic(
    a: float, beta: float, k_pa: float, g: dict[int, float], k_da: float
) -> list[Measurement]:
    out: list[Measurement] = []
    for n in (512, 1024, 2048, 4096):
        shape = BatchShape(prefill_chunks=((n, 0),))
        secs = a + beta * n + k_pa * n * (n + 1) / 2
        out.append(Measurement("prefill", 1, n, 0, shape, secs))
    for b, gb in g.items():
        for c in (256, 2048):
            shape = BatchShape(decode_contexts=(c,) * b)
            out.append(Measurement("decode", b, c, 0, shape, gb + k_da * b * c))
    return out


def test_fit_separates_gemm_and_attention() -> None:
    g = {1: 0.006, 8: 0.0062, 64: 0.007}
    model = fit_steps(_synthetic(0.002, 2.4e-5, 1.0e-9, g, 3.0e-8))
    # Decode attention slope and GEMM values recovered exactly from noise-free data.
    assert model.decode_attention.at(1000.0) == pytest.approx(3.0e-5, rel=1e-6)
    assert model.gemm.at(8) == pytest.approx(0.0062, rel=1e-6)
    assert model.prefill_attention.at(1000.0) == pytest.approx(1.0e-6, rel=1e-4)
    assert model.gemm.at(1024) == pytest.approx(0.002 + 2.4e-5 * 1024, rel=1e-6)
    # A mixed batch is priced as the sum of its parts.
    mixed = BatchShape(prefill_chunks=((512, 0),), decode_contexts=(100,) * 8)
    expected = (0.002 + 2.4e-5 * 520) + 1.0e-9 * 512 * 513 / 2 + 3.0e-8 * 800
    assert model.step_s(mixed) == pytest.approx(expected, rel=1e-6)


def test_fit_needs_both_kinds() -> None:
    only_decode = [s for s in _synthetic(0, 1e-5, 0, {1: 0.006}, 1e-8) if s.kind == "decode"]
    with pytest.raises(ValueError, match="prefills"):
        fit_steps(only_decode)


def test_chosen_by_name_on_its_own_hardware_only() -> None:
    h200 = build_latency_model("measured-h200", "llama-3-8b", "h200")
    h100 = build_latency_model("measured-h100", "llama-3-8b", "h100-80g")
    decode = BatchShape(decode_contexts=(1024,) * 32)
    assert h200.step_s(decode) < h100.step_s(decode)  # more memory bandwidth
    with pytest.raises(ValueError, match="measured on h200"):
        build_latency_model("measured-h200", "llama-3-8b", "h100-80g")
    with pytest.raises(ValueError, match="no h100 measurement of 'llama-2-70b'"):
        build_latency_model("measured-h100", "llama-2-70b", "h100-80g")
    with pytest.raises(ValueError, match="TP 1 only"):
        build_latency_model("measured-h100", "llama-2-7b", "h100-80g", tp=2)


def _vendor_main() -> Any:
    path = Path(__file__).resolve().parents[4] / "tools" / "vendor_gpu_steps.py"
    return runpy.run_path(str(path))["main"]


def _fake_run(d: Path, gpu_name: str) -> Path:
    d.mkdir()
    (d / "env.json").write_text(
        json.dumps({"torch": "2.11.0+cu130", "dtype": "torch.bfloat16", "gpu": gpu_name})
    )
    (d / "steps-tiny.csv").write_text(
        "kind,batch,prompt_or_context,seconds\nprefill,1,512,0.01\ndecode,1,512,0.005\n"
    )
    (d / "ops-tiny.csv").write_text("op,tokens,ms\nadd,1,0.1\nemb,1,5.0\nmlp_act,1,0.2\n")
    return d


def test_vendor_merge_keeps_the_earlier_runs_and_checks_the_gpu(tmp_path: Path) -> None:
    out = tmp_path / "_gpu_steps.py"
    shutil.copy(_gpu_steps.__file__, out)
    run = _fake_run(tmp_path / "run", "NVIDIA H100 80GB HBM3")
    _vendor_main()(["--merge", f"h100={run}", "--out", str(out)])
    merged = runpy.run_path(str(out))
    assert merged["STEPS"][("h100", "tiny")] == (
        ("prefill", 1, 512, 0.01),
        ("decode", 1, 512, 0.005),
    )
    assert merged["LAYER_OPS"][("h100", "tiny")] == ((1,), (pytest.approx(0.3),))
    for key, rows in _gpu_steps.STEPS.items():  # nothing earlier lost or changed
        assert merged["STEPS"][key] == rows
    # Without --merge only the run's models remain.
    _vendor_main()([f"h100={run}", "--out", str(out)])
    assert set(runpy.run_path(str(out))["STEPS"]) == {("h100", "tiny")}
    # A run on another GPU model under the same name is refused, not merged.
    shutil.copy(_gpu_steps.__file__, out)
    other = _fake_run(tmp_path / "other", "NVIDIA A100-SXM4-80GB")
    with pytest.raises(SystemExit, match="gpu"):
        _vendor_main()(["--merge", f"h100={other}", "--out", str(out)])
