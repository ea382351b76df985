"""Measure NIXL (UCX) READ time between two processes on one GPU machine, by size and memory kind.

Usage (torch with CUDA and the `nixl` package importable):
    python tools/measure_nixl_gpu.py OUT.csv [--reps N] [--max-mib M]

As a decode worker pulls a prefill worker's KV: the target process registers a buffer in GPU
memory (VRAM) and one in pinned host memory (DRAM) and hands its agent metadata and addresses
to the initiator over a pipe; the initiator READs the first `size` bytes of a remote buffer into
its own registered buffer, `reps` times per size and pair of kinds (one descriptor per
transfer), and takes the median from `initialize_xfer` to DONE (the first transfer of each size
warms the path and is dropped). The data is checked byte for byte once per size. Both processes
use GPU 0, so VRAM -> VRAM is an inter-process copy inside one GPU (UCX cuda_ipc), not NVLink
between two GPUs. Writes `src_kind,dst_kind,bytes,seconds` rows.
"""

from __future__ import annotations

import csv
import multiprocessing as mp
import statistics
import sys
import time
from multiprocessing.connection import Connection
from pathlib import Path

KINDS = ("VRAM", "DRAM")


def _agent(name: str):  # type: ignore[no-untyped-def]
    from nixl._api import nixl_agent, nixl_agent_config

    return nixl_agent(name, nixl_agent_config(backends=["UCX"]))


def _buffers(nbytes: int, fill: bool):  # type: ignore[no-untyped-def]
    import torch

    pattern = (torch.arange(nbytes, dtype=torch.int64) % 251).to(torch.uint8)
    dram = pattern.clone() if fill else torch.zeros(nbytes, dtype=torch.uint8)
    if not torch.cuda.is_available():  # a smoke test of the script on a CPU machine
        return {"DRAM": dram}, pattern
    dram = dram.pin_memory()
    vram = dram.to("cuda:0") if fill else torch.zeros(nbytes, dtype=torch.uint8, device="cuda:0")
    torch.cuda.synchronize()
    return {"VRAM": vram, "DRAM": dram}, pattern


def _register(agent, bufs) -> dict[str, int]:  # type: ignore[no-untyped-def]
    addrs = {}
    for kind, t in bufs.items():
        dev = 0
        agent.register_memory([(t.data_ptr(), t.numel(), dev, "")], kind)
        addrs[kind] = t.data_ptr()
    return addrs


def target(conn: Connection, nbytes: int) -> None:
    agent = _agent("target")
    bufs, _ = _buffers(nbytes, fill=True)
    addrs = _register(agent, bufs)  # before the metadata, which carries the registrations
    conn.send((agent.get_agent_metadata(), addrs))
    conn.recv()  # "done"
    conn.close()


def initiator(conn: Connection, nbytes: int, reps: int) -> list[tuple[str, str, int, float]]:
    import torch

    agent = _agent("initiator")
    bufs, pattern = _buffers(nbytes, fill=False)
    local_addrs = _register(agent, bufs)
    meta, remote_addrs = conn.recv()
    peer = agent.add_remote_agent(meta)
    sizes = [4096 << i for i in range(nbytes.bit_length()) if 4096 << i <= nbytes]
    out = []
    kinds = [k for k in KINDS if k in bufs]
    for src in kinds:
        for dst in kinds:
            for size in sizes:
                local = agent.get_xfer_descs([(local_addrs[dst], size, 0)], dst)
                remote = agent.get_xfer_descs([(remote_addrs[src], size, 0)], src)
                bufs[dst][:size].zero_()
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
                times = []
                for _ in range(reps + 1):
                    t0 = time.perf_counter()
                    handle = agent.initialize_xfer("READ", local, remote, peer, b"")
                    state = agent.transfer(handle)
                    while state not in ("DONE", "ERR"):
                        state = agent.check_xfer_state(handle)
                    dt = time.perf_counter() - t0
                    agent.release_xfer_handle(handle)
                    if state == "ERR":
                        raise RuntimeError(f"NIXL {src}->{dst} READ of {size} bytes failed")
                    times.append(dt)
                got = bufs[dst][:size].cpu()
                if not torch.equal(got, pattern[:size]):
                    raise RuntimeError(f"data mismatch after a {src}->{dst} {size}-byte READ")
                out.append((src, dst, size, statistics.median(times[1:])))
                print(f"{src}->{dst} {size:>11} B {out[-1][3] * 1e3:9.4f} ms "
                      f"{size / out[-1][3] / 1e9:8.2f} GB/s", flush=True)  # fmt: skip
    conn.send("done")
    return out


def main() -> None:
    argv = sys.argv[1:]
    reps = int(argv[argv.index("--reps") + 1]) if "--reps" in argv else 20
    max_mib = int(argv[argv.index("--max-mib") + 1]) if "--max-mib" in argv else 512
    out = Path(argv[0])
    nbytes = max_mib << 20
    ctx = mp.get_context("spawn")
    a, b = ctx.Pipe()
    proc = ctx.Process(target=target, args=(b, nbytes))
    proc.start()
    try:
        rows = initiator(a, nbytes, reps)
    finally:
        proc.join(60)
    with out.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["src_kind", "dst_kind", "bytes", "seconds"])
        w.writerows((s, d, n, f"{t:.9g}") for s, d, n, t in rows)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
