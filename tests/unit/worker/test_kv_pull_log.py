"""The decode worker's per-pull log (`SPLITSERVE_KV_PULL_LOG`, `worker.kv_pull_log`) over a real
P/D hand-off between two in-process workers: one line per pull, with when the Decode arrived,
the pull's start and end on the worker's clock (in that order) and its bytes; the prefill
worker writes nothing; the log is read back by `sim validate`'s parser."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from splitserve._gen.v1 import worker_pb2
from splitserve.core.roles import Role
from splitserve.sim.validate_steps import parse_kv_pulls
from splitserve.worker.kv_pull_log import ENV, KvPullLog
from tests.unit.worker.conftest import WorkerFactory
from tests.unit.worker.test_server import PROMPT, collect, sampling


def test_from_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    assert KvPullLog.from_env() is None
    monkeypatch.setenv(ENV, str(tmp_path / "sub" / "p.jsonl"))
    log = KvPullLog.from_env()
    assert log is not None
    assert log.path == tmp_path / "sub" / "p.jsonl"
    log.close()
    log.record("a", None, 1.0, 0.5, 1)  # closed: nothing written, no error
    assert (tmp_path / "sub" / "p.jsonl").read_text() == ""


async def test_decode_worker_logs_each_pull(make_worker: WorkerFactory, tmp_path: Path) -> None:
    p = await make_worker(Role.PREFILL)
    d = await make_worker(Role.DECODE)
    path = tmp_path / "kv_pulls.jsonl"
    p.service.pull_log = KvPullLog(path)
    d.service.pull_log = KvPullLog(path)
    pre = await p.stub.Prefill(
        worker_pb2.PrefillRequest(request_id="a", prompt_token_ids=PROMPT, sampling=sampling())
    )
    before = time.monotonic()
    await collect(
        d.stub.Decode(
            worker_pb2.DecodeRequest(
                request_id="a",
                prompt_token_ids=PROMPT,
                first_token_id=pre.first_token_id,
                sampling=sampling(),
                kv=pre.kv,
            )
        )
    )
    after = time.monotonic()
    lines = path.read_text().splitlines()
    assert len(lines) == 1
    assert json.loads(lines[0])["bytes"] == pre.kv.num_bytes
    pull = parse_kv_pulls(lines)["a"]
    assert pull.received_s is not None
    assert before <= pull.received_s <= pull.start_s <= pull.end_s <= after
    assert d.service._decode_received == {}  # forgotten once the Decode ended


async def test_load_reports_carry_the_pull_totals(make_worker: WorkerFactory) -> None:
    """`LoadReport.kv_pulled_tokens` / `kv_pull_seconds` (what a router fits a decode worker's
    pull rate from) grow by each pull's prompt tokens and time; the prefill worker's stay 0."""
    p = await make_worker(Role.PREFILL)
    d = await make_worker(Role.DECODE)
    assert (d.service.load_report().kv_pulled_tokens, d.service.load_report().kv_pull_seconds) == (
        0,
        0.0,
    )
    for rid in ("a", "b"):
        pre = await p.stub.Prefill(
            worker_pb2.PrefillRequest(request_id=rid, prompt_token_ids=PROMPT, sampling=sampling())
        )
        await collect(
            d.stub.Decode(
                worker_pb2.DecodeRequest(
                    request_id=rid,
                    prompt_token_ids=PROMPT,
                    first_token_id=pre.first_token_id,
                    sampling=sampling(),
                    kv=pre.kv,
                )
            )
        )
    report = d.service.load_report()
    assert report.kv_pulled_tokens == 2 * len(PROMPT)
    assert report.kv_pull_seconds > 0
    assert p.service.load_report().kv_pulled_tokens == 0
    assert d.service._pull_tokens == {}  # forgotten once each Decode ended
    # A pull reported after its Decode ended: its tokens from its bytes at the engine's KV
    # bytes per token.
    per_token = getattr(d.service.engine, "kv_bytes_per_token", 0)
    assert per_token > 0
    d.service.kv_pulled("late", 10 * per_token, 0.5)
    assert d.service.load_report().kv_pulled_tokens == 2 * len(PROMPT) + 10
