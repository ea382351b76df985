#!/usr/bin/env bash
# The reproductions' full-length runs (distserve, bros, alise with --latency gpu) and the
# simulator speed figure (`make bench`'s, pure Python and, where a C compiler and the Python
# headers exist, the mypyc build after its golden-digest check) on a many-core machine, in
# about 8 minutes wall. Run from the repository root with the package on PYTHONPATH (no
# install). Writes at most 8 files, flat, to $OUT:
#   machine.txt   CPU model (/proc/cpuinfo), cores, Python, compiler, load; every phase's time
#   bench.md      simulator speed, pure Python then (if built) compiled, as `make bench` prints
#   golden.txt    the compiled build's golden-digest tests (or why they were skipped)
#   distserve.md, bros.md, alise.md   `splitserve sim reproduce <paper> --latency gpu` tables
#   repro.log     the runs' stderr and exit codes (124: its timeout ran out)
# Settings (environment): PY (python, default python3), OUT (default ./out-sim-full),
# SMOKE=1 (quick runs, 2 jobs each, a short bench: checks the script end to end in seconds),
# REPRO_TIMEOUT (seconds per reproduction, default 350), JOBS_DISTSERVE / JOBS_BROS /
# JOBS_ALISE (default 5 / 7 / 3, by their CPU time on the 2-core machine: 40 min, > 1 h, > 7 min;
# the three run side by side after the bench), SKIP_COMPILED=1.
set -u
PY=${PY:-python3}
case "$PY" in */*) PY="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")" ;; esac  # used after cd
OUT=${OUT:-./out-sim-full}
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
SMOKE=${SMOKE:-0}
if [ "$SMOKE" = 1 ]; then
  QUICK=1; J1=2; J2=2; J3=2; TMO=${REPRO_TIMEOUT:-300}; BENCH_ARGS="--max-requests 2000"
else
  QUICK=0; J1=${JOBS_DISTSERVE:-5}; J2=${JOBS_BROS:-7}; J3=${JOBS_ALISE:-3}
  TMO=${REPRO_TIMEOUT:-350}; BENCH_ARGS=""
fi
M="$OUT/machine.txt"
stamp() { echo "$(date -u +%H:%M:%S) $*" >> "$M"; }
{
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
  echo "nproc: $(nproc)"
  echo "python: $($PY -c 'import sys; print(sys.version.split()[0])')"
  echo "numpy: $($PY -c 'import numpy; print(numpy.__version__)')"
  echo "cc: $(command -v "${CC:-cc}" || echo none)"
  echo "loadavg: $(cat /proc/loadavg)"
  echo "smoke: $SMOKE; jobs distserve/bros/alise: $J1/$J2/$J3; timeout ${TMO} s"
} > "$M"
$PY -c 'import splitserve, sys; print("splitserve from", splitserve.__file__)' >> "$M" 2>&1 \
  || { echo "splitserve does not import" >> "$M"; exit 1; }

# 1. Speed first, on the quiet machine: pure Python, then the compiled build.
stamp "bench pure: start"
$PY -m splitserve.sim.bench --report-interval 0 --report-interval 0.1 $BENCH_ARGS \
  > "$OUT/bench.md" 2>> "$M"
stamp "bench pure: rc $?"
HAVE_H=$($PY -c 'import os, sysconfig; print(int(os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h"))))')
if [ "${SKIP_COMPILED:-0}" = 1 ]; then
  echo "compiled build skipped: SKIP_COMPILED=1" > "$OUT/golden.txt"
elif ! command -v "${CC:-cc}" > /dev/null 2>&1 || [ "$HAVE_H" != 1 ]; then
  echo "compiled build skipped: no C compiler or no Python headers (Python.h: $HAVE_H)" \
    > "$OUT/golden.txt"
elif ! $PY -c 'import mypyc' 2> /dev/null; then
  echo "compiled build skipped: mypy (mypyc) does not import" > "$OUT/golden.txt"
else
  B=$(mktemp -d)/mypyc
  mkdir -p "$B"; cp -R src/splitserve "$B/splitserve"
  find "$B" -name __pycache__ -prune -exec rm -rf {} +
  MODS=$($PY -m splitserve.sim.bench --print-modules)
  stamp "mypyc build: start"
  if (cd "$B" && timeout 240 $PY -m mypyc $MODS > mypyc.log 2>&1); then
    stamp "mypyc build: done"
    { PYTHONPATH="$B:$PYTHONPATH" $PY -c 'from splitserve.sim.bench import COMPILED_MODULES as w, build_kind, compiled_modules; g = compiled_modules(); assert g == list(w) and build_kind() == "mypyc", g; print(len(g), "compiled modules imported")' \
      && PYTHONPATH="$B:$PYTHONPATH" timeout 120 $PY -m pytest -q -p no:cacheprovider \
        --noconftest tests/unit/sim/test_speed_golden.py; echo "golden rc $?"; } \
      > "$OUT/golden.txt" 2>&1
    stamp "golden: $(tail -1 "$OUT/golden.txt")"
    if grep -q "golden rc 0" "$OUT/golden.txt"; then
      PYTHONPATH="$B:$PYTHONPATH" $PY -m splitserve.sim.bench --report-interval 0 \
        --report-interval 0.1 $BENCH_ARGS >> "$OUT/bench.md" 2>> "$M"
      stamp "bench compiled: rc $?"
    fi
  else
    { echo "mypyc build failed:"; tail -30 "$B/mypyc.log"; } > "$OUT/golden.txt"
    stamp "mypyc build: failed"
  fi
fi

# 2. The three full runs side by side, each in its own worker processes, under timeout.
repro() {  # paper jobs
  local t0=$SECONDS
  timeout "$TMO" $PY -c 'import sys
from splitserve.sim import runner
if __name__ == "__main__":
    r = runner.run_reproduction(sys.argv[1], sys.argv[2] == "1", None, "gpu", int(sys.argv[3]))
    print(r.markdown())' "$1" "$QUICK" "$2" > "$OUT/$1.md" 2> "$OUT/$1.err"
  local rc=$?
  echo "$1: rc $rc after $((SECONDS - t0)) s (jobs $2)" >> "$OUT/$1.err"
}
stamp "reproductions: start (quick=$QUICK)"
repro distserve "$J1" & p1=$!
repro bros "$J2" & p2=$!
repro alise "$J3" & p3=$!
wait "$p1" "$p2" "$p3"
for p in distserve bros alise; do
  { echo "== $p"; cat "$OUT/$p.err"; } >> "$OUT/repro.log"; rm -f "$OUT/$p.err"
done
stamp "reproductions: done"
grep -h "rc " "$OUT/repro.log" >> "$M"
echo "loadavg end: $(cat /proc/loadavg)" >> "$M"
