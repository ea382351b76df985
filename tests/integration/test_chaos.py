"""The chaos suite at CI size (issue 12 item 6); `make chaos` runs it at full size.

See tests/integration/chaos.py for what runs and how streams are checked. What must hold here:
no request fails because of a worker fault (SIGKILL or SIGSTOP of a prefill and of a decode
worker), no stream is corrupted (token by token against the fault-free run, allowing the
documented hand-over), `up` restarts every killed process and the pool recovers, and the router
restart behind two replicas fails at most one stream per 200 (0.5 %, at least one at this size).
"""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path

import pytest
from tests.integration.chaos import ChaosConfig, check_stream, run_chaos

from splitserve.policy.batching.tokens import SyntheticTokens

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TOKENS = SyntheticTokens(4096, 16)


def _gen(prompt: list[int], n: int) -> list[int]:
    key = TOKENS.key(prompt, None)
    return [TOKENS.token(key, i) for i in range(n)]


def test_check_stream_accepts_the_documented_handover_and_nothing_else() -> None:
    prompt = [5, 6, 7]
    ref = _gen(prompt, 10)
    assert check_stream(ref, ref, prompt, TOKENS) == (True, [])
    handed = ref[:4] + _gen([*prompt, *ref[:4]], 6)
    assert check_stream(handed, ref, prompt, TOKENS) == (True, [4])
    duplicated = [*ref[:4], ref[3], *_gen([*prompt, *ref[:4]], 5)]
    assert not check_stream(duplicated, ref, prompt, TOKENS)[0]
    lost = ref[:4] + _gen([*prompt, *ref[:5]], 6)  # token 4 never reached the client
    assert not check_stream(lost, ref, prompt, TOKENS)[0]
    assert not check_stream(ref[:-1], ref, prompt, TOKENS)[0]


# ~80 s on a quiet 2-core machine; in `make test` it can run beside the vLLM lane, which keeps
# both cores busy: a clean-clone run hit the suite's 300 s there (alone, three runs: 79-86 s).
# Its own waits are bounded (120 s per request, 120 s per fault's recovery).
@pytest.mark.timeout(900)
def test_chaos_small(tmp_path: Path) -> None:
    cfg = ChaosConfig(
        requests=160,
        concurrency=12,
        max_tokens=32,
        sim_time_scale=2.0,
        stop_s=4.0,
        duration_s=30.0,
        run_dir=tmp_path / "run",
    )
    report = asyncio.run(run_chaos(cfg))
    (tmp_path / "report.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    assert report["reference_failed"] == []
    assert report["failed_worker_faults"] == []
    assert report["corrupted"] == []
    assert len(report["failed_router_restart"]) <= max(1, math.floor(0.005 * cfg.requests))
    for fault in report["faults"]:
        assert fault["recovered_s"] is not None, f"{fault['fault']}: the pool never recovered"
