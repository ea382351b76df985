"""The speed benchmark's harness (issue 4): modes, build detection, module list, and the loop's
garbage-collector setting. No timed assertions: the numbers live in docs/benchmarks.md."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest

from splitserve.sim import bench
from splitserve.sim.engine import Simulator
from splitserve.sim.events import Event, EventKind

TRACE = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.6805900,374,44
2023-11-16 18:15:50.9951690,396,109
2023-11-16 18:15:51.2000000,1200,12
2023-11-16 18:15:51.2500000,50,300
2023-11-16 18:15:52.0000000,2000,5
"""


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    path = tmp_path / "t.csv"
    path.write_text(TRACE)
    return path


def test_suite_interleaves_modes_and_interval_reports_change_only_router_input(
    trace: Path,
) -> None:
    reports = bench.run_suite(trace, 4, None, (0.0, 0.1), repeat=2)
    assert [r.report_interval_s for r in reports] == [0.0, 0.1, 0.0, 0.1]
    assert all(r.num_requests == 5 and r.num_finished == 5 for r in reports)
    assert reports[0].num_events == reports[2].num_events  # deterministic
    assert reports[0].router_mode == "exact"
    assert reports[1].router_mode == "reports every 0.1 s"
    assert all(r.build == bench.build_kind() for r in reports)


def test_run_keeps_its_signature_for_the_cli(trace: Path) -> None:
    report = bench.run(trace, 4, 3)
    assert report.num_requests == 3
    assert report.report_interval_s == 0.0
    assert "requests / CPU s" in report.markdown()


def test_main_prints_one_row_per_mode(trace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bench.main(["--trace", str(trace), "--workers", "4", "--report-interval", "0"])
    bench.main(["--trace", str(trace), "--report-interval", "0", "--report-interval", "0.1"])
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 + 4  # header, rule, row; header, rule, two rows
    assert "reports every 0.1 s" in lines[-1]


def test_compiled_module_list_names_existing_sources(capsys: pytest.CaptureFixture[str]) -> None:
    bench.main(["--print-modules"])
    paths = capsys.readouterr().out.split()
    src = Path(bench.__file__).resolve().parents[2]
    assert len(paths) == len(bench.COMPILED_MODULES)
    assert all((src / p).is_file() for p in paths)


def test_the_test_suite_runs_pure_python() -> None:
    # the mypyc build is only ever put on PYTHONPATH by mk/bench.mk
    assert bench.build_kind() == "pure Python"
    assert bench.compiled_modules() == []


class _Counter:
    def __init__(self) -> None:
        self.thresholds: list[tuple[int, int, int]] = []

    def handle(self, event: Event, sim: Simulator) -> None:
        self.thresholds.append(gc.get_threshold())
        if event.seq < 3:
            sim.schedule(sim.now_s + 1.0, EventKind.WAKE)


def test_run_raises_the_gc_threshold_only_while_it_loops() -> None:
    before = gc.get_threshold()
    sim = Simulator()
    sim.schedule(0.0, EventKind.WAKE)
    world = _Counter()
    assert sim.run(world) == 4
    assert gc.get_threshold() == before
    assert len(world.thresholds) == 4
    assert all(
        inside >= outside
        for t in world.thresholds
        for inside, outside in zip(t, before, strict=True)
    )
    assert world.thresholds[0][0] >= 100_000


def test_run_leaves_automatic_collection_off_when_it_is_off() -> None:
    before = gc.get_threshold()
    gc.set_threshold(0, before[1], before[2])
    try:
        sim = Simulator()
        sim.schedule(0.0, EventKind.WAKE)
        world = _Counter()
        sim.run(world)
        assert world.thresholds[0] == (0, before[1], before[2])
    finally:
        gc.set_threshold(*before)


def test_events_compare_and_hash_by_value() -> None:
    a = Event(1.0, EventKind.ARRIVAL, 3, payload=7)
    b = Event(1.0, EventKind.ARRIVAL, 3, payload=7)
    assert a == b
    assert hash(a) == hash(b)
    assert a != Event(1.0, EventKind.ARRIVAL, 4, payload=7)
    assert a.key == (1.0, 2, 3)
    assert repr(a) == (
        f"Event(time_s=1.0, kind={EventKind.ARRIVAL!r}, seq=3, target=-1, payload=7)"
    )


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        (["--repeat", "0"], "--repeat"),  # was run once
        (["--workers", "1"], "--workers"),  # was run with 2 (the row said 2)
        (["--workers", "10001"], "--workers"),
        (["--report-interval", "-1"], "--report-interval"),  # was the exact mode
        (["--report-interval", "nan"], "--report-interval"),
        (["--max-requests", "0"], "--max-requests"),  # was a traceback: "no rows"
        (["--workers", "x"], "--workers"),
    ],
)
def test_main_refuses_out_of_range_options_naming_them(
    trace: Path, argv: list[str], names: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        bench.main(["--trace", str(trace), *argv])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {names}" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (None, "No such file"),  # the file is missing
        ("", "empty"),
        ("a,b\n1,2\n", "not an Azure LLM trace header"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6,0,5\n", "no requests"),
    ],
)
def test_main_refuses_a_bad_trace_in_one_line(
    tmp_path: Path, text: str | None, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "t.csv"
    if text is not None:
        path.write_text(text)
    with pytest.raises(SystemExit) as exit_:  # each was a traceback
        bench.main(["--trace", str(path), "--max-requests", "5"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "argument --trace" in err
    assert says in err
    assert str(path) in err
    assert "Traceback" not in err
