"""`make bench-router` / `bench-router-streams` options (`BENCH_ROUTER_ARGS`,
`BENCH_STREAMS_ARGS`) and their processes: a bad value is a one-line usage error before anything
starts, and the processes a bench starts die with it, even when it is killed outright.

Each command runs in a child whose first start of a process (`run.start_workers`, `streams.run`)
exits 7, so a value that was not refused shows as exit 7 and nothing is started either way."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.bench_router import run
from tests.bench_router.layout import Budget, Layout

REPO = Path(__file__).resolve().parents[2]

GUARD = """
import sys
from tests.bench_router import run, streams
def started(*a, **k):
    sys.exit(7)
run.start_workers = started
streams.run = started
sys.argv = [{module!r}, *sys.argv[1:]]
from tests.bench_router import {module} as m
m.main()
"""


def _bench(module: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}
    return subprocess.run(
        [sys.executable, "-c", GUARD.format(module=module), *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--rates", "0"], "--rates"),  # ran as a row of nan
        (["--rates", "100", "-50"], "--rates"),
        (["--prompt-tokens", "0"], "--prompt-tokens"),
        (["--sat-s", "0"], "--sat-s"),
        (["--budget-s", "nan"], "--budget-s"),  # skipped every part
        (["--slow-streams", "-1"], "--slow-streams"),
        (["--flame-format", "svg"], "--flame-format"),  # py-spy failed unseen: no flame graph
        # options for a part that is not run were ignored
        (["--scale-only"], "--scale-only"),  # without --scale: measured nothing
        (["--sat-s", "5"], "--sat-s"),  # without --scale
        (["--flame-format", "raw"], "--flame-format"),  # without --py-spy
    ],
)
def test_bench_router_refuses_bad_values(args: list[str], flag: str, tmp_path: Path) -> None:
    done = _bench("run", "--out", str(tmp_path / "r.md"), *args)
    assert done.returncode == 2, done.stdout + done.stderr
    last = done.stderr.splitlines()[-1]
    assert f"error: argument {flag}" in last or f"error: {flag}:" in last


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--rounds", "0"], "--rounds"),  # ran no round
        (["--concurrency", "0"], "--concurrency"),
        (["--count", "-1"], "--count"),
        (["--b-backend", "fake"], "--b-backend"),  # without --own-workers: sim, silently
        (["--a-env", "X=1"], "--a-env"),  # without --a-src: no router A
        (["--c-arg=--link"], "--c-arg"),  # without --c-src: no router C
        (["--a-src", "", "--a-env", "NOEQUALS"], "--a-env"),  # set NOEQUALS to ""
        (["--a-src", "", "--spy-a"], "--spy-a"),  # without --py-spy
        (["--low-count", "10"], "--low-count"),  # at the default concurrency 32
    ],
)
def test_bench_router_ab_refuses_bad_and_ignored_options(args: list[str], flag: str) -> None:
    done = _bench("ab", *args)
    assert done.returncode == 2, done.stdout + done.stderr
    last = done.stderr.splitlines()[-1]
    assert f"error: argument {flag}" in last or f"error: {flag}:" in last


class _StartedError(Exception):
    pass


class _Procs:
    """Records what `_scale_run` starts, and stops it there."""

    def __init__(self) -> None:
        self.env: dict[str, str] | None = None

    def spawn(
        self, name: str, args: list[str], core: object, env: dict[str, str] | None = None
    ) -> None:
        self.env = env
        raise _StartedError


def test_the_scale_out_runs_the_router_src_tree(tmp_path: Path) -> None:
    # `--router-src OLD --scale 1 2` measured this tree's router in the scale-out figure (only
    # the per-router rows ran OLD's): a before / after comparison compared a tree with itself
    procs = _Procs()
    env = {"PYTHONPATH": "/old/src"}
    layout = Layout((0,), (1,), (1,))
    with pytest.raises(_StartedError):
        run.scaling(procs, tmp_path, ["127.0.0.1:1"], tmp_path, "hi", layout, [1], 1.0,  # type: ignore[arg-type]
                    Budget(None, time.monotonic), env)  # fmt: skip
    assert procs.env == env


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="the streams bench needs 2 cores")
@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--count", "0"], "--count"),
        (["--ramp-per-s", "0"], "--ramp-per-s"),  # a ZeroDivisionError
        (["--interval-s", "-1"], "--interval-s"),
    ],
)
def test_bench_router_streams_refuses_bad_values(
    args: list[str], flag: str, tmp_path: Path
) -> None:
    done = _bench("streams", "--out", str(tmp_path / "s.md"), *args)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"error: argument {flag}" in done.stderr.splitlines()[-1]


SPAWN = """
import sys, time
from pathlib import Path
from tests.bench_router.run import Procs
procs = Procs(Path(sys.argv[1]))
child = procs.spawn("sleeper", [sys.executable, "-c", "import time; time.sleep(120)"], 0)
print(child.pid, flush=True)
time.sleep(120)
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_a_bench_killed_outright_takes_its_processes_with_it(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}
    bench = subprocess.Popen(
        [sys.executable, "-c", SPAWN, str(tmp_path)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert bench.stdout is not None
    child = int(bench.stdout.readline())
    try:
        bench.kill()
        bench.wait()
        deadline = time.monotonic() + 10
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(child), "a process of the bench outlived it"
    finally:
        if _alive(child):
            os.kill(child, signal.SIGKILL)


@pytest.mark.parametrize("wait", ["http", "file"])
def test_a_process_that_fails_to_start_is_named_with_its_log(tmp_path: Path, wait: str) -> None:
    # the message said "(see logs)" / "(see the logs beside it)": the run's temporary directory
    # was printed nowhere
    procs = run.Procs(tmp_path)
    boom = [sys.executable, "-c", "import sys; print('no such model'); sys.exit(3)"]
    proc = procs.spawn("worker-0", boom, 0)
    try:

        def started() -> None:
            if wait == "http":
                run._wait_http(run._free_port(), proc=proc, timeout_s=20)
            else:
                run._wait_file(tmp_path / "worker-0.json", proc, timeout_s=20)

        with pytest.raises(SystemExit) as exit_:
            started()
        message = str(exit_.value)
        assert "exited with 3" in message
        assert str(tmp_path / "worker-0.log") in message
        assert "no such model" in (tmp_path / "worker-0.log").read_text()
    finally:
        procs.stop()
