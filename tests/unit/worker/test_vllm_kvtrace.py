"""`kvtrace`: the token 1 -> token 2 timestamps of a P/D decode (`make bench-kv --trace`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from splitserve.worker.vllm_adapter import kvtrace
from splitserve.worker.vllm_adapter.kvtrace import KvTrace


@dataclass
class _Meta:
    reqs_to_recv: dict[str, Any]


@dataclass
class _Results:
    finished_recving: set[str] = field(default_factory=set)


class _Agent:
    """The NIXL agent calls the trace times inside `start_load_kv`."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def make_prepped_xfer(self, *_: Any, notif_msg: bytes = b"") -> str:
        self.calls.append("prep")
        return "handle"

    def transfer(self, handle: str) -> str:
        self.calls.append("transfer")
        return "PROC"

    def check_xfer_state(self, handle: str) -> str:
        """In progress at the first check after the post, done at the second."""
        self.calls.append("check")
        return "DONE" if self.calls.count("check") >= 2 else "PROC"

    def get_xfer_telemetry(self, handle: str) -> Any:
        self.calls.append("telemetry")
        return _Telemetry()


@dataclass
class _Telemetry:
    """NIXL's per-transfer telemetry (microseconds)."""

    xferDuration: int = 7_000  # noqa: N815 (NIXL's names)
    postDuration: int = 6_000  # noqa: N815
    descCount: int = 3  # noqa: N815


class _Worker:
    """The two NIXL worker methods the trace wraps, and the agent it times."""

    def __init__(self) -> None:
        self.posted: list[str] = []
        self.done: set[str] = set()
        self.handles: list[str] = []
        self.nixl_wrapper = _Agent()

    def start_load_kv(self, metadata: _Meta) -> None:
        self.posted.extend(metadata.reqs_to_recv)
        # vLLM's descriptor ids: the decode's blocks 4, 5, 9 and the prefill's 0, 1, 2.
        handle = self.nixl_wrapper.make_prepped_xfer(
            "READ", "local", [4, 5, 9], "remote", [0, 1, 2], notif_msg=b"r:1"
        )
        self.nixl_wrapper.transfer(handle)
        self.handles.append(handle)

    def get_transfer_results(self) -> _Results:
        """vLLM's `get_finished`: checks each READ once, reads a finished one's telemetry."""
        for handle in list(self.handles):
            if self.nixl_wrapper.check_xfer_state(handle) == "DONE":
                self.nixl_wrapper.get_xfer_telemetry(handle)
                self.handles.remove(handle)
        done, self.done = self.done, set()
        return _Results(done)


class _Executor:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def execute_model(self, *_: Any) -> None:
        self.calls.append("execute")

    def sample_tokens(self, *_: Any) -> None:
        self.calls.append("sample")


class _Core:
    """The engine core's `step_fn`: one engine-core step (here: the worker's result check)."""

    def __init__(self, worker: _Worker) -> None:
        self.worker = worker
        self.steps = 0

    def step_fn(self) -> tuple[dict[int, Any], bool]:
        self.steps += 1
        self.worker.get_transfer_results()
        return {}, False


def test_off_without_the_variable() -> None:
    assert KvTrace.from_env({}) is None
    assert KvTrace.from_env({kvtrace.TRACE_ENV: ""}) is None


