"""Raw NIXL READ between two processes on this host, the same bytes read in different ways.

Usage (the vLLM venv, which has NIXL): `OMP_NUM_THREADS=1 UCX_NET_DEVICES=lo
.venv-vllm/bin/python tools/nixl_read_methods.py [--sizes-mib 32,64] [--rounds 5]`

Why: `make bench-kv` compares vLLM's KV READ with a raw READ of the same bytes, and the ratio
moved between runs (docs/benchmarks.md, "KV handoff"). This isolates the method: one contiguous
descriptor vs vLLM's layout (one descriptor per KV block in each of the layers x K/V regions of
its CPU KV cache, prepared lists, NIXL's merging of contiguous descriptors, a notification),
huge pages vs 4 KiB pages, and the time our clock sees (`transfer()` to DONE) vs NIXL's own
telemetry (`xferDuration`, what vLLM's `nixl_xfer_time` is). Rounds are interleaved, so load
from other processes hits every method alike. Prints a Markdown table of medians.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from splitserve.worker.vllm_adapter.kvbench import MiB, RawNixl, ReadMethod, vllm_like

REGIONS = 16
"""The bench model's CPU KV cache: 8 layers x K/V."""
BLOCK_BYTES = 256 * 1024
"""Its block per region: 128 tokens x 512 x 4 bytes."""


def methods(nbytes: int) -> dict[str, ReadMethod]:
    v = vllm_like(nbytes, REGIONS, BLOCK_BYTES)
    return {
        "1 descriptor (bench-kv's raw READ until now)": ReadMethod(),
        "1 descriptor, prepped": ReadMethod(prepped=True),
        "1 descriptor, prepped, notification": ReadMethod(prepped=True, notify=True),
        "vLLM's layout (merged)": v,
        "vLLM's layout, no notification": ReadMethod(v.pieces, v.regions, True, True, False),
        "vLLM's layout, merging off": ReadMethod(v.pieces, v.regions, True, False, True),
        "vLLM's layout, every block its own run": ReadMethod(
            v.pieces, v.regions, True, True, True, runs=v.pieces
        ),
        "1 descriptor, source freshly written": ReadMethod(fresh=True),
        "vLLM's layout, source freshly written": ReadMethod(
            v.pieces, v.regions, True, True, True, fresh=True
        ),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sizes-mib", default="32,64")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=2, help="READs per method per round")
    ap.add_argument("--cpu", type=int, default=-1, help="pin the reader to this core")
    args = ap.parse_args()
    sizes = [int(x) * MiB for x in args.sizes_mib.split(",")]
    cpu = args.cpu if args.cpu >= 0 else None
    load = os.getloadavg()
    print(
        f"load average at start {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}; "
        f"UCX_TLS={os.environ.get('UCX_TLS', '(default)')}; reader on core {cpu}\n"
    )
    raws = {
        "huge": RawNixl(max(sizes), cpu=cpu),
        "4k": RawNixl(max(sizes), cpu=cpu, huge_pages=False),
    }
    for k, r in raws.items():
        print(f"{k}: AnonHugePages reader {r.huge_kib[0]} kB, target {r.huge_kib[1]} kB")
    got: dict[tuple[str, int, str], list[tuple[float, float, int]]] = {}
    try:
        for _ in range(args.rounds):
            for n in sizes:
                for pages, raw in raws.items():
                    for name, m in methods(n).items():
                        if pages == "4k" and name not in (
                            "1 descriptor (bench-kv's raw READ until now)",
                            "vLLM's layout (merged)",
                        ):
                            continue
                        got.setdefault((pages, n, name), []).extend(raw.read(n, args.repeat, m))
    finally:
        for r in raws.values():
            r.close()
    load = os.getloadavg()
    print(f"load average at end {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}\n")
    print(
        "| pages | MiB | method | clock ms (median, min) | NIXL xferDuration ms "
        "| descriptors after merging | GB/s |"
    )
    print("|---|---:|---|---:|---:|---:|---:|")
    for (pages, n, name), xs in got.items():
        clock = [x[0] for x in xs]
        tel = [x[1] for x in xs]
        d = statistics.median(x[2] for x in xs)
        print(
            f"| {pages} | {n // MiB} | {name} "
            f"| {1e3 * statistics.median(clock):.2f}, {1e3 * min(clock):.2f} "
            f"| {1e3 * statistics.median(tel):.2f} | {d:.0f} "
            f"| {n / statistics.median(tel) / 1e9:.2f} |"
        )


if __name__ == "__main__":
    t0 = time.time()
    main()
    print(f"\n({time.time() - t0:.0f} s)")
