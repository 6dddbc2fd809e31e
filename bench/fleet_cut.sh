#!/usr/bin/env bash
# bench/fleet_cut.sh: what a client sees when a fleet's replica dies under its stream (issue 52 item 7).
# Not part of CI: it needs the router's venv of bench/sglang_router.sh and the vLLM venv of
# bench/vllm_cpu.sh (for its benchmark client). Binds 127.0.0.1 only; everything it starts it stops.
#
#   bash bench/fleet_cut.sh        # prints both parts' results; files under $OUT (/tmp/fleet_cut)
#
# 1. A real router: sglang-router 0.3.2 (round_robin) in front of two `gpu_runner serve` replicas;
#    one long stream (1,800 tokens) through it, the replica serving it killed (SIGKILL) after 20 chunks:
#    curl's exit status and the stream's last lines say how the router ends the stream.
# 2. Our fleet: `gpu_runner fleet --replicas 2` driven by `vllm bench serve` (16 requests of 1,500
#    tokens, 8 at a time); replica 1 killed 0.5 s after it took its second request: vLLM's client counts the requests cut there as
#    failed (or not), and the fleet's trace keeps what each cut request streamed.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${OUT:-/tmp/fleet_cut}; RPY=${ROUTER_VENV:-/work/venvs/sglang-router}/bin/python
VLLM=${VLLM_VENV:-/opt/vllm-venv}/bin/vllm; MODEL_DIR=${MODEL_DIR:-/tmp/vllm_repeats_model}
rm -rf "$OUT"; mkdir -p "$OUT"
# shellcheck source=bench/process_groups.sh
source "$ROOT/bench/process_groups.sh"
cd "$ROOT"
up() { local i; for i in $(seq 1 120); do curl -sf -o /dev/null "$1" && return 0; sleep 0.5; done; echo "not up: $1" >&2; exit 1; }

echo "== 1. sglang-router, a worker killed under a stream"
for k in 0 1; do
  setsid python -m gpu_runner serve --port $((8401 + k)) --threads 1 --served-model-name tiny > "$OUT/r$k.log" 2>&1 &
  eval "P$k=$!"; PIDS+=("$!")
done
up http://127.0.0.1:8401/health; up http://127.0.0.1:8402/health
setsid "$RPY" -m sglang_router.launch_router --worker-urls http://127.0.0.1:8401 http://127.0.0.1:8402 \
  --policy round_robin --host 127.0.0.1 --port 30021 --prometheus-host 127.0.0.1 --prometheus-port 29021 \
  > "$OUT/router.log" 2>&1 &
PIDS+=("$!")
for i in $(seq 1 120); do curl -sf http://127.0.0.1:30021/workers 2>/dev/null | grep -q 8402 && break; sleep 0.5; done
set +e
curl -sN -m 60 http://127.0.0.1:30021/v1/completions -H 'Content-Type: application/json' -H 'X-Request-Id: cut-1' \
  -d '{"model":"tiny","prompt":"def f(x):","max_tokens":1800,"ignore_eos":true,"stream":true,"temperature":0}' \
  > "$OUT/router_stream.txt" &
CURL=$!
for i in $(seq 1 200); do [ "$(grep -c '^data' "$OUT/router_stream.txt")" -ge 20 ] && break; sleep 0.02; done
kill -KILL -- "-$P0" 2>/dev/null    # (round robin's first request goes to worker 0, 8401) after 20 chunks
wait $CURL; rc=$?
set -e
echo "curl exit status $rc (18: the body ended unfinished); data lines $(grep -c '^data' "$OUT/router_stream.txt");" \
  "[DONE]: $(grep -c '\[DONE\]' "$OUT/router_stream.txt"); error events: $(grep -c '"error"' "$OUT/router_stream.txt")"
cleanup; PIDS=()

echo "== 2. gpu_runner fleet, a replica killed under vllm bench serve"
setsid python -m gpu_runner fleet --replicas 2 --port 8501 --threads 1 --served-model-name tiny \
  --trace-out "$OUT/fleet.json.gz" > "$OUT/fleet.log" 2>&1 &
FP=$!; PIDS+=("$FP")
up http://127.0.0.1:8501/health
PID1=$(curl -s http://127.0.0.1:8501/health | python -c 'import json,sys; print(json.load(sys.stdin)["replicas"][1]["pid"])')
(for i in $(seq 1 600); do     # when replica 1 has two requests streaming (the client's test request went to 0)
   curl -s http://127.0.0.1:8501/metrics | grep -E '^gpu_runner:router_requests_total\{.*replica="1"\} [2-9]' -q && break
   sleep 0.1; done; sleep 0.5; kill -KILL "$PID1") &
env PYTHONPATH="$ROOT/bench/vllm_cpu" VLLM_TARGET_DEVICE=cpu "$VLLM" bench serve --backend openai \
  --base-url http://127.0.0.1:8501 --endpoint /v1/completions --model tiny --tokenizer "$MODEL_DIR" \
  --dataset-name random --random-input-len 32 --random-output-len 1500 --num-prompts 16 --ignore-eos \
  --max-concurrency 8 --request-rate inf --seed 0 --save-result --save-detailed --result-dir "$OUT" \
  --result-filename vllm_bench.json > "$OUT/vllm_bench.log" 2>&1 || true
grep -E "Successful requests|Failed requests" "$OUT/vllm_bench.log"
kill -TERM "$FP"; wait "$FP" || true
python - "$OUT" <<'EOF'
import json, sys
from core.trace import load_trace
out = sys.argv[1]
tr = load_trace(f"{out}/fleet.json.gz")
fin = tr.finishes
err = fin[fin["reason"] == "error"]
kept = {int(r): int((tr.tokens["req"] == r).sum()) for r in err["req"]}
doc = json.load(open(f"{out}/vllm_bench.json"))
print(f"trace: {len(tr.requests)} requests, {len(err)} ended 'error' on replica(s) {sorted(set(err['replica']))}, "
      f"tokens each kept: {sorted(kept.values())}; the client: {doc['completed']} completed, {doc['failed']} failed")
EOF
