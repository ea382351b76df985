"""Does CUDA IPC work between two processes on this machine, and how fast is it?

Usage (torch with CUDA): python tools/probe_cuda_ipc.py [--mib N] [--reps N]

`tools/measure_nixl_gpu.py` found NIXL's UCX backend moving GPU memory between two processes
at < 1 GB/s on the one GPU machine this project was lent (docs/engines.md, GPU cluster
checklist, item 6): UCX did not choose its `cuda_ipc` transport. This probe separates "the
machine refuses CUDA IPC" from "UCX does not pick it": the parent allocates a tensor in GPU
memory and hands it to a child process through torch.multiprocessing (which exports a CUDA IPC
memory handle, `cudaIpcGetMemHandle`, and opens it in the child, `cudaIpcOpenMemHandle`); the
child checks the bytes and copies the shared tensor into its own allocation `reps` times
(device-to-device through the IPC mapping), timing each copy with CUDA events. Prints one JSON
line: whether the handle opened, the data matched, and the copy rate (bytes read + written per
second, as a device-to-device copy is usually quoted, and bytes moved per second).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from typing import Any


def _child(q_in: Any, q_out: Any, reps: int) -> None:
    import torch

    result: dict[str, Any] = {}
    try:
        shared = q_in.get(timeout=60)  # opens the CUDA IPC handle
        result["opened"] = True
        expect = (torch.arange(shared.numel(), device="cuda", dtype=torch.int64) % 251).to(
            torch.uint8
        )
        result["data_ok"] = bool(torch.equal(shared, expect))
        own = torch.empty_like(shared)
        times = []
        for _ in range(reps + 1):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            own.copy_(shared)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        med = statistics.median(times[1:])  # the first copy warms the mapping
        nbytes = shared.numel()
        result.update(
            bytes=nbytes,
            median_s=med,
            moved_gb_s=nbytes / med / 1e9,
            read_plus_write_gb_s=2 * nbytes / med / 1e9,
            copy_ok=bool(torch.equal(own, shared)),
        )
    except Exception as exc:  # the refusal is the finding
        result.setdefault("opened", False)
        result["error"] = f"{type(exc).__name__}: {exc}"
    q_out.put(result)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=int, default=1024)
    parser.add_argument("--reps", type=int, default=10)
    args = parser.parse_args()
    import torch
    import torch.multiprocessing as mp

    if not torch.cuda.is_available():
        raise SystemExit("probe_cuda_ipc: no CUDA device")
    ctx = mp.get_context("spawn")
    q_in, q_out = ctx.Queue(), ctx.Queue()
    nbytes = args.mib << 20
    tensor = (torch.arange(nbytes, device="cuda", dtype=torch.int64) % 251).to(torch.uint8)
    local = torch.empty_like(tensor)
    times = []
    for _ in range(args.reps + 1):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        local.copy_(tensor)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    same_process = nbytes / statistics.median(times[1:]) / 1e9
    child = ctx.Process(target=_child, args=(q_in, q_out, args.reps))
    child.start()
    report: dict[str, Any] = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__}
    try:
        q_in.put(tensor)
        report.update(q_out.get(timeout=120))
    except Exception as exc:
        report.update(opened=False, error=f"{type(exc).__name__}: {exc}")
    child.join(30)
    report["same_process_moved_gb_s"] = same_process
    print(json.dumps(report), flush=True)
    sys.exit(0 if report.get("copy_ok") else 1)


if __name__ == "__main__":
    main()
