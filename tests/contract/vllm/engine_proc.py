"""One `VllmEngine` in its own process, driven over a local socket (test helper).

`python engine_proc.py PORT MODEL_DIR NIXL_PORT CPU` serves pickled commands on 127.0.0.1:PORT:
("generate", Request), ("prefill", Request), ("decode", Request, first, KvHandle),
("decode_steps", Request, first, KvHandle), ("decode_counted", Request, first, KvHandle),
("endpoint",), ("warm", endpoint),
("generate_cancel", Request), ("release", RequestId), ("released",), ("load",), ("metrics",),
("decode_grpc", Request, first, KvHandle), ("observed",), ("stop",).
The engine also sits behind the worker's real gRPC service (`WorkerService`: the hooks it wires
into the engine, the worker's own metrics) on a loopback port, with traces going to an in-memory
exporter: `decode_grpc` decodes through that service, `observed` returns the worker's metric
samples and the finished spans.
Each answer is ("ok", value) or ("error", text). Two of these (prefill and decode) exercise P/D
over NIXL between processes, as in production.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import time
from multiprocessing.connection import Client, Connection, Listener
from pathlib import Path
from typing import Any

AUTHKEY = b"splitserve-contract"


def _env(cpu: str) -> None:
    from splitserve.worker.vllm_adapter.engine import local_cpu_env

    for k, v in local_cpu_env(int(cpu)).items():
        os.environ.setdefault(k, v)
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = cpu
    # Early Decodes' inputs prepared ahead (off by default), for the test that pins it.
    os.environ["SPLITSERVE_KV_PREPARE_DECODE"] = "1"


async def _serve(conn: Connection, model_dir: str, nixl_port: int, address: str) -> None:
    import grpc
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from prometheus_client import CollectorRegistry, generate_latest

    from splitserve._gen.v1 import common_pb2, worker_pb2, worker_pb2_grpc
    from splitserve.core.clock import SystemClock
    from splitserve.core.kv import KvHandle
    from splitserve.core.roles import Role
    from splitserve.obs import tracing
    from splitserve.obs.metrics import WorkerMetrics
    from splitserve.worker.server import WorkerIdentity, WorkerService, kv_to_pb
    from splitserve.worker.vllm_adapter.engine import VllmEngine, VllmEngineConfig
    from splitserve.worker.vllm_adapter.metrics_map import read_vllm_metrics

    released: list[str] = []

    async def release_remote(kv: KvHandle) -> None:
        released.append(f"{kv.source_address}/{kv.source_request_id}")

    engine = VllmEngine(
        VllmEngineConfig(
            model=model_dir,
            address=address,
            served_model_name="tiny",
            dtype="float32",  # vLLM's "auto" runs fp32 checkpoints in 16 bits
            max_model_len=1024,
            nixl_side_channel_port=nixl_port,
            kv_pull_in_step=True,  # the path `test_a_multi_block_prompt_...` pins
        ),
        release_remote=release_remote,
    )
    spans = InMemorySpanExporter()
    tracing.configure("worker", exporter=spans)
    worker_registry = CollectorRegistry()
    service = WorkerService(
        engine, Role.MIXED, WorkerIdentity(address, address), WorkerMetrics(worker_registry),
        SystemClock(),
    )  # fmt: skip
    server = grpc.aio.server()
    worker_pb2_grpc.add_WorkerServicer_to_server(service, server)
    grpc_port = server.add_insecure_port("127.0.0.1:0")
    await engine.start()
    await server.start()
    conn.send(("ok", "ready"))
    while True:
        cmd = await asyncio.to_thread(conn.recv)
        op = cmd[0]
        try:
            value: Any
            if op == "generate":
                value = [d async for d in engine.generate(cmd[1])]
            elif op == "prefill":
                value = await engine.prefill(cmd[1])
            elif op == "decode":
                value = [d async for d in engine.decode(cmd[1], cmd[2], cmd[3])]
            elif op == "decode_prepared":  # an early Decode: input prepared, then the KV
                # cmd[1]: the request prepared for; cmd[2:5]: the decode that comes
                before = engine.decodes_prepared
                prepared = engine.prepare_decode(cmd[1])
                deltas = [d async for d in engine.decode(cmd[2], cmd[3], cmd[4])]
                value = (deltas, prepared, engine.decodes_prepared - before)
            elif op == "decode_steps":  # the decode's tokens and the engine steps it took
                assert engine.steps is not None
                sub = engine.steps.subscribe()
                try:
                    deltas = [d async for d in engine.decode(cmd[1], cmd[2], cmd[3])]
                    samples = []
                    with contextlib.suppress(TimeoutError):  # the last ones may still come
                        while True:
                            samples.append(await asyncio.wait_for(sub.get(), 0.5))
                finally:
                    sub.close()
                value = (deltas, [s.batch for s in samples])
            elif op == "decode_counted":  # also: step indices, steps and in-step pulls around
                assert engine.steps is not None
                sub = engine.steps.subscribe()
                steps_before, pulls_before = engine.num_steps, engine.kv_pulls_in_step
                try:
                    deltas = [d async for d in engine.decode(cmd[1], cmd[2], cmd[3])]
                    samples = []
                    with contextlib.suppress(TimeoutError):
                        while True:
                            samples.append(await asyncio.wait_for(sub.get(), 0.5))
                finally:
                    sub.close()
                value = {
                    "deltas": deltas,
                    "shapes": [s.batch for s in samples],
                    "indices": [s.index for s in samples],
                    "steps_before": steps_before,
                    "in_step_pulls": engine.kv_pulls_in_step - pulls_before,
                }
            elif op == "generate_cancel":
                got = []
                async for d in engine.generate(cmd[1]):
                    got.append(d)
                    if len(got) == 1:
                        assert await engine.cancel(cmd[1].id)
                value = (got, engine.in_flight, await engine.cancel(cmd[1].id))
            elif op == "prefill_cancel_late":  # cancelled once vLLM finished it, unread
                # cmd[2] "task": the Prefill call's task is cancelled (the router dropped the
                # call); "cancel": a Cancel comes. Both while vLLM's finished output (KV held
                # for a decode) waits on the loop, which this blocks until the engine thread
                # dispatched it. Then: the vLLM requests and free blocks once settled.
                req, how = cmd[1], cmd[2]
                dispatched = engine.generated_tokens
                task = asyncio.create_task(engine.prefill(req))
                await asyncio.sleep(0)  # the task submits it and waits for its result
                assert req.id in engine._streams
                until = time.monotonic() + 60
                # Blocking the loop on purpose: vLLM finishes it, nobody reads it yet.
                while engine.generated_tokens == dispatched and time.monotonic() < until:
                    time.sleep(0.005)  # noqa: ASYNC251
                time.sleep(0.05)  # noqa: ASYNC251
                if how == "task":
                    task.cancel()
                else:
                    await engine.cancel(req.id)
                ended = await asyncio.gather(task, return_exceptions=True)
                until = time.monotonic() + 10  # well inside vLLM's 30 s lease
                while True:
                    state = await engine.kv_state()
                    mine = [r for r in state["requests"] if r.startswith(f"{req.id}-")]
                    if not mine or time.monotonic() > until:
                        break
                    await asyncio.sleep(0.05)
                value = {
                    "result": repr(ended[0])[:200],
                    "vllm_requests": mine,
                    "free_blocks": state["free_blocks"],
                    "held_here": state["held_here"],
                    "num_kv_held": engine.load().num_kv_held,
                }
            elif op == "endpoint":
                value = engine.kv_endpoint()
            elif op == "warm":
                value = await engine.warm_kv(cmd[1])
            elif op == "warm_read_descs":
                value = (engine.kv_warm_read_descs, engine.kv_warm_read_error)
            elif op == "serve_warmup":  # what KvEndpoint(warm_up_ms) does
                value = engine.serve_kv_warmup(cmd[1])
            elif op == "warmup":  # the serving side's window, and this side's warm-up READs
                w = engine.kv_warmup
                value = {
                    "active": w is not None and w.active,
                    "opened": w.opened if w else 0,
                    "polls": w.polls if w else 0,
                    "warm_notifs": w.warm_notifs if w else 0,
                    "handoffs": w.handoffs if w else 0,
                    "handoffs_ended": w.handoffs_notified + w.handoffs_expired if w else 0,
                    "handoffs_notified": w.handoffs_notified if w else 0,
                    "reads_pending": engine.kv_warm_reads_pending,
                }
            elif op == "release":
                value = await engine.release_kv(cmd[1])
            elif op == "cancel":
                value = await engine.cancel(cmd[1])
            elif op == "kv_state":  # what vLLM holds now (scheduler, block pool, NIXL leases)
                value = await engine.kv_state()
            elif op == "kv_state_settled":  # ... once vLLM id cmd[2] is gone (None: every
                # request), or after cmd[1] engine steps
                start, rid = engine.num_steps, (cmd[2] if len(cmd) > 2 else None)
                while True:
                    value = await engine.kv_state()
                    value["steps"] = engine.num_steps - start
                    gone = rid not in value["requests"] if rid else not value["requests"]
                    if gone or value["steps"] >= cmd[1]:
                        break
                    await asyncio.sleep(0.001)
            elif op == "record_held_pauses":  # from now on, keep the held-KV back-off's pauses
                engine.held_pauses = []
                value = engine._held_poll_s, engine._held_poll_max_s
            elif op == "held_pauses":  # the pauses kept since, and the engine steps so far
                value = list(engine.held_pauses or ()), engine.num_steps
            elif op == "released":
                value = list(released)
            elif op == "load":
                value = engine.load()
            elif op == "metrics":
                registry = CollectorRegistry()
                registry.register(engine.metrics_collector())
                value = {
                    "vllm": [(m.name, dict(m.labels), _value(m)) for m in engine.vllm_metrics()],
                    "mapped": read_vllm_metrics(engine.vllm_metrics()),
                    "exposition": generate_latest(registry).decode(),
                }
            elif op == "decode_grpc":  # through the worker's gRPC service
                req, first, kv = cmd[1], cmd[2], cmd[3]
                async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
                    stub = worker_pb2_grpc.WorkerStub(channel)
                    call = stub.Decode(
                        worker_pb2.DecodeRequest(
                            request_id=str(req.id),
                            prompt_token_ids=list(req.prompt_token_ids),
                            first_token_id=first,
                            sampling=common_pb2.SamplingParams(
                                max_tokens=req.sampling.max_tokens, temperature=0.0
                            ),
                            kv=kv_to_pb(kv),
                        ),
                        timeout=120,
                    )
                    value = [t async for chunk in call for t in chunk.token_ids]
            elif op == "observed":  # the worker's own series and the spans so far
                report = service.load_report()
                value = {
                    "pull_totals": (report.kv_pulled_tokens, report.kv_pull_seconds),
                    "samples": {
                        s.name: s.value
                        for m in worker_registry.collect()
                        for s in m.samples
                        if not s.labels
                    },
                    "spans": [
                        {
                            "name": sp.name,
                            "span_id": sp.context.span_id if sp.context else None,
                            "parent": sp.parent.span_id if sp.parent else None,
                            "attributes": dict(sp.attributes or {}),
                            "events": [e.name for e in sp.events],
                            "seconds": ((sp.end_time or 0) - (sp.start_time or 0)) / 1e9,
                        }
                        for sp in spans.get_finished_spans()
                    ],
                }
            elif op == "stop":
                await server.stop(None)
                await engine.stop()
                conn.send(("ok", None))
                return
            else:
                raise ValueError(f"unknown command {op!r}")
            conn.send(("ok", value))
        except Exception as e:
            conn.send(("error", f"{type(e).__name__}: {e}"))


def _value(metric: Any) -> Any:
    for attr in ("value", "count", "values"):
        if hasattr(metric, attr):
            return getattr(metric, attr)
    return None


def main() -> None:
    port, model_dir, nixl_port, cpu = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
    _env(cpu)
    with Listener(("127.0.0.1", port), authkey=AUTHKEY) as listener, listener.accept() as conn:
        asyncio.run(_serve(conn, model_dir, nixl_port, f"127.0.0.1:{port}"))


def connect(port: int) -> Connection:
    return Client(("127.0.0.1", port), authkey=AUTHKEY)


def free_ports(n: int) -> list[int]:
    """n distinct free ports (all held open while choosing, so none repeats)."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]


