"""Does a plain memory copy's speed depend on *which* memory it copies (no NIXL, one process)?

Usage: `.venv/bin/python tools/mem_backing_probe.py [--buffers 4] [--mib 512] [--rounds 3]`

Why: raw NIXL READs of the same 64 MiB layout, by the same reader into the same destination,
took 2.3x longer out of one THP-backed source process than out of another
(`tools/nixl_vllm_sides.py`, docs/benchmarks.md). In a VM the guest's huge pages may be backed
by the host in 2 MiB or 4 KiB pages; a copy through host-4 KiB-backed memory pays a nested page
walk per 4 KiB. The guest cannot see that backing, but a copy's time can: this allocates
`--buffers` anonymous mappings in transparent huge pages (as the workers' KV caches are) and
copies 64 MiB windows out of each into one fixed destination (`ctypes.memmove`, one core),
interleaved over `--rounds`. Uniform times mean the memory is alike; per-buffer or per-window
differences that persist across rounds mean the copy's cost depends on where the memory is.
Prints Markdown. Not a test; load matters (say it when quoting numbers).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import time

from splitserve.worker.vllm_adapter.kvbench import MiB, _buffer, anon_huge_kib


def first_write(args: argparse.Namespace) -> None:
    """Writes into memory last written `--idle-s` ago, then again at once: vLLM's READ writes
    into KV blocks the decode worker zeroed at start-up and never wrote since. Two buffers in
    THP: zero-filled (as torch.zeros leaves vLLM's KV cache) and every 4 KiB page distinct."""
    import numpy as np

    os.sched_setaffinity(0, {args.cpu})
    win = args.window_mib * MiB
    size = args.mib * MiB
    src_map, src = _buffer(win, True, 7)
    bufs = {"zeroed": _buffer(size, True, 0)}
    m, addr = _buffer(size, True, 0)
    pages = np.frombuffer((ctypes.c_char * size).from_address(addr), dtype=np.uint32)
    pages[:: 4096 // 4] = np.arange(1, size // 4096 + 1, dtype=np.uint32)  # one word per page
    bufs["distinct pages"] = (m, addr)
    print(f"load {os.getloadavg()[0]:.1f}; idle {args.idle_s} s, then per {args.window_mib} MiB")
    time.sleep(args.idle_s)
    print("\n| buffer | window | 1st write ms (CPU) | 2nd write ms (CPU) | read ms |")
    print("|---|---:|---:|---:|---:|")
    for name, (_, addr) in bufs.items():
        for off in range(0, size - win + 1, win):
            row = []
            for _ in range(2):
                c0, t0 = time.thread_time(), time.perf_counter()
                ctypes.memmove(addr + off, src, win)
                row.append(
                    f"{1e3 * (time.perf_counter() - t0):.2f} "
                    f"({1e3 * (time.thread_time() - c0):.2f})"
                )
            t0 = time.perf_counter()
            ctypes.memmove(src, addr + off, win)
            read = 1e3 * (time.perf_counter() - t0)
            print(f"| {name} | @{off // MiB} MiB | {row[0]} | {row[1]} | {read:.2f} |")
    del src_map, bufs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--buffers", type=int, default=4)
    ap.add_argument("--mib", type=int, default=512, help="size of each source buffer")
    ap.add_argument("--window-mib", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cpu", type=int, default=1)
    ap.add_argument(
        "--first-write",
        action="store_true",
        help="instead: time the first write into memory idle for --idle-s, then a second",
    )
    ap.add_argument("--idle-s", type=float, default=60.0)
    args = ap.parse_args()
    if args.first_write:
        first_write(args)
        return
    os.sched_setaffinity(0, {args.cpu})
    win = args.window_mib * MiB
    dst_map, dst = _buffer(win, True, 0)
    srcs = [_buffer(args.mib * MiB, True, 1 + i) for i in range(args.buffers)]
    offsets = list(range(0, args.mib * MiB - win + 1, win))
    print(
        f"load {os.getloadavg()[0]:.1f}; AnonHugePages {anon_huge_kib()} kB for "
        f"{args.buffers} x {args.mib} MiB + {args.window_mib} MiB\n"
    )
    got: dict[tuple[int, int], list[float]] = {}
    cpu: dict[tuple[int, int], list[float]] = {}
    for _ in range(args.rounds):
        for i, (_, addr) in enumerate(srcs):
            for off in offsets:
                c0 = time.thread_time()
                t0 = time.perf_counter()
                ctypes.memmove(dst, addr + off, win)
                got.setdefault((i, off), []).append(time.perf_counter() - t0)
                cpu.setdefault((i, off), []).append(time.thread_time() - c0)
    for what, table in (("wall ms", got), ("CPU ms (this thread)", cpu)):
        print(f"| buffer, {what} | {' | '.join(f'@{o // MiB} MiB' for o in offsets)} | median |")
        print("|---|" + "---:|" * (len(offsets) + 1))
        for i in range(len(srcs)):
            cells = [statistics.median(table[(i, o)]) * 1e3 for o in offsets]
            row = " | ".join(f"{c:.2f}" for c in cells)
            print(f"| {i} | {row} | {statistics.median(cells):.2f} |")
        print()
    del dst_map, srcs


if __name__ == "__main__":
    main()
