#!/usr/bin/env bash
# Two routers, A (an older src/ tree, e.g. from `git archive`) and B (this tree), interleaved
# A B A B ...: `python -m tests.bench_router.run`'s 200-token splitserve row each time (no
# Poisson sweep, no peer), the same zero-delay sim workers of this tree on their own cores (the
# automatic layout on a many-core machine). About 50 s a run on 16 cores.
# Run from the repository root; wheels in .whl/ are unpacked to /tmp/site as in router_bench.sh.
# Settings (environment): A_SRC (required: the src/ directory of router A), ROUNDS (default 2),
# PY (default python3), OUT (default ./out-router-ab), BUDGET (each run's --budget-s, default
# 120), BACKENDS (run.py --backends; default: one worker per backend core), SKIP_WHEELS=1.
# Writes to $OUT: machine.txt (with a line per run), ab.md (CPU / request and c=32 req/s per
# run, and the B / A ratios of their means), logs.txt.
set -u
PY=${PY:-python3}
OUT=${OUT:-./out-router-ab}
ROUNDS=${ROUNDS:-2}
: "${A_SRC:?A_SRC: the src/ directory of router A}"
A_SRC=$(cd "$A_SRC" && pwd)
mkdir -p "$OUT"
M="$OUT/machine.txt"
. "$(dirname "$0")/site.sh"  # the wheels, PYTHONPATH, HF_HUB_OFFLINE
{
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
  echo "nproc: $(nproc); python: $($PY -c 'import sys; print(sys.version.split()[0])')"
  echo "A: $A_SRC; B: $PWD/src; rounds: $ROUNDS; loadavg: $(cat /proc/loadavg)"
} > "$M"
$PY -c 'import splitserve.router.server, splitserve.worker.server' >> "$M" 2>&1 \
  || { echo "imports failed" >> "$M"; exit 4; }
for i in $(seq 1 "$ROUNDS"); do
  for who in A B; do
    src=""; [ "$who" = A ] && src="--router-src $A_SRC"
    timeout $((${BUDGET:-120} + 60)) $PY -m tests.bench_router.run --prompt-tokens 200 --rates \
      --slow-streams 0 --budget-s "${BUDGET:-120}" ${BACKENDS:+--backends "$BACKENDS"} $src \
      --out "/tmp/ab-$i-$who.md" >> "$OUT/logs.txt" 2>&1
    echo "$(date -u +%H:%M:%S) round $i $who: rc $? loadavg $(cut -d' ' -f1-3 /proc/loadavg)" >> "$M"
  done
done
$PY - "$ROUNDS" > "$OUT/ab.md" <<'PYEOF'
import json, statistics, sys
rounds = int(sys.argv[1])
rows = {"A": [], "B": []}
for i in range(1, rounds + 1):
    for who in "AB":
        try:
            d = json.load(open(f"/tmp/ab-{i}-{who}.json"))
            r = next(r for r in d["rows"] if r["name"].startswith("splitserve"))
            rows[who].append(r)
        except (OSError, StopIteration, KeyError, ValueError) as err:
            print(f"round {i} {who}: no row ({err!r})")
print("| router | CPU ms / request, per round | mean | c=32 req/s, per round | mean | router core % |")
print("|---|---|---|---|---|---|")
for who in "AB":
    cpu = [r["cpu_ms_per_req"] for r in rows[who]]
    rps = [r["sat_rps"] for r in rows[who]]
    core = [r.get("router_cpu_pct", 0) for r in rows[who]]
    if cpu:
        print(f"| {who} | {', '.join(f'{c:.3f}' for c in cpu)} | {statistics.mean(cpu):.3f} | "
              f"{', '.join(f'{x:.0f}' for x in rps)} | {statistics.mean(rps):.0f} | "
              f"{', '.join(f'{x:.1f}' for x in core)} |")
if rows["A"] and rows["B"]:
    a = statistics.mean(r["cpu_ms_per_req"] for r in rows["A"])
    b = statistics.mean(r["cpu_ms_per_req"] for r in rows["B"])
    ra = statistics.mean(r["sat_rps"] for r in rows["A"])
    rb = statistics.mean(r["sat_rps"] for r in rows["B"])
    print(f"\nB / A: CPU per request {b / a:.3f}, c=32 req/s {rb / ra:.3f}")
PYEOF
cat "$OUT/ab.md"
