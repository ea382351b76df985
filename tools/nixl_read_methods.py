"""Raw NIXL READ between two processes on this host, the same bytes read in different ways.

Usage (the vLLM venv, which has NIXL), one experiment per call:

    OMP_NUM_THREADS=1 .venv-vllm/bin/python tools/nixl_read_methods.py methods [--sizes-mib 32,64]
    ... tools/nixl_read_methods.py threads|hogs|churn|windows

Why: `make bench-kv` compares vLLM's KV READ with a raw READ of the same bytes, and the ratio
moved between runs (docs/benchmarks.md, "KV handoff"). Each experiment changes one thing about
the raw READ and keeps the rest (UCX settings of a local worker, `kvbench.ucx_env`; buffers in
transparent huge pages unless said):

* `methods`: one contiguous descriptor vs vLLM's layout (one descriptor per KV block in each of
  the layer regions of its CPU KV cache, prepared lists, NIXL's merging of contiguous
  descriptors, a notification), merging off, every block apart, the source freshly written
  (a prefill has just written its KV), and 4 KiB pages;
* `threads`: the reader's agent with `num_threads=0` vs 4 (vLLM's NixlConnector passes 4);
* `hogs`: beside a CPU loop or a memory copy on the target's core, or a CPU loop on the reader's;
* `churn`: beside a thread mapping and unmapping memory in the reader or the target process;
* `windows`: 64 MiB READs at 15 offsets into 1 GiB buffers (different physical memory).

Reader on core 1, target on core 0 (the bench's decode and prefill cores) except in `methods`
(`--cpu`). Rounds are interleaved so load from other processes hits every variant alike. Per
variant: NIXL's own `xferDuration` (what vLLM's `nixl_xfer_time` is) and the reading thread's
CPU seconds inside `transfer()` (with `cma` the copy runs there; wall time above it is the
thread waiting for its core). Prints Markdown.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

from splitserve.worker.vllm_adapter.kvbench import (
    CHURN_ENV,
    MiB,
    RawNixl,
    ReadMethod,
    vllm_like,
)

REGIONS = 8
"""The bench model's CPU KV cache in vLLM 0.32: one region per layer (8)."""
BLOCK_BYTES = 512 * 1024
"""Its block per region, K and V: 2 x 128 tokens x 512 x 4 bytes (vLLM asked for 128
descriptors per 64 MiB READ: 8 layers x 16 blocks)."""

Row = tuple[str, list[tuple[float, float, int, float]]]


def methods(nbytes: int) -> dict[str, ReadMethod]:
    v = vllm_like(nbytes, REGIONS, BLOCK_BYTES)
    return {
        "1 descriptor (bench-kv's raw READ until now)": ReadMethod(),
        "1 descriptor, prepped": ReadMethod(prepped=True),
        "1 descriptor, prepped, notification": ReadMethod(prepped=True, notify=True),
        "vLLM's layout (merged)": v,
        "vLLM's layout, no notification": ReadMethod(v.pieces, v.regions, True, True, False),
        "vLLM's layout, merging off": ReadMethod(v.pieces, v.regions, True, False, True),
        "vLLM's layout, every block apart": ReadMethod(
            v.pieces, v.regions, True, True, True, runs=v.pieces
        ),
        "1 descriptor, source freshly written": ReadMethod(fresh=True),
        "vLLM's layout, source freshly written": ReadMethod(
            v.pieces, v.regions, True, True, True, fresh=True
        ),
    }


def _rounds(rounds: int, variants: list[Callable[[], Row]]) -> dict[str, list[Row]]:
    got: dict[str, list[Row]] = {}
    for _ in range(rounds):
        for v in variants:
            name, xs = v()
            got.setdefault(name, []).append((name, xs))
    return got