def nixl_port() -> int:
    """A free port for an engine's NIXL side channel, from below the kernel's ephemeral range
    (the engine's own pick for port 0, `engine._free_port`). A port from `bind(0)` is released
    before the engine process binds it, and during the engine's start-up another `bind(0)` on
    the machine can be handed it first (seen: the prefill's NIXL listener failed with "Address
    already in use" and every test of the module errored)."""
    from splitserve.worker.vllm_adapter.engine import _free_port

    return _free_port("127.0.0.1")


class EngineProc:
    def __init__(
        self, name: str, model_dir: Path, cpu: int, log_dir: Path, ports: tuple[int, int]
    ) -> None:
        self.name = name
        self.port, self.nixl_port = ports
        self.log = log_dir / f"{name}.log"
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    __file__,
                    str(self.port),
                    str(model_dir),
                    str(self.nixl_port),
                    str(cpu),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self.conn: Connection | None = None

    def connect(self, deadline: float) -> None:
        while self.conn is None:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited: {self.log.read_text()[-3000:]}")
            try:
                self.conn = connect(self.port)
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        if not self.conn.poll(max(1.0, deadline - time.monotonic())):
            raise TimeoutError(f"{self.name} did not start: {self.log.read_text()[-3000:]}")
        status, value = self.conn.recv()
        assert (status, value) == ("ok", "ready"), value

    def call(self, *cmd: Any, timeout_s: float = 120.0) -> Any:
        assert self.conn is not None
        self.conn.send(cmd)
        if not self.conn.poll(timeout_s):
            raise TimeoutError(
                f"{self.name}: no answer to {cmd[0]}: {self.log.read_text()[-3000:]}"
            )
        status, value = self.conn.recv()
        if status != "ok":
            raise RuntimeError(f"{self.name}: {value}")
        return value

    def close(self) -> None:
        try:
            if self.conn is not None and self.proc.poll() is None:
                self.call("stop", timeout_s=30.0)
        except (OSError, EOFError, RuntimeError, TimeoutError):
            pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


if __name__ == "__main__":
    main()
