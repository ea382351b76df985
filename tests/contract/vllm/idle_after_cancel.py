"""Measure (not a test): the prefill worker's CPU while idle, before any request and after a
Prefill ended by a Cancel (the router's cancel; `make bench-kv`'s warm-ups).

`.venv-vllm/bin/python -m tests.contract.vllm.idle_after_cancel [SECONDS] [lost]` starts one
prefill `VllmEngine` (the contract tests' tiny model, NIXL connector) in its own process, reads
its utime + stime from /proc/PID/stat over SECONDS (default 10) idle, then does Prefill + Cancel
and reads it again over SECONDS, and prints both as % of one core with vLLM's KV state after
the cancel. With `lost`: Prefill and no Cancel (a decode worker lost after the prefill: the KV
stays held for vLLM's 30 s lease), SECONDS at most 25. Wall-clock sampling on a shared machine:
compare runs made back to back.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

from splitserve.core.ids import RequestId
from splitserve.core.request import Request, SamplingSpec
from splitserve.worker.vllm_adapter.tiny_model import TinyModelSpec, write_tiny_model

from .engine_proc import EngineProc, free_ports, nixl_port


def cpu_s(pid: int) -> float:
    """utime + stime of every thread of `pid`, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def core_pct(pid: int, seconds: float) -> float:
    c0, t0 = cpu_s(pid), time.monotonic()
    time.sleep(seconds)
    return 100.0 * (cpu_s(pid) - c0) / (time.monotonic() - t0)


def main() -> None:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 10.0
    lost = len(sys.argv) > 2 and sys.argv[2] == "lost"
    with tempfile.TemporaryDirectory() as tmp:
        model, logs = Path(tmp) / "model", Path(tmp) / "logs"
        model.mkdir()
        logs.mkdir()
        write_tiny_model(model, TinyModelSpec())
        prefill = EngineProc("prefill", model, 0, logs, (free_ports(1)[0], nixl_port()))
        try:
            prefill.connect(time.monotonic() + 240.0)
            pid = prefill.proc.pid
            time.sleep(2.0)  # past start-up
            idle = core_pct(pid, seconds)
            request = Request(
                RequestId("drop"),
                (1, *range(10, 300)),
                SamplingSpec(max_tokens=4, temperature=0.0),
                0.0,
            )
            outcome = prefill.call("prefill", request)
            assert outcome.kv is not None
            held = prefill.call("kv_state")
            if not lost:
                assert prefill.call("cancel", RequestId("drop")) is True
            after = core_pct(pid, seconds)
            state = prefill.call("kv_state")
            what = "Prefill, KV held, never read" if lost else "Prefill+Cancel"
            print(f"held before cancel: requests={held['requests']} free={held['free_blocks']}")
            print(f"idle before any request: {idle:.1f} % of a core over {seconds:.0f} s")
            print(f"idle after {what}: {after:.1f} % of a core over {seconds:.0f} s")
            print(
                f"after: requests={state['requests']} free={state['free_blocks']} "
                f"to_send={state['to_send']} has_requests={state['has_requests']}"
            )
        finally:
            prefill.close()


if __name__ == "__main__":
    main()
