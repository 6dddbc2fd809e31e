#!/usr/bin/env bash
# bench/vllm_fleet.sh: a real vLLM fleet: two vLLM CPU servers behind sglang-router (cache_aware),
# driven by `vllm bench serve` with shared prefixes, each server's own files recorded apart (issue
# 52 item 8). Not part of CI: it needs the vLLM venv of bench/vllm_cpu.sh and the router's venv of
# bench/sglang_router.sh. Binds 127.0.0.1 only (KV events over ipc://); every wait is bounded;
# everything it starts it stops (trap).
#
#   bash bench/vllm_fleet.sh          # writes $DEST (default data/imports/vllm_fleet)
#
# Per replica K (0, 1): one recorder (bench/vllm_cpu/record_telemetry.py: its OTLP port, its KV
# events over ipc://$RAW/kvK.ipc, its server's /metrics every 0.5 s) and one `vllm serve` (flags
# below; the engine's OpenMP thread bound to core K). The router: sglang-router $SGLANG_ROUTER_VERSION
# `--policy cache_aware` over both. The client: `vllm bench serve` against the router with
# bench/vllm_repeats/make_datasets.py's wA workload (64 requests, 8 prefixes x 8 of 128 shared +
# 64 own tokens, 48 out, Poisson 8/s), `--request-id-prefix fleet-` (each request's X-Request-Id:
# fleet-0 .. fleet-63 in the dataset's order) and `--metadata request_id_prefix=fleet-` (the prefix
# written into the result file, where the importer reads it).
#
# $DEST/replica0/, replica1/: server.log.gz (the whole log), spans.otlp.jsonl, kv_events.jsonl (raw
#   ZMQ frames, as record_telemetry.py writes them), metrics_scrapes.jsonl.gz (from 3 s before the
#   client's start)
# $DEST/vllm_bench_fleet.json (the client's result), client_stdout.txt, dataset.jsonl,
#   router.log (its debug log: the worker each request was sent to), commands.txt, versions.txt
#
# Knobs: DEST, RAW (/tmp/vllm_fleet_raw), VLLM_VENV (/opt/vllm-venv), ROUTER_VENV
# (/work/venvs/sglang-router), MODEL_DIR (/tmp/vllm_repeats_model), POLICY (cache_aware).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SGLANG_ROUTER_VERSION=0.3.2
VENV=${VLLM_VENV:-/opt/vllm-venv}; VPY=$VENV/bin/python; VLLM=$VENV/bin/vllm
RPY=${ROUTER_VENV:-/work/venvs/sglang-router}/bin/python
DEST=${DEST:-$ROOT/data/imports/vllm_fleet}; RAW=${RAW:-/tmp/vllm_fleet_raw}
MODEL_DIR=${MODEL_DIR:-/tmp/vllm_repeats_model}; POLICY=${POLICY:-cache_aware}
PORTS=(8311 8312); OTLP=(4318 4319); ROUTER_PORT=30011; PROM_PORT=29011
REC=$ROOT/bench/vllm_cpu/record_telemetry.py
rm -rf "$RAW"; mkdir -p "$RAW/ds"
# shellcheck source=bench/process_groups.sh
source "$ROOT/bench/process_groups.sh"     # PIDS, stop_group, cleanup (on EXIT)
record() { printf '%q ' "$@" >> "$RAW/commands.txt"; echo >> "$RAW/commands.txt"; }
wait_http() {  # URL PID LOG SECONDS
  local t0; t0=$(date +%s)
  until curl -sf -o /dev/null --max-time 2 "$1"; do
    kill -0 "$2" 2>/dev/null || { tail -n 40 "$3" >&2; echo "died: $3" >&2; exit 1; }
    (( $(date +%s) - t0 > $4 )) && { tail -n 40 "$3" >&2; echo "not ready after $4 s: $1" >&2; exit 1; }
    sleep 1
  done
}

[ -x "$VLLM" ] || { echo "no vLLM at $VLLM: make the venv as bench/vllm_cpu.sh does" >&2; exit 1; }
[ -x "$RPY" ] || { echo "no sglang-router at $RPY: python3 -m venv ${RPY%/bin/python} && ${RPY%/python}/pip install sglang-router==$SGLANG_ROUTER_VERSION" >&2; exit 1; }
if [ ! -f "$MODEL_DIR/config.json" ]; then
  (cd "$ROOT" && python -m gpu_runner export-hf --model tiny --out "$MODEL_DIR" --eos-token-id 257 --bos-token-id 256)
fi
python3 "$ROOT/bench/vllm_repeats/make_datasets.py" "$RAW/ds" > /dev/null

for k in 0 1; do
  cmd=("$VPY" "$REC" record --dir "$RAW/rec$k" --kv "ipc://$RAW/kv$k.ipc" --otlp-port "${OTLP[$k]}"
       --metrics-url "http://127.0.0.1:${PORTS[$k]}/metrics" --metrics-every 0.5)
  record "${cmd[@]}"; mkdir -p "$RAW/rec$k"
  setsid "${cmd[@]}" > "$RAW/recorder$k.log" 2>&1 < /dev/null &
  PIDS+=("$!")
  wait_http "http://127.0.0.1:${OTLP[$k]}/health" "$!" "$RAW/recorder$k.log" 20