def test_one_async_decode_end_to_end(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    trace = KvTrace.from_env({kvtrace.TRACE_ENV: str(path)})
    assert trace is not None
    worker = _Worker()
    trace.install(worker)
    executor = _Executor()
    trace.install_executor(executor)
    core = _Core(worker)
    trace.install_core(core)
    client = KvTrace(path)  # the bench client appends to the same file
    client.mark("r", "token1", 1.0)
    trace.received("r")
    trace.begin("r")
    trace.picked("r")
    trace.picked("untraced")  # not a traced decode: no event
    trace.added("r", "r-internal")
    trace.scheduled()
    trace.scheduled()  # seen once
    trace.step_started()
    worker.start_load_kv(_Meta({"r-internal": object(), "untraced": object()}))
    worker.get_transfer_results()  # the READ still in progress at this step's check
    worker.done = {"r-internal", "untraced"}
    core.step_fn()  # done at the next check, the engine core's step
    trace.step_ended()  # step 1: only moved KV
    trace.step_started()
    trace.scheduled()
    executor.execute_model()
    executor.sample_tokens()
    trace.step_ended()  # step 2: token 2
    trace.dispatched("r")
    trace.step_started()
    trace.step_ended()  # after token 2: not this decode's any more
    trace.mark("r", "yield")
    client.mark("r", "token2", 1e9)
    trace.close()
    client.close()
    # A NIXL call outside start_load_kv (the warm-up READ) passes untimed.
    worker.nixl_wrapper.make_prepped_xfer("READ", notif_msg=b"HB:")
    assert worker.posted == ["r-internal", "untraced"]  # the wrapped methods still ran
    assert worker.nixl_wrapper.calls == [
        "prep", "transfer", "check", "check", "telemetry", "prep"
    ]  # fmt: skip
    assert executor.calls == ["execute", "sample"]
    assert core.steps == 1  # the wrapped step ran

    events = kvtrace.load(path)
    assert set(events) == {"r"}
    names = [n for n, _ in events["r"]]
    assert names.count("seen") == 1
    assert names.count("prep") == 1  # the warm-up READ's call was not marked
    assert names.count("step_start") == 2
    assert names.count("xfer_seen") == 1
    assert names.count("recv_core_end") == names.count("recv_step_end") == 1
    # What vLLM's READ time is made of: its telemetry, the checks before it was seen done,
    # the descriptors' runs on either side.
    assert kvtrace.value(events["r"], "tel_xfer") == pytest.approx(0.007)
    assert kvtrace.value(events["r"], "tel_post") == pytest.approx(0.006)
    assert kvtrace.value(events["r"], "tel_descs") == 3
    assert kvtrace.value(events["r"], "xfer_checks") == 1
    assert kvtrace.value(events["r"], "local_runs") == 2
    assert kvtrace.value(events["r"], "remote_runs") == 1
    assert kvtrace.value(events["r"], "missing") is None
    m = kvtrace.milestones(events["r"])
    assert m["steps"] == 2
    second_step = [t for n, t in events["r"] if n == "step_start"][1]
    assert m["step2_start"] == second_step
    assert m["step2_start"] < m["step2_sched"] < m["step2_fwd_start"] < m["step2_fwd_end"]
    for a, b in zip(kvtrace.MILESTONES, kvtrace.MILESTONES[1:], strict=False):
        assert m[a[0]] <= m[b[0]], (a[0], b[0])
    table = kvtrace.breakdown([m])
    assert [(a, b) for a, b, _, _ in table] == list(
        zip(
            [n for n, _ in kvtrace.MILESTONES],
            [n for n, _ in kvtrace.MILESTONES[1:]],
            strict=False,
        )
    )
    # The intervals add up to the whole gap.
    assert sum(x for _, _, x, _ in table) == pytest.approx(m["token2"] - m["token1"])


def test_breakdown_skips_missing_milestones() -> None:
    in_step = {"token1": 0.0, "call": 1.0, "post": 3.0, "token2": 10.0}
    async_ = {"token1": 0.0, "call": 2.0, "post": 3.0, "recv_done": 5.0, "token2": 12.0}
    table = {(a, b): (x, n) for a, b, x, n in kvtrace.breakdown([in_step, async_])}
    assert table[("token1", "call")] == (1.5, 2)
    assert table[("post", "token2")] == (7.0, 1)
    assert table[("post", "recv_done")] == (2.0, 1)
    assert table[("recv_done", "token2")] == (7.0, 1)


class _CopyingAgent(_Agent):
    """`transfer()` does its work on the calling thread, as UCX's `cma` copy does."""

    def transfer(self, handle: str) -> str:
        self.calls.append("transfer")
        sum(range(200_000))
        return "DONE"


def test_the_cpu_spent_inside_transfer_is_recorded_beside_its_wall_time(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    trace = KvTrace(path)
    worker = _Worker()
    worker.nixl_wrapper = _CopyingAgent()
    trace.install(worker)
    trace.begin("r")
    trace.added("r", "r-internal")
    worker.start_load_kv(_Meta({"r-internal": object()}))
    trace.close()
    events = kvtrace.load(path)["r"]
    cpu = kvtrace.cpu_seconds(events)
    assert cpu is not None
    assert cpu > 0
    m = kvtrace.milestones(events)
    assert cpu <= (m["transferred"] - m["transfer"]) * 1.01 + 1e-4  # CPU within the wall time
    assert "transferred_cpu" not in m  # a duration, not a milestone
    assert kvtrace.cpu_seconds(events, "prepped") is not None
    assert kvtrace.cpu_seconds([("transfer", 1.0)]) is None
