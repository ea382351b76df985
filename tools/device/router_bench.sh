#!/usr/bin/env bash
# `make bench-router` on a many-core Linux machine (the router on a core of its own, the zero-delay
# sim workers and the load generators on cores of their own), twice: run 1 is the whole bench
# (200- and 1,024-token rows, the scale-out figure, vllm-router beside it), run 2 repeats the
# 200-token rows of both routers for a second sample. About 9 minutes wall.
# Run from the repository root, with the package's dependencies either installed or carried as
# wheels in .whl/ (unpacked to /tmp/site; vllm-router and py-spy from their PyPI wheels there).
# Writes at most 8 files, flat, to $OUT:
#   machine.txt      CPU model, cores, Python, the imported packages' versions, each phase's time
#   run1.md, run1.json, run2.md, run2.json   the bench's report and every figure, per run
#   logs.txt         the tail of every process's log, both runs
#   flame-*.svg      run 1's py-spy flame graphs of the router at c=32 (when py-spy is there)
# Settings (environment): PY (python, default python3), OUT (default ./out-router-bench),
# BUDGET1 / BUDGET2 (each run's --budget-s, default 300 / 170), SKIP_WHEELS=1 (use the
# interpreter's own packages even where .whl/ exists), SMOKE=1 (a short check of the
# script itself: 200-token rows only, small budgets, no scale-out).
set -u
PY=${PY:-python3}
OUT=${OUT:-./out-router-bench}
mkdir -p "$OUT"
M="$OUT/machine.txt"
stamp() { echo "$(date -u +%H:%M:%S) $*" >> "$M"; }
. "$(dirname "$0")/site.sh"  # the wheels, PYTHONPATH, HF_HUB_OFFLINE
{
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
  echo "nproc: $(nproc)"
  echo "kernel: $(uname -r)"
  echo "loadavg: $(cat /proc/loadavg)"
} > "$M"
$PY - >> "$M" 2>&1 <<'EOF' || { echo "imports failed" >> "$M"; exit 4; }
import importlib, sys
print("python:", sys.version.split()[0], sys.executable)
for name in ("splitserve", "grpc", "google.protobuf", "pydantic", "fastapi", "starlette", "uvicorn",
             "httptools", "orjson", "uvloop", "transformers", "tokenizers", "numpy",
             "prometheus_client"):
    mod = importlib.import_module(name)
    print(f"{name}: {getattr(mod, '__version__', '?')} ({getattr(mod, '__file__', '?')})")
import splitserve.router.server, splitserve.worker.server  # the two processes the bench starts
EOF
# vllm-router strips nothing of its own: the bench starts the peer with our PYTHONPATH removed,
# so a wrapper gives it the carried site back.
VR=""
if [ -x "$SITE/bin/vllm-router" ]; then
  VR=/tmp/vllm-router-wrapper
  printf '#!/bin/sh\nPYTHONPATH=%s exec %s "$@"\n' "$SITE" "$SITE/bin/vllm-router" > "$VR"
  chmod +x "$VR"
  PYTHONPATH=$SITE "$SITE/bin/vllm-router" --help > /dev/null 2>&1 \
    && echo "vllm-router: runs" >> "$M" || echo "vllm-router: does not run" >> "$M"
fi
SPY=""; [ -x "$SITE/bin/py-spy" ] && SPY="$SITE/bin/py-spy"
if [ "${SMOKE:-0}" = 1 ]; then
  B1=${BUDGET1:-110}; B2=${BUDGET2:-100}; P1="200"; SCALE=""; RATES="100 200"
else
  B1=${BUDGET1:-300}; B2=${BUDGET2:-170}; P1="200 1024"; SCALE="--scale 1 2 4 --sat-s 8"
  RATES="200 400 600 800 1000 1200"
fi
bench() {  # name budget prompt-tokens extra-args...
  local name=$1 budget=$2 prompts=$3; shift 3
  stamp "$name: start (budget $budget s), loadavg $(cut -d' ' -f1-3 /proc/loadavg)"
  timeout $((budget + 90)) $PY -m tests.bench_router.run --prompt-tokens $prompts \
    --rates $RATES --slow-streams 0 --budget-s "$budget" --out "$OUT/$name.md" \
    --logs "/tmp/$name-logs.txt" ${VR:+--vllm-router "$VR"} "$@" >> "/tmp/$name-stdout.txt" 2>&1
  stamp "$name: rc $? after ${SECONDS} s"
  { echo "== $name stdout"; tail -40 "/tmp/$name-stdout.txt"; echo "== $name logs"
    tail -c 60000 "/tmp/$name-logs.txt" 2> /dev/null; } >> "$OUT/logs.txt"
}
bench run1 "$B1" "$P1" $SCALE ${SPY:+--py-spy "$SPY"}
bench run2 "$B2" 200 --no-peer-scaling
echo "loadavg end: $(cat /proc/loadavg)" >> "$M"
