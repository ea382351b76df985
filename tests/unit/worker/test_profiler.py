"""`splitserve profile` against real sim-engine workers.

The accuracy tests profile a sim worker (llama-2-7b on an A100, steps of 10-85 ms) whose engine
sleeps each step for the roofline's price of that step, so the profile must give the roofline
back: every measured cell, and the table built from them on batch shapes that were never
probed, within TOL_REL of the roofline plus TOL_ABS_S. `auto` (the worker's own step samples)
runs `splitserve profile --worker` against `splitserve worker serve --engine sim` in its own
process over gRPC. `outside` (client timing) runs the worker and the profiler in one event loop
on virtual time (`tests/fakes/virtual_time.py`): timed in real time it measured the worker's
per-step overhead (asyncio sleeps overshoot by up to 1 ms; the event loop relays every token of
a step before it wakes for the next) plus the machine's scheduling noise, and failed under load.
The other tests use in-process workers (tests/unit/worker/conftest.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, cast

import pytest
from click.testing import CliRunner
from prometheus_client import CollectorRegistry

from splitserve.cli.profile import profile
from splitserve.core.clock import SystemClock
from splitserve.core.perf import HARDWARE, MODELS, BatchShape, RooflineModel, parse_profile_csv
from splitserve.core.perf.samples import (
    Measurement,
    build_table,
    cells,
    isotonic,
    parse_samples_csv,
    samples_csv,
    table_csv,
)
from splitserve.core.roles import Role
from splitserve.obs.metrics import WorkerMetrics
from splitserve.worker.profiler import ProfileError, ProfileGrid, Profiler, _Call
from splitserve.worker.runtime import WorkerConfig, _ReleaseClient, build_sim_engine
from splitserve.worker.server import WorkerIdentity, WorkerService
from splitserve.worker.sim_engine import SimEngine
from tests.unit.worker.conftest import WorkerFactory

ROOFLINE = RooflineModel(MODELS["llama-2-7b"], HARDWARE["a100-80g"])
TOL_REL = 0.10
TOL_ABS_S = 0.003

GRID_ARGS = [
    *("--prefill-tokens", "128,512,1024", "--prefill-batch", "1,4,16"),
    *("--decode-batch", "1,8,24", "--decode-context", "64,384", "--decode-tokens", "12"),
    *("--repeats", "3", "--warmup", "1"),
]
GRID = ProfileGrid(
    prefill_tokens=(128, 512, 1024),
    prefill_batch_sizes=(1, 4, 16),
    decode_batch_sizes=(1, 8, 24),
    decode_contexts=(64, 384),
    decode_tokens=12,
)

HELD_OUT_SHAPES = [
    BatchShape(prefill_chunks=((300, 0),)),
    BatchShape(prefill_chunks=((96, 0),) * 3),
    BatchShape(prefill_chunks=((700, 0),)),
    BatchShape(decode_contexts=(200,) * 4),
    BatchShape(decode_contexts=(300,) * 16),
    BatchShape(decode_contexts=(100,) * 12),
]


@pytest.fixture
def sim_worker_process(tmp_path: Path) -> Iterator[str]:
    """`splitserve worker serve --engine sim` (llama-2-7b, a100-80g, real time); its address."""
    ready = tmp_path / "worker.ready.json"
    log = tmp_path / "worker.log"
    argv = [
        *(sys.executable, "-m", "splitserve", "worker", "serve", "--engine", "sim"),
        *("--sim-shape", "llama-2-7b", "--sim-hardware", "a100-80g", "--sim-kv-blocks", "4096"),
        *("--ready-file", str(ready), "--log-level", "WARNING"),
    ]
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"sim worker did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.1)
        yield str(json.loads(ready.read_text())["address"])
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.slow
@pytest.mark.integration
def test_profile_of_sim_worker_recovers_the_roofline(
    sim_worker_process: str, tmp_path: Path
) -> None:
    """`splitserve profile --worker` (method auto: the worker's own step samples) against a sim
    worker process over gRPC."""
    out = tmp_path / "profile"
    result = CliRunner().invoke(
        profile,
        ["--worker", sim_worker_process, "--out", str(out), "--method", "auto", *GRID_ARGS],
    )
    assert result.exit_code == 0, result.output
    _check_recovers_the_roofline(out, "auto")


def test_outside_timing_recovers_the_roofline_in_virtual_time(tmp_path: Path) -> None:
    """The client-timed method (`--method outside`) against a sim worker whose steps sleep the
    roofline's price, on virtual time: the profiler's clock is the event loop's, which moves
    only by the worker's sleeps, so what it measures is the priced steps and its own logic
    (gating, spreads, windows), not the machine's load.

    Before, this ran as `[outside]` above, timing a worker process in real time: under load
    (CI rehearsal, load ~4 on 2 cores) scheduling delays beyond TOL_ABS_S failed it. Real-time
    accuracy is for benchmarks to measure, not tests (docs/profiling.md, "Accuracy")."""
    from splitserve.cli.profile import _write
    from tests.fakes.virtual_time import DirectStub, VirtualTimeLoop

    async def run() -> tuple[list[Measurement], Any]:
        cfg = WorkerConfig(
            role=Role.MIXED,
            sim_model_shape="llama-2-7b",
            sim_hardware="a100-80g",
            sim_num_kv_blocks=4096,
        )
        release = _ReleaseClient()
        metrics = WorkerMetrics(CollectorRegistry())
        engine = build_sim_engine(cfg, "direct:1", release, metrics)
        service = WorkerService(
            engine, Role.MIXED, WorkerIdentity("w", "direct:1"), metrics, SystemClock()
        )
        await engine.start()
        try:
            loop = asyncio.get_running_loop()
            profiler = Profiler(
                cast(Any, DirectStub(service)), GRID, method="outside", timer=loop.time
            )
            return await profiler.run(), profiler.stats
        finally:
            await engine.stop()
            await release.close()

    loop = VirtualTimeLoop()
    try:
        samples, stats = loop.run_until_complete(run())
    finally:
        loop.close()
    out = tmp_path / "profile"
    out.mkdir()
    _write(out, samples, "virtual-time sim worker", stats, 4)
    _check_recovers_the_roofline(out, "outside")


def _check_recovers_the_roofline(out: Path, method: str) -> None:
    """Every cell, and the table on shapes never probed, within the tolerance of the roofline;
    the fit good at the default gate."""
    samples = parse_samples_csv((out / "samples.csv").read_text().splitlines())
    summary = json.loads((out / "fit.json").read_text())
    if method == "auto":  # the sim worker serves WatchSteps: exact shapes and priced times
        assert summary["method"] == "steps"
        assert (out / "steps.csv").exists()
        assert summary["steps"]["mixed"] > 0
        assert summary["steps"]["dropped"] == 0
        # DistServe's A.4 form fitted to every step seen, against the roofline that priced them:
        # the form has no max(compute, memory) kink, so its error depends on the shapes the run
        # happened to see (after a rejected probe the gate grows). Measured: 0.037-0.041 on an
        # idle machine, 0.050 on a loaded one (more, longer gates); a wrong fit is far above.
        assert summary["steps"]["mape"] < 0.08, summary["steps"]
        for m in samples:
            assert m.seconds == pytest.approx(ROOFLINE.step_s(m.batch), rel=1e-9)
    else:
        assert summary["method"] == "outside"
        assert not (out / "steps.csv").exists()
    assert summary["probes"]["rejected"] <= summary["probes"]["run"] // 4, summary["probes"]

    got = cells(samples)
    assert {(c.kind, c.batch_size, c.prompt_tokens) for c in got} == {
        *(("prefill", b, n) for b, n in GRID.prefill_cells()),
        *(("decode", b, c) for b, c in GRID.decode_cells()),
    }
    off = {
        (c.kind, c.batch_size, c.prompt_tokens): _off(c.seconds, ROOFLINE.step_s(c.batch))
        for c in got
    }
    assert max(off.values()) <= 1.0, {
        k: f"{v:.2f} tol: {c.seconds * 1e3:.2f} ms vs {ROOFLINE.step_s(c.batch) * 1e3:.2f} ms"
        for (k, v), c in zip(off.items(), got, strict=True)
    }

    table = parse_profile_csv((out / "profile.csv").read_text().splitlines())
    held = [_off(table.step_s(b), ROOFLINE.step_s(b)) for b in HELD_OUT_SHAPES]
    assert max(held) <= 1.0, held

    assert summary["cells"]["heldout"] >= 2
    assert summary["fit"]["ready_at_default_gate"], summary["fit"]
    assert summary["fit"]["mape_heldout"] < 0.15, summary
    assert summary["table"]["mape_heldout"] < 0.15, summary


def _off(got_s: float, want_s: float) -> float:
    """How far `got_s` is from `want_s`, in units of the tolerance (<= 1 passes)."""
    return abs(got_s - want_s) / (TOL_REL * want_s + TOL_ABS_S)


async def test_cli_writes_samples_table_and_fit_and_rebuilds_from_samples(
    make_worker: WorkerFactory, tmp_path: Path
) -> None:
    worker = await make_worker(Role.MIXED, sim_time_scale=1.0, sim_num_kv_blocks=2048)
    small = ProfileGrid(
        prefill_tokens=(128, 512),
        prefill_batch_sizes=(1, 4),
        decode_batch_sizes=(1, 8),
        decode_contexts=(64, 256),
        decode_tokens=6,
        repeats=2,
        extra_repeats=0,
        warmup=0,
    )
    samples = await Profiler(worker.stub, small).run()
    assert len(samples) == 2 * (len(small.prefill_cells()) + len(small.decode_cells()))
    (tmp_path / "in.csv").write_text("\n".join(samples_csv(samples)) + "\n")

    # The CLI, offline: the measuring half is the same Profiler (the async test loop owns
    # the worker, so `--worker` is exercised by the vLLM contract test instead).
    out = tmp_path / "out"
    result = CliRunner().invoke(
        profile,
        ["--from-samples", str(tmp_path / "in.csv"), "--out", str(out), "--holdout-every", "0"],
    )
    assert result.exit_code == 0, result.output
    assert parse_samples_csv((out / "samples.csv").read_text().splitlines()) == samples
    model = parse_profile_csv((out / "profile.csv").read_text().splitlines())
    assert model.step_s(BatchShape(decode_contexts=(64,))) > 0
    summary = json.loads((out / "fit.json").read_text())
    assert set(summary["fit"]["coefficients"]) == {"a_p", "b_p", "c_p", "a_d", "b_d", "c_d"}
    assert summary["samples"] == len(samples)
    assert summary["fit"]["mape_heldout"] is None  # nothing held out: null, not NaN


TINY = ProfileGrid(
    prefill_tokens=(128,),
    prefill_batch_sizes=(1,),
    decode_batch_sizes=(1,),
    decode_contexts=(32,),
    decode_tokens=3,
    repeats=1,
    extra_repeats=0,
    warmup=0,
)
"""One prefill and one decode cell: enough to see a role or a method chosen."""


async def test_prefill_worker_needs_set_mixed_and_is_restored(
    make_worker: WorkerFactory,
) -> None:
    worker = await make_worker(Role.PREFILL, sim_time_scale=1.0)
    with pytest.raises(ProfileError, match="set-mixed"):
        await Profiler(worker.stub, TINY).run()
    samples = await Profiler(worker.stub, TINY, set_mixed=True).run()
    assert [s.kind for s in samples] == ["prefill", "decode"]
    assert worker.service.role is Role.PREFILL


async def test_set_mixed_on_a_worker_that_can_generate_says_nothing_was_switched(
    make_worker: WorkerFactory,
) -> None:
    # the flag did nothing and said nothing on a mixed or decode worker
    worker = await make_worker(Role.DECODE, sim_time_scale=1.0)
    said: list[str] = []
    await Profiler(worker.stub, TINY, set_mixed=True, progress=said.append).run()
    assert "--set-mixed: a decode worker runs Generate already; its role is left as it is" in said
    assert worker.service.role is Role.DECODE


async def test_steps_method_recovers_the_roofline_exactly(make_worker: WorkerFactory) -> None:
    """With the worker's own step samples the cells are the sim engine's priced steps, exactly
    (no gRPC, client or event-loop time in them), and the table built from them is within 3 %
    of the roofline on shapes never probed (what is left is piecewise-linear interpolation)."""
    scale = 0.25
    roofline = RooflineModel(MODELS["llama-2-7b"], HARDWARE["a100-80g"], time_scale=scale)
    worker = await make_worker(Role.MIXED, sim_time_scale=scale, sim_num_kv_blocks=4096)
    profiler = Profiler(worker.stub, dataclasses.replace(GRID, repeats=1), method="steps")
    samples = await profiler.run()
    assert profiler.stats.method == "steps"
    got = cells(samples)
    assert {(c.kind, c.batch_size, c.prompt_tokens) for c in got} == {
        *(("prefill", b, n) for b, n in GRID.prefill_cells()),
        *(("decode", b, c) for b, c in GRID.decode_cells()),
    }
    for m in samples:  # each sample is one reported step: its shape and its price
        assert m.seconds == pytest.approx(roofline.step_s(m.batch), rel=1e-9), m
    for c in got:  # cells: medians over repetitions (decode contexts differ by a token or two)
        assert c.seconds == pytest.approx(roofline.step_s(c.batch), rel=2e-3), c
    table = build_table(samples).model
    for shape in HELD_OUT_SHAPES:
        assert table.step_s(shape) == pytest.approx(roofline.step_s(shape), rel=0.03), shape
    # Every step the worker ran, mixed ones included, is priced by the roofline too.
    assert any(s.batch.prefill_chunks and s.batch.decode_contexts for s in profiler.steps)
    for s in profiler.steps:
        assert s.duration_s == pytest.approx(roofline.step_s(s.batch), rel=1e-9)
    assert profiler.stats.steps_dropped == 0


async def test_auto_falls_back_to_client_timing_without_watch_steps(
    make_worker: WorkerFactory,
) -> None:
    worker = await make_worker(Role.MIXED, sim_time_scale=1.0)
    engine = worker.service.engine
    assert isinstance(engine, SimEngine)
    engine.steps = None  # an engine that cannot report steps: WatchSteps is UNIMPLEMENTED
    with pytest.raises(ProfileError, match="WatchSteps"):
        await Profiler(worker.stub, TINY, method="steps").run()
    profiler = Profiler(worker.stub, TINY)
    samples = await profiler.run()
    assert profiler.stats.method == "outside"
    assert not profiler.steps
    assert [s.kind for s in samples] == ["prefill", "decode"]


def test_grid_respects_the_engine_limits() -> None:
    grid = ProfileGrid(
        prefill_tokens=(64, 4096),
        prefill_batch_sizes=(1, 16),
        decode_batch_sizes=(1, 128),
        decode_contexts=(100, 1010),
        decode_tokens=20,
        max_batch_tokens=2048,
        max_model_len=1024,
        max_num_seqs=64,
    )
    assert grid.prefill_cells() == [(1, 64)]  # 64/16 < 8 tokens; 4096 > the budget
    assert grid.decode_cells() == [(1, 100)]  # 1000 + outputs > max_model_len; 128 > seqs


def test_table_separates_components_of_a_known_additive_model() -> None:
    """Synthetic samples from g(N) + k_pa·W + k_da·S come back as those components."""

    def price(b: BatchShape) -> float:
        n = b.num_new_tokens
        w = sum(k * (ctx + (k + 1) / 2) for k, ctx in b.prefill_chunks)
        return 0.004 + 1e-5 * max(n, 200) + 2e-9 * w + 3e-7 * sum(b.decode_contexts)

    samples = []
    for rep in range(3):
        for total in (128, 512, 2048):
            for bs in (1, 4, 16):
                shape = BatchShape(prefill_chunks=((total // bs, 0),) * bs)
                samples.append(Measurement("prefill", bs, total // bs, rep, shape, price(shape)))
        for bs in (1, 8, 32):
            for c in (128, 1024):
                shape = BatchShape(decode_contexts=(c + 10,) * bs)
                samples.append(Measurement("decode", bs, c, rep, shape, price(shape)))
    fitted = build_table(samples)
    assert fitted.k_prefill_attention == pytest.approx(2e-9, rel=1e-6)
    assert fitted.k_decode_attention == pytest.approx(3e-7, rel=1e-6)
    for shape in (
        BatchShape(prefill_chunks=((1000, 0),)),
        BatchShape(decode_contexts=(500,) * 20),
    ):
        assert fitted.model.step_s(shape) == pytest.approx(price(shape), rel=0.02)
    lines = table_csv(fitted)
    assert parse_profile_csv(lines) == fitted.model


def test_isotonic_pools_violators() -> None:
    assert isotonic([1.0, 3.0, 2.0, 4.0]) == [1.0, 2.5, 2.5, 4.0]
    assert isotonic([5.0, 1.0], [1.0, 3.0]) == [2.0, 2.0]


async def test_rejected_prefill_probes_never_delay_past_the_gates_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A loaded machine makes every probe arrive after the gate's step. Each rejected try gives
    the probes more room, but once the gate cannot grow (here it is at the token budget already)
    the delay before sending them must stay within the gate's step: past it no probe could ever
    be gated, and the delay used to grow by 1.5x per rejection without bound (a CI run's
    `profile` spent minutes per probe)."""
    profiler = Profiler(cast(Any, None), ProfileGrid(max_batch_tokens=2048, max_model_len=4096))

    async def idle() -> None:
        return None

    async def answered_at_once(prompt: Sequence[int], max_tokens: int) -> _Call:
        now = profiler.now()
        return _Call(now, now)  # the gate answers before the probes are sent: always late

    monkeypatch.setattr(profiler, "_wait_idle", idle)
    monkeypatch.setattr(profiler, "_generate", answered_at_once)
    profiler._rtts = [1e-4]
    profiler.stats.rtt_s = 1e-4
    profiler.stats.gate_tokens = 1024
    profiler.stats.gate_step_s = profiler._gate_est_s = 0.004
    profiler._gate_delay_s = 0.001

    for _ in range(3):
        assert await profiler._prefill_probe(1, 128, rep=0) is None
    assert profiler.stats.rejected == 12
    assert profiler.stats.gate_tokens == 2048  # doubled once, then held at the budget
    assert profiler._gate_delay_s <= 0.5 * 0.008  # half the 2048-token gate's step


async def test_a_worker_that_dies_during_a_prefill_probe_leaves_no_task_unretrieved() -> None:
    """The worker killed mid-run: the gate's call failed, the probe calls started beside it
    were never awaited, and after the one-line error asyncio logged 'Task exception was never
    retrieved' with a traceback per probe."""
    import gc

    started: list[int] = []

    class _Gone:
        def Generate(self, *_: Any, **__: Any) -> Any:  # noqa: N802 - the gRPC stub's name
            started.append(1)

            async def fail() -> Any:
                await asyncio.sleep(0.01 * len(started))
                raise ProfileError("the worker refused a probe: UNAVAILABLE: Socket closed")
                yield  # an async generator, as the stub's streaming call

            return fail()

    loop = asyncio.get_running_loop()
    unretrieved: list[dict[str, Any]] = []
    old = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, ctx: unretrieved.append(ctx))
    try:
        prof = Profiler(cast(Any, _Gone()), TINY)
        prof.stats.gate_tokens = 64
        prof._wait_idle = _no_wait  # type: ignore[method-assign]
        with pytest.raises(ProfileError, match="UNAVAILABLE"):
            await prof._prefill_probe(4, 16, 0)
        await asyncio.sleep(0.1)  # the probe calls, had they been left running, end here
        gc.collect()
        await asyncio.sleep(0)
    finally:
        loop.set_exception_handler(old)
    assert len(started) == 5  # the gate and four probes were sent
    assert unretrieved == []


async def _no_wait() -> None:
    return None
