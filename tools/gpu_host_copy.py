"""Time copies between GPU memory and host memory (torch only; no splitserve import).

A vLLM worker whose NIXL connector runs with `kv_buffer_device: cpu` stages each KV hand-off
through host memory: the prefill GPU copies its blocks out (device to host), NIXL moves host
buffers, and the decode GPU copies them in (host to device). This measures the two GPU legs on
one GPU, for pinned (page-locked) and pageable host buffers, at sizes from 64 KiB to 1 GiB.

Run on a GPU machine: `python3 tools/gpu_host_copy.py --out FILE.csv`. Rows:
`direction,pinned,bytes,seconds` (median of the repetitions after warm-ups, CUDA events).
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch


def median_copy_s(dst: torch.Tensor, src: torch.Tensor, reps: int) -> float:
    for _ in range(3):
        dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src, non_blocking=True)
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) / 1000.0)
    return statistics.median(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    rows = []
    for shift in range(16, 31, 2):  # 64 KiB ... 1 GiB
        n = 1 << shift
        dev = torch.empty(n, dtype=torch.uint8, device="cuda")
        for pinned in (True, False):
            host = torch.empty(n, dtype=torch.uint8, pin_memory=pinned)
            rows.append(("d2h", pinned, n, median_copy_s(host, dev, a.reps)))
            rows.append(("h2d", pinned, n, median_copy_s(dev, host, a.reps)))
            del host
        del dev
    with a.out.open("w") as f:
        f.write(f"# {torch.cuda.get_device_name(0)}, torch {torch.__version__}\n")
        f.write("direction,pinned,bytes,seconds\n")
        f.writelines(f"{d},{int(p)},{n},{s:.9f}\n" for d, p, n, s in rows)
    for d, p, n, s in rows:
        print(f"{d} pinned={int(p)} {n >> 10:>8} KiB {s * 1e3:9.3f} ms {n / s / 1e9:7.1f} GB/s")


if __name__ == "__main__":
    main()
