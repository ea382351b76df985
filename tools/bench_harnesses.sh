#!/usr/bin/env bash
# inference-perf and aiperf against a local simulated `splitserve up` stack (issue 18), each
# from its own venv (`make bench-harnesses` builds them, pinned in mk/harness.mk). Not part of
# `make test`; the results are summarised in docs/benchmarks.md.
#
# Each harness is given the model the router serves and the tokenizer it loads as read off
# `/v1/models` (`id`, `root`): nothing is set by hand. Reports go to $OUT.
#
#   tools/bench_harnesses.sh [inference-perf|aiperf]...   (default: both)
set -euo pipefail

PY=${PY:-.venv/bin/python}
IP_VENV=$(realpath -m "${IP_VENV:-.venv-inference-perf}")
AP_VENV=$(realpath -m "${AP_VENV:-.venv-aiperf}")
OUT=${OUT:-out/bench-harnesses}
REQUESTS=${REQUESTS:-50}
INPUT_TOKENS=${INPUT_TOKENS:-128}
OUTPUT_TOKENS=${OUTPUT_TOKENS:-32}
RATE=${RATE:-10}
HARNESSES=("$@")
[ ${#HARNESSES[@]} -gt 0 ] || HARNESSES=(inference-perf aiperf)

rm -rf "$OUT" && mkdir -p "$OUT/stack"
OUT=$(cd "$OUT" && pwd)
# Offline: the tokenizer comes from `root` (a local directory with the simulated engine).
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

"$PY" -m splitserve up --prefill 1 --decode 1 --port 0 --grpc-port 0 --sim-time-scale 0.05 \
  --run-dir "$OUT/stack" --log-level WARNING >"$OUT/stack.log" 2>&1 &
STACK=$!
trap 'kill -TERM $STACK 2>/dev/null; wait $STACK 2>/dev/null || true' EXIT
for _ in $(seq 600); do
  [ -f "$OUT/stack/router.ready.json" ] && break
  kill -0 $STACK 2>/dev/null || { cat "$OUT/stack.log"; exit 1; }
  sleep 0.2
done
PORT=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["port"])' \
  "$OUT/stack/router.ready.json")
URL="http://127.0.0.1:$PORT"
read -r MODEL ROOT < <(curl -sf "$URL/v1/models" | "$PY" -c \
  'import json,sys; m = json.load(sys.stdin)["data"][0]; print(m["id"], m["root"])')
echo "stack: $URL  model: $MODEL  root: $ROOT"

run_inference_perf() {
  local dir="$OUT/inference-perf"
  mkdir -p "$dir"
  # A constant rate for REQUESTS / RATE seconds; inference-perf reads the model id from
  # /v1/models itself (no model_name) and is given `root` as its tokenizer.
  cat >"$dir/config.yml" <<YAML
api: {type: completion, streaming: true}
server: {type: vllm, base_url: "$URL", ignore_eos: true}
tokenizer: {pretrained_model_name_or_path: "$ROOT"}
data:
  type: random
  input_distribution: {mean: $INPUT_TOKENS, std_dev: 0, min: $INPUT_TOKENS, max: $INPUT_TOKENS}
  output_distribution: {mean: $OUTPUT_TOKENS, std_dev: 0, min: $OUTPUT_TOKENS, max: $OUTPUT_TOKENS}
load: {type: constant, stages: [{rate: $RATE, duration: $((REQUESTS / RATE))}]}
report: {request_lifecycle: {summary: true, per_stage: false}}
storage: {local_storage: {path: "$dir/reports"}}
YAML
  echo "== inference-perf --config_file $dir/config.yml"
  (cd "$dir" && "$IP_VENV/bin/inference-perf" --config_file config.yml) \
    >"$dir/run.log" 2>&1 || { tail -40 "$dir/run.log"; return 1; }
  "$PY" - "$dir/reports/summary_lifecycle_metrics.json" <<'PYEOF'
import json, sys
d = json.load(open(sys.argv[1]))
ok, lat, tp = d["successes"], d["successes"]["latency"], d["successes"]["throughput"]
print(
    f"inference-perf: {ok['count']} ok, {d['failures']['count']} failed, "
    f"{tp['requests_per_sec']:.2f} req/s, {tp['output_tokens_per_sec']:.1f} output tok/s; "
    f"TTFT mean / p99 {lat['time_to_first_token']['mean'] * 1e3:.1f} / "
    f"{lat['time_to_first_token']['p99'] * 1e3:.1f} ms; TPOT mean "
    f"{lat['time_per_output_token']['mean'] * 1e3:.2f} ms; request latency mean "
    f"{lat['request_latency']['mean'] * 1e3:.1f} ms"
)
PYEOF
}

run_aiperf() {
  local dir="$OUT/aiperf"
  mkdir -p "$dir"
  local argv=(
    profile --url "$URL" --endpoint-type completions --streaming -m "$MODEL" --tokenizer "$ROOT"
    --synthetic-input-tokens-mean "$INPUT_TOKENS" --synthetic-input-tokens-stddev 0
    --output-tokens-mean "$OUTPUT_TOKENS" --output-tokens-stddev 0 --extra-inputs ignore_eos:true
    --request-count "$REQUESTS" --concurrency 4 --artifact-dir "$dir" --ui-type none
  )
  echo "== aiperf ${argv[*]}"
  # aiperf 0.13 in HF offline mode looks a local path up as a hub repo id (HFValidationError):
  # without the offline flags it loads the directory as a path, and downloads nothing.
  env -u HF_HUB_OFFLINE -u TRANSFORMERS_OFFLINE "$AP_VENV/bin/aiperf" "${argv[@]}" \
    >"$dir/run.log" 2>&1 || { tail -40 "$dir/run.log"; return 1; }
  "$PY" - "$dir/profile_export_aiperf.json" <<'PYEOF'
import json, sys
d = json.load(open(sys.argv[1]))
def m(k, f="avg"):
    return d[k][f]
print(
    f"aiperf: {m('request_count'):.0f} requests, errors {d.get('error_summary') or 'none'}, "
    f"{m('request_throughput'):.2f} req/s, {m('output_token_throughput'):.1f} output tok/s; "
    f"TTFT avg / p99 {m('time_to_first_token'):.1f} / {m('time_to_first_token', 'p99'):.1f} ms; "
    f"ITL avg {m('inter_token_latency'):.2f} ms; request latency avg {m('request_latency'):.1f} ms"
)
PYEOF
}

rc=0
for h in "${HARNESSES[@]}"; do
  case "$h" in
    inference-perf) run_inference_perf || rc=1 ;;
    aiperf) run_aiperf || rc=1 ;;
    *) echo "unknown harness: $h (inference-perf, aiperf)" >&2; exit 2 ;;
  esac
done
exit $rc
