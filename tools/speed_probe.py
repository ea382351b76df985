"""The machine's speed over time, for `splitserve sim validate --speed-trace`.

Usage:
    python tools/speed_probe.py OUT.jsonl [--interval 0.1] [--loops 20000]

Every `--interval` seconds runs a fixed pure-Python loop and appends one JSON line
`{"t_s": <time.monotonic() at its end>, "probe_s": <its wall time>}` (format: `sim/speed.py`;
the router's request log uses the same clock). Runs until SIGINT / SIGTERM. The loop is ~2 ms
on a quiet core, so the probe costs ~2 % of one core.
"""

from __future__ import annotations

import argparse
import json
import signal
import time
from pathlib import Path

_stop = False


def _on_signal(signum: int, frame: object) -> None:
    del signum, frame
    global _stop
    _stop = True


def probe(loops: int) -> float:
    t = time.perf_counter()
    x = 0
    for i in range(loops):
        x += i * i
    return time.perf_counter() - t


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out", type=Path)
    p.add_argument("--interval", type=float, default=0.1)
    p.add_argument("--loops", type=int, default=20000)
    args = p.parse_args()
    signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGTERM, _on_signal)
    with args.out.open("w") as f:
        while not _stop:
            dt = probe(args.loops)
            f.write(json.dumps({"t_s": round(time.monotonic(), 6), "probe_s": round(dt, 7)}) + "\n")
            f.flush()
            time.sleep(args.interval)


if __name__ == "__main__":
    main()
