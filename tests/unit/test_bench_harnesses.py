"""The benchmark targets as users run them (`make bench`, `make bench-kv`, `make
bench-operator-idle`): a failed run ends make with its status and its error on screen, and a bad
option is a one-line usage error before anything starts. Each make target runs in a copy of the
Makefile and mk/ with a stand-in venv (a `python` that runs this interpreter), so nothing is
built or installed and the repository's out/ is not written."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs GNU make")


def _tree(tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the Makefile and mk/ whose venv stamps are up to date: (tree, venv)."""
    tree = tmp_path / "tree"
    (tree / "constraints").mkdir(parents=True)
    shutil.copy(REPO / "Makefile", tree)
    shutil.copytree(REPO / "mk", tree / "mk")
    (tree / "e2e").symlink_to(REPO / "e2e")
    for name in ("pyproject.toml", "constraints/cpu.txt"):
        (tree / name).write_text("")
        os.utime(tree / name, (0, 0))  # older than the stamps: nothing to (re)install
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)
    (venv / ".installed").touch()
    return tree, venv


def _make(tree: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    return subprocess.run(
        ["make", "-s", "--no-print-directory", "-C", str(tree), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_make_bench_fails_when_the_benchmark_fails(tmp_path: Path) -> None:
    # `bench-pure | tee out/bench-sim.md` returned tee's 0: make said nothing had failed
    tree, venv = _tree(tmp_path)
    done = _make(tree, "bench", f"VENV={venv}", "CC=/nonexistent", "BENCH_ARGS=--workers x")
    assert done.returncode != 0, done.stdout + done.stderr
    assert "argument --workers" in done.stderr


def test_make_bench_kv_fails_when_the_benchmark_fails(tmp_path: Path) -> None:
    # the same `| tee` (out/bench-kv.md): a bad KVBENCH_ARGS or a missing vLLM ended with 0
    tree, venv = _tree(tmp_path)
    done = _make(tree, "bench-kv", f"KVBENCH_VENV={venv}", "KVBENCH_ARGS=--no-such-option")
    assert done.returncode != 0, done.stdout + done.stderr


def test_make_bench_operator_idle_shows_its_usage_error(tmp_path: Path) -> None:
    # the recipe sent stderr to /dev/null: a bad option ended make with "Error 2" and no word
    tree, venv = _tree(tmp_path)
    done = _make(tree, "bench-operator-idle", f"VENV={venv}", "OPERATOR_BENCH_ARGS=--window x")
    assert done.returncode != 0
    assert "argument --window" in done.stderr


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--services", "0"], "--services"),  # a ZeroDivisionError after settling
        (["--window", "0"], "--window"),  # the same
        (["--window", "-5"], "--window"),  # negative requests / min (-5.5: a ValueError)
        (["--window", "nan"], "--window"),
        (["--interval", "0"], "--interval"),
        (["--settle-timeout", "-1"], "--settle-timeout"),
    ],
)
def test_operator_idle_refuses_bad_values_before_starting(argv: list[str], flag: str) -> None:
    # --settle-timeout 1: the old code ran (kmock and the operator) and printed an
    # "unsettled" row instead of refusing
    done = subprocess.run(
        [sys.executable, str(REPO / "e2e" / "operator_idle.py"), "--settle-timeout", "1",
         "--services", "1", *argv],
        env={**os.environ, "PYTHONPATH": str(REPO / "src")},
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"argument {flag}" in done.stderr
    assert "Traceback" not in done.stderr
    assert "services" not in done.stdout


def _operator_idle() -> ModuleType:
    spec = importlib.util.spec_from_file_location("operator_idle", REPO / "e2e/operator_idle.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_operator_idle_counts_a_put_as_a_write() -> None:
    # the settle wait counted PUT as a write, the window's "writes / min" did not
    idle = _operator_idle()
    calls = [SimpleNamespace(method=m, params={}) for m in ("GET", "PUT", "PATCH")]
    row = idle.summary(calls, 1, 60.0)
    assert row["writes_per_min"] == 2.0
    assert row["requests_per_min"] == 3.0


def test_make_bench_slo_builds_the_venv_on_a_fresh_checkout(tmp_path: Path) -> None:
    # bench-slo alone had no $(STAMP) prerequisite: on a fresh checkout it ran
    # .venv/bin/python, which did not exist yet (every other bench target builds it first)
    tree, _ = _tree(tmp_path)
    fresh = tmp_path / "fresh-venv"
    done = _make(tree, "-n", "bench-slo", f"VENV={fresh}")
    assert done.returncode == 0, done.stderr
    commands = done.stdout.splitlines()
    builds = [i for i, c in enumerate(commands) if f"-m venv {fresh}" in c]
    runs = [i for i, c in enumerate(commands) if "splitserve.cli.bench_slo" in c]
    assert builds, done.stdout
    assert runs, done.stdout
    assert builds[0] < runs[0]