def _print(got: dict[str, list[Row]], nbytes: dict[str, int]) -> None:
    print(
        "| variant | MiB | xferDuration ms (median, min) | CPU in transfer() ms (median, min) "
        "| descriptors after merging | GB/s |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for name, rows in got.items():
        xs = [x for _, r in rows for x in r]
        tel = [x[1] for x in xs]
        cpu = [x[3] for x in xs]
        n = nbytes[name]
        print(
            f"| {name} | {n // MiB} | {1e3 * statistics.median(tel):.2f}, {1e3 * min(tel):.2f} "
            f"| {1e3 * statistics.median(cpu):.2f}, {1e3 * min(cpu):.2f} "
            f"| {statistics.median(x[2] for x in xs):.0f} "
            f"| {n / statistics.median(tel) / 1e9:.2f} |"
        )


def run_methods(sizes: list[int], rounds: int, repeat: int, cpu: int | None) -> None:
    raws = {
        "": RawNixl(max(sizes), cpu=cpu),
        "4 KiB pages: ": RawNixl(max(sizes), cpu=cpu, huge_pages=False),
    }
    for k, r in raws.items():
        print(
            f"{k or 'huge pages: '}AnonHugePages reader {r.huge_kib[0]} kB, "
            f"target {r.huge_kib[1]} kB"
        )
    nbytes: dict[str, int] = {}
    variants: list[Callable[[], Row]] = []
    for n in sizes:
        for pages, raw in raws.items():
            for name, m in methods(n).items():
                if pages and not name.startswith(("1 descriptor (", "vLLM's layout (")):
                    continue
                label = f"{pages}{name}, {n // MiB} MiB"
                nbytes[label] = n

                def one(
                    raw: RawNixl = raw, n: int = n, m: ReadMethod = m, label: str = label
                ) -> Row:
                    return label, raw.read(n, repeat, m)

                variants.append(one)
    try:
        got = _rounds(rounds, variants)
    finally:
        for r in raws.values():
            r.close()
    _print(got, nbytes)


def run_threads(rounds: int, repeat: int) -> None:
    n = 64 * MiB
    like = vllm_like(n, REGIONS, BLOCK_BYTES)
    raws = {t: RawNixl(n, cpu=1, target_cpu=0, num_threads=t) for t in (0, 4)}
    try:
        got = _rounds(
            rounds,
            [
                (lambda t=t, r=r: (f"num_threads={t}", r.read(n, repeat, like)))
                for t, r in raws.items()
            ],
        )
    finally:
        for r in raws.values():
            r.close()
    _print(got, dict.fromkeys(got, n))


LOOP = "import os\nos.sched_setaffinity(0, {{{}}})\nwhile True: pass"
COPY = (
    "import os, numpy as np\nos.sched_setaffinity(0, {{{}}})\n"
    "a = np.ones(64 << 20, np.uint8); b = np.empty_like(a)\nwhile True: np.copyto(b, a)"
)
HOGS = {
    "nothing beside": None,
    "CPU loop on core 0 (the target's)": LOOP.format(0),
    "memory copy on core 0 (numpy, 64 MiB)": COPY.format(0),
    "CPU loop on core 1 (the reader's)": LOOP.format(1),
    "memory copy on core 1 (the reader's; numpy, 64 MiB)": COPY.format(1),
}


def run_hogs(rounds: int, repeat: int) -> None:
    n = 64 * MiB
    like = vllm_like(n, REGIONS, BLOCK_BYTES)
    raw = RawNixl(n, cpu=1, target_cpu=0)

    def beside(name: str, code: str | None) -> Row:
        p = subprocess.Popen([sys.executable, "-c", code]) if code else None
        try:
            time.sleep(0.3)
            return name, raw.read(n, repeat, like)
        finally:
            if p is not None:
                p.kill()
                p.wait()

    try:
        got = _rounds(rounds, [(lambda k=k, c=c: beside(k, c)) for k, c in HOGS.items()])
    finally:
        raw.close()
    _print(got, dict.fromkeys(got, n))


def run_churn(rounds: int, repeat: int) -> None:
    n = 64 * MiB
    like = vllm_like(n, REGIONS, BLOCK_BYTES)
    raws = {}
    for k in ("-1,-1", "0,-1", "1,-1", "-1,0", "-1,1"):
        os.environ[CHURN_ENV] = k  # the spawned reader and target read it
        raws[f"churning thread in reader, target on core {k}"] = RawNixl(n, cpu=1, target_cpu=0)
    os.environ.pop(CHURN_ENV)
    try:
        got = _rounds(
            rounds,
            [(lambda k=k, r=r: (k, r.read(n, repeat, like))) for k, r in raws.items()],
        )
    finally:
        for r in raws.values():
            r.close()
    _print(got, dict.fromkeys(got, n))


def run_windows(rounds: int, repeat: int) -> None:
    n = 64 * MiB
    raw = RawNixl(8 * n, cpu=1, target_cpu=0)
    print(f"AnonHugePages reader {raw.huge_kib[0]} kB, target {raw.huge_kib[1]} kB")
    try:
        got = _rounds(
            rounds,
            [
                (
                    lambda w=w: (
                        f"offset {w * 64} MiB",
                        raw.read(n, repeat, ReadMethod(offset=w * n)),
                    )
                )
                for w in range(15)
            ],
        )
    finally:
        raw.close()
    _print(got, dict.fromkeys(got, n))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("experiment", choices=("methods", "threads", "hogs", "churn", "windows"))
    ap.add_argument("--sizes-mib", default="32,64", help="methods: READ sizes")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=2, help="READs per variant per round")
    ap.add_argument("--cpu", type=int, default=-1, help="methods: pin the reader to this core")
    args = ap.parse_args()
    load = os.getloadavg()
    print(
        f"{args.experiment}: load average at start {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}"
        f"; UCX_TLS={os.environ.get('UCX_TLS', '(default)')}\n"
    )
    t0 = time.time()
    if args.experiment == "methods":
        sizes = [int(x) * MiB for x in args.sizes_mib.split(",")]
        run_methods(sizes, args.rounds, args.repeat, args.cpu if args.cpu >= 0 else None)
    else:
        {"threads": run_threads, "hogs": run_hogs, "churn": run_churn, "windows": run_windows}[
            args.experiment
        ](args.rounds, args.repeat)
    load = os.getloadavg()
    print(
        f"\nload average at end {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} "
        f"({time.time() - t0:.0f} s)"
    )


if __name__ == "__main__":
    main()
