"""The router's per-request log: a completed request through the HTTP API is written as one
JSON line that `splitserve sim validate` reads back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from splitserve.core.roles import Role
from splitserve.router.generation import GenerationParams
from splitserve.router.request_log import ENV, RequestLog
from splitserve.router.tokenizer import TextTokenizer
from splitserve.sim.validate import parse_recording
from tests.unit.router.conftest import MODEL, StackFactory, WorkerFactory


async def test_a_completed_request_is_logged(
    make_worker: WorkerFactory,
    make_stack: StackFactory,
    tokenizer: TextTokenizer,
    tmp_path: Path,
) -> None:
    completion = tuple(tokenizer.encode("Hello from the fake worker!"))
    w = await make_worker(Role.MIXED, completion=completion)
    stack = await make_stack(w)
    log = RequestLog(tmp_path / "log" / "run.jsonl")
    stack.generator.request_log = log
    async with stack.client() as client:
        r = await client.post(
            "/v1/completions", json={"model": MODEL, "prompt": "Once upon a time", "max_tokens": 50}
        )
    assert r.status_code == 200, r.text
    log.close()
    [line] = (tmp_path / "log" / "run.jsonl").read_text().splitlines()
    row = json.loads(line)
    assert row["prompt_tokens"] == len(tokenizer.encode("Once upon a time"))
    assert row["output_tokens"] == len(completion)
    assert row["outcome"] == "ok"
    assert 0 <= row["ttft_s"] <= row["latency_s"]
    [rec] = parse_recording([line]).requests
    assert rec.output_tokens == len(completion)


def test_from_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    assert RequestLog.from_env() is None
    monkeypatch.setenv(ENV, str(tmp_path / "x.jsonl"))
    log = RequestLog.from_env()
    assert log is not None
    assert log.path == tmp_path / "x.jsonl"
    log.close()


async def test_a_request_the_client_left_is_logged_as_cancelled(
    make_worker: WorkerFactory,
    make_stack: StackFactory,
    tokenizer: TextTokenizer,
    tmp_path: Path,
) -> None:
    """A client that leaves mid-answer loaded the workers until then: its line says
    `cancelled` and how many tokens were made (it was not written at all)."""
    completion = tuple(tokenizer.encode("one two three four five six seven eight nine ten"))
    w = await make_worker(Role.MIXED, completion=completion, token_delay_s=0.05)
    stack = await make_stack(w)
    log = RequestLog(tmp_path / "run.jsonl")
    stack.generator.request_log = log
    request = stack.generator.build_request(
        "left", tokenizer.encode("Once upon a time"), GenerationParams(max_tokens=50)
    )
    chunks = stack.generator.stream(request)
    got = 0
    async for chunk in chunks:
        got += len(chunk.token_ids)
        if got >= 2:
            break
    await chunks.aclose()
    log.close()
    [row] = [json.loads(x) for x in (tmp_path / "run.jsonl").read_text().splitlines()]
    assert row["outcome"] == "cancelled"
    assert 2 <= row["output_tokens"] < len(completion)
    assert row["ttft_s"] is not None
    assert row["ttft_s"] <= row["latency_s"]
    ok = {**row, "id": "ok", "outcome": "ok", "output_tokens": 1, "tpot_s": None}
    rec = parse_recording([json.dumps(row), json.dumps(ok)])
    assert [r.id for r in rec.requests] == ["ok"]
    assert [(r.id, r.output_tokens) for r in rec.load_only] == [("left", row["output_tokens"])]


async def test_a_failed_request_is_logged_with_its_outcome(
    make_worker: WorkerFactory,
    make_stack: StackFactory,
    tokenizer: TextTokenizer,
    tmp_path: Path,
) -> None:
    completion = tuple(tokenizer.encode("one two three four five six seven eight nine ten"))
    w = await make_worker(Role.MIXED, completion=completion, fail_after_tokens=3)
    stack = await make_stack(w)
    log = RequestLog(tmp_path / "run.jsonl")
    stack.generator.request_log = log
    async with stack.client() as client:
        r = await client.post(
            "/v1/completions",
            json={"model": MODEL, "prompt": "Once upon a time", "max_tokens": 50, "stream": True},
        )
        assert r.status_code == 200
    log.close()
    [row] = [json.loads(x) for x in (tmp_path / "run.jsonl").read_text().splitlines()]
    assert row["outcome"] == "error"
    assert row["output_tokens"] == 3