done
SRV=()
for k in 0 1; do
  cmd=(env PYTHONPATH="$ROOT/bench/vllm_cpu" VLLM_TARGET_DEVICE=cpu VLLM_CPU_KVCACHE_SPACE=1
    VLLM_CPU_OMP_THREADS_BIND="$k" VLLM_SERVER_DEV_MODE=1 OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf
    OTEL_BSP_SCHEDULE_DELAY=200
    "$VLLM" serve "$MODEL_DIR" --served-model-name tiny --host 127.0.0.1 --port "${PORTS[$k]}" --dtype float32
    --max-model-len 512 --max-num-seqs 16 --max-num-batched-tokens 2048 --block-size 32 --enable-prefix-caching
    --num-gpu-blocks-override 64 --generation-config vllm --seed 0 --enable-logging-iteration-details
    --kv-events-config "{\"enable_kv_cache_events\": true, \"publisher\": \"zmq\", \"endpoint\": \"ipc://$RAW/kv$k.ipc\", \"topic\": \"kv-events\"}"
    --otlp-traces-endpoint "http://127.0.0.1:${OTLP[$k]}/v1/traces")
  record "${cmd[@]}"
  setsid "${cmd[@]}" > "$RAW/server$k.log" 2>&1 < /dev/null &
  SRV+=("$!"); PIDS=("$!" "${PIDS[@]}")
done
for k in 0 1; do wait_http "http://127.0.0.1:${PORTS[$k]}/health" "${SRV[$k]}" "$RAW/server$k.log" 600; done
echo "both servers ready" >&2

cmd=("$RPY" -m sglang_router.launch_router --worker-urls "http://127.0.0.1:${PORTS[0]}" "http://127.0.0.1:${PORTS[1]}"
     --policy "$POLICY" --host 127.0.0.1 --port "$ROUTER_PORT" --prometheus-host 127.0.0.1
     --prometheus-port "$PROM_PORT" --log-level debug)
record "${cmd[@]}"
setsid "${cmd[@]}" > "$RAW/router_raw.log" 2>&1 < /dev/null &
RPID=$!; PIDS=("$RPID" "${PIDS[@]}")
t0=$(date +%s)
until curl -sf --max-time 2 "http://127.0.0.1:$ROUTER_PORT/workers" 2>/dev/null | grep -q "${PORTS[1]}"; do
  kill -0 "$RPID" 2>/dev/null || { tail -n 40 "$RAW/router_raw.log" >&2; echo "router died" >&2; exit 1; }
  (( $(date +%s) - t0 > 120 )) && { tail -n 40 "$RAW/router_raw.log" >&2; echo "router: workers not registered" >&2; exit 1; }
  sleep 1
done
curl -sf "http://127.0.0.1:$ROUTER_PORT/workers" > "$RAW/router_workers.json"
echo "router up: $(cat "$RAW/router_workers.json" | head -c 300)" >&2

date -u +%Y-%m-%dT%H:%M:%SZ > "$RAW/started_utc.txt"; date +%s%N > "$RAW/client_start_ns.txt"
cmd=(nice -n -10 env PYTHONPATH="$ROOT/bench/vllm_cpu" VLLM_TARGET_DEVICE=cpu "$VLLM" bench serve --backend openai
  --base-url "http://127.0.0.1:$ROUTER_PORT" --endpoint /v1/completions --model tiny --tokenizer "$MODEL_DIR"
  --dataset-name custom --dataset-path "$RAW/ds/wA_poisson8_p192_o48.jsonl" --disable-shuffle --skip-chat-template
  --custom-output-len 48 --num-prompts 64 --ignore-eos --temperature 0 --seed 0 --request-rate 8
  --request-id-prefix fleet- --metadata request_id_prefix=fleet- --percentile-metrics ttft,tpot,itl,e2el
  --save-result --save-detailed --result-dir "$RAW" --result-filename vllm_bench_fleet.json)
record "${cmd[@]}"
"${cmd[@]}" > "$RAW/client_stdout.txt" 2>&1 || { tail -n 30 "$RAW/client_stdout.txt" >&2; exit 1; }
grep -E "Successful|Failed|Output token throughput|Mean TTFT|Mean E2EL" "$RAW/client_stdout.txt" >&2 || true
sleep 2     # (the last spans leave the servers within OTEL_BSP_SCHEDULE_DELAY)

stop_group "$RPID"
for k in 0 1; do stop_group "${SRV[$k]}"; done
sleep 1
cleanup
"$VPY" -c 'import vllm, torch; print("vllm", vllm.__version__, "torch", torch.__version__)' > "$RAW/versions.txt" 2>/dev/null || true
"$RPY" -m pip freeze 2>/dev/null | grep -i sglang >> "$RAW/versions.txt" || true
"$VPY" "$ROOT/bench/vllm_fleet_finish.py" "$RAW" "$DEST"
