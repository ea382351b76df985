"""Stopping `splitserve up` drains: a stream in flight when `up` gets SIGTERM finishes whole.

Before: `up` sent SIGTERM to the router and the workers at once; the workers stopped under the
draining router and every stream in flight ended with "no decode worker could finish"
(found by a new-user probe, 2026-11-27). Now the router is stopped first and waited for
(docs/reliability.md: it drains), then the workers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import openai
import pytest
from tests.integration.processes import up_ready

pytestmark = pytest.mark.integration


def test_a_stream_in_flight_finishes_when_up_is_stopped(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    env = dict(os.environ, SPLITSERVE_CACHE_DIR=str(tmp_path / "cache"))
    argv = [
        sys.executable, "-m", "splitserve", "up",
        "--prefill", "1", "--decode", "1", "--port", "0", "--grpc-port", "0",
        "--run-dir", str(run_dir), "--log-level", "WARNING",
    ]  # fmt: skip
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    try:
        up_ready(proc, run_dir)
        assert proc.stdout is not None
        for line in proc.stdout:  # up has seen every process ready: it is serving, not starting
            if line.startswith("press Ctrl-C to stop"):
                break
        port = json.loads((run_dir / "router.ready.json").read_text())["port"]
        client = openai.OpenAI(
            base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=60
        )
        first = threading.Event()
        got: dict[str, object] = {"tokens": 0, "finish": None, "error": None}

        def read() -> None:
            try:
                stream = client.completions.create(
                    model="splitserve-sim",
                    prompt="a story " * 20,
                    max_tokens=200,  # ~12 ms per simulated decode step: seconds of streaming
                    stream=True,
                    extra_body={"ignore_eos": True},
                )
                for chunk in stream:
                    first.set()
                    if chunk.choices and chunk.choices[0].text:
                        got["tokens"] = int(str(got["tokens"])) + 1
                    if chunk.choices and chunk.choices[0].finish_reason:
                        got["finish"] = chunk.choices[0].finish_reason
            except Exception as err:  # the assertion below reports it
                got["error"] = err
            finally:
                first.set()

        reader = threading.Thread(target=read)
        reader.start()
        assert first.wait(60)
        proc.send_signal(signal.SIGTERM)
        reader.join(90)
        assert got["error"] is None, got["error"]
        assert got["finish"] == "length"
        code = proc.wait(timeout=60)
        assert code == 0, proc.stdout.read() if proc.stdout else code
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie not yet reaped still answers kill(0)
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def test_sigterm_as_soon_as_the_router_is_ready_stops_up_itself(tmp_path: Path) -> None:
    """Before: `up` installed its SIGTERM handler only after printing its endpoint, so a
    SIGTERM in that window killed it outright (exit -15) and its children all at once (the
    drain test above failed that way under load)."""
    run_dir = tmp_path / "run"
    env = dict(os.environ, SPLITSERVE_CACHE_DIR=str(tmp_path / "cache"))
    argv = [
        sys.executable, "-m", "splitserve", "up", "--prefill", "0", "--decode", "1",
        "--port", "0", "--grpc-port", "0", "--run-dir", str(run_dir), "--log-level", "WARNING",
    ]  # fmt: skip
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    try:
        ready = run_dir / "router.ready.json"
        deadline = time.monotonic() + 120
        while not ready.exists():
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            assert time.monotonic() < deadline
            time.sleep(0.001)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
        assert code >= 0, f"up was killed by signal {-code}"  # 0, or 1 if still starting
        pids = [json.loads(p.read_text())["pid"] for p in run_dir.glob("*.ready.json")]
        assert pids
        assert not [pid for pid in pids if _alive(pid)]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
