#!/usr/bin/env bash
# One run = one recorder + one `vllm serve` + warm-up + reset + one measured `vllm bench serve`.
#
#   run_one.sh NAME KEY OUTLEN NPROMPTS [client flags...]
#     NAME   the run folder under data/imports/vllm_telemetry/ (e.g. run4_poisson8_p128_o32)
#     KEY    the dataset key: /work/vllmrun/datasets/KEY.jsonl (measured) and KEY_warmup.jsonl
#            (written by make_datasets_2.py)
#     client flags: e.g. --max-concurrency 8 --request-rate inf, or --request-rate 8
#   server flags that differ from the base (scripts/serve.sh), by environment:
#     PREFIX_FLAG (--enable-prefix-caching), BLOCK_SIZE (32), NUM_BLOCKS (64), MAX_SEQS (16)
#
# Raw captures go to /work/vllmrun/runs/NAME/; finish_run.py then fills the run folder.
set -euo pipefail
NAME=$1 KEY=$2 OLEN=$3 NP=$4; shift 4
PREFIX_FLAG=${PREFIX_FLAG:---enable-prefix-caching}
BLOCK_SIZE=${BLOCK_SIZE:-32}; NUM_BLOCKS=${NUM_BLOCKS:-64}; MAX_SEQS=${MAX_SEQS:-16}
VENV=/opt/vllm-venv; VPY=$VENV/bin/python; VLLM=$VENV/bin/vllm
REC=/work/main/bench/vllm_cpu/record_telemetry.py
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
R=/work/vllmrun/runs/$NAME; DS=/work/vllmrun/datasets; PORT=8301
VENV_ENV=(env PYTHONPATH=/work/main/bench/vllm_cpu VLLM_TARGET_DEVICE=cpu)
rm -rf "$R"; mkdir -p "$R/warmup" "$R/client"
: > "$R/marks.txt"; : > "$R/loadavg.txt"
mark() { echo "$1 $(date +%s%N)" >> "$R/marks.txt"; }
loadavg() {  # LABEL [top]: /proc/loadavg, and (with top) every process over 20% of a core in a 1 s top sample
  echo "$1 $(date -u +%FT%T.%3NZ)  $(cat /proc/loadavg)" >> "$R/loadavg.txt"
  if [ "${2:-}" = top ]; then
    top -b -c -n 2 -d 1 -w 200 2>/dev/null | awk '/^top -/{f++} f == 2 && $1 ~ /^[0-9]+$/ && $9 + 0 >= 20 {printf "    busy: pid %s %s%% CPU:", $1, $9; for (i = 12; i <= NF && i < 16; i++) printf " %s", $i; print ""}' | head -n 6 >> "$R/loadavg.txt" || true
  fi
}
PIDS=()
stop_group() {  # PID: TERM its process group, KILL after 30 s
  local pid=$1 i
  kill -0 -- "-$pid" 2>/dev/null || return 0
  kill -TERM -- "-$pid" 2>/dev/null || true
  for i in $(seq 1 60); do kill -0 -- "-$pid" 2>/dev/null || return 0; sleep 0.5; done
  echo "process group $pid alive after 30 s: SIGKILL" >&2; kill -KILL -- "-$pid" 2>/dev/null || true
}
cleanup() { local p; for p in "${PIDS[@]}"; do stop_group "$p"; done; }
trap cleanup EXIT
for p in $PORT 4318; do
  if curl -s -o /dev/null --max-time 2 "http://127.0.0.1:$p/"; then echo "port $p already in use" >&2; exit 1; fi
done

# 1. recorder first (vLLM exports start-up spans before it answers /health)
mark recorder_start
setsid "$VPY" "$REC" record --dir "$R/rec" --kv tcp://127.0.0.1:5557 --otlp-port 4318 > "$R/recorder.log" 2>&1 < /dev/null &
RECPID=$!; PIDS+=("$RECPID")
for i in $(seq 1 50); do curl -sf -o /dev/null --max-time 1 http://127.0.0.1:4318/health && break; sleep 0.2; done

# 2. server
SERVER_CMD=(env PYTHONPATH=/work/main/bench/vllm_cpu VLLM_TARGET_DEVICE=cpu VLLM_CPU_KVCACHE_SPACE=1
  VLLM_SERVER_DEV_MODE=1 OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf OTEL_BSP_SCHEDULE_DELAY=200
  "$VLLM" serve /work/vllmrun/model --served-model-name tiny
  --host 127.0.0.1 --port $PORT --dtype float32 --max-model-len 512 --max-num-seqs "$MAX_SEQS"
  --max-num-batched-tokens 2048 --block-size "$BLOCK_SIZE" "$PREFIX_FLAG" --num-gpu-blocks-override "$NUM_BLOCKS"
  --generation-config vllm --seed 0 --enable-logging-iteration-details
  --kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5557", "topic": "kv-events"}'
  --otlp-traces-endpoint http://127.0.0.1:4318/v1/traces)
printf '%q ' "${SERVER_CMD[@]}" > "$R/server_cmd.txt"; echo >> "$R/server_cmd.txt"
mark server_start
setsid "${SERVER_CMD[@]}" > "$R/server.log" 2>&1 < /dev/null &
SRVPID=$!; PIDS=("$SRVPID" "${PIDS[@]}")
t0=$(date +%s)
until curl -sf -o /dev/null --max-time 2 http://127.0.0.1:$PORT/health; do
  if ! kill -0 "$SRVPID" 2>/dev/null; then tail -n 40 "$R/server.log" >&2; echo "server died" >&2; exit 1; fi
  if (( $(date +%s) - t0 > 400 )); then tail -n 40 "$R/server.log" >&2; echo "server not ready" >&2; exit 1; fi
  sleep 1
done
mark server_ready
echo "$NAME: server ready after $(( $(date +%s) - t0 )) s" >&2

bench() {  # DATASET OLEN N RESULTDIR RESULTNAME LOG extra...
  local ds=$1 olen=$2 n=$3 dir=$4 res=$5 log=$6; shift 6
  local cmd=(nice -n -10 "${VENV_ENV[@]}" "$VLLM" bench serve --backend openai --base-url http://127.0.0.1:$PORT
    --endpoint /v1/completions --model tiny --tokenizer /work/vllmrun/model
    --dataset-name custom --dataset-path "$ds" --disable-shuffle --skip-chat-template
    --custom-output-len "$olen" --num-prompts "$n" --ignore-eos --temperature 0 --seed 0
    --percentile-metrics ttft,tpot,itl,e2el --save-result "$@" --result-dir "$dir" --result-filename "$res")
  printf '%q ' "${cmd[@]}" >> "$R/client_cmds.txt"; echo >> "$R/client_cmds.txt"
  "${cmd[@]}" > "$log" 2>&1
}

# 3. warm-up: 8 other prompts, unmeasured
mark warmup_start
bench "$DS/${KEY}_warmup.jsonl" 16 8 "$R/warmup" warmup.json "$R/warmup/warmup.log" --max-concurrency 4 --request-rate inf
mark warmup_end
sleep 1
# 4. reset the prefix cache (VLLM_SERVER_DEV_MODE=1), wait 2 s
mark reset_call
curl -s -X POST http://127.0.0.1:$PORT/reset_prefix_cache -w ' http=%{http_code}\n' > "$R/reset_response.txt"
mark reset_returned
setsid "$VPY" "$REC" scrape --url http://127.0.0.1:$PORT/metrics --every 0.5 --out "$R/metrics_scrapes_all.jsonl" > "$R/scrape.log" 2>&1 < /dev/null &
SCRPID=$!; PIDS=("$SCRPID" "${PIDS[@]}")
# the VM is shared: wait (at most QUIET_WAIT s, default 300) until no process outside our sessions
# uses >20% of a core; what it saw goes to loadavg.txt
echo "quiet_check $(date -u +%FT%T.%3NZ)  $(python3 /work/main/data/imports/vllm_telemetry/scripts/wait_quiet.py "${QUIET_WAIT:-300}" "$SRVPID" "$RECPID" "$SCRPID")" >> "$R/loadavg.txt"
loadavg before_top top          # takes ~1-2 s (a top sample), server idle
# during the measured run: a 1 s sampler of foreign processes over 20% of a core (lines in loadavg.txt)
python3 /work/main/data/imports/vllm_telemetry/scripts/wait_quiet.py --monitor "$SRVPID" "$RECPID" "$SCRPID" > "$R/foreign_busy.txt" 2>&1 &
MONPID=$!
sleep 1
# 5. measured run
loadavg before
mark run_start
rc=0
bench "$DS/$KEY.jsonl" "$OLEN" "$NP" "$R/client" "vllm_bench_$NAME.json" "$R/client/vllm_bench_$NAME.log" --save-detailed "$@" || rc=$?
mark run_end
loadavg after
kill -TERM "$MONPID" 2>/dev/null || true; wait "$MONPID" 2>/dev/null || true
{ echo "foreign processes over 20% of a core, 1 s samples from before 'before' to 'after' ($(wc -l < "$R/foreign_busy.txt") busy samples):"; sed 's/^/    /' "$R/foreign_busy.txt"; } >> "$R/loadavg.txt"
loadavg after_top top
sleep 2
stop_group "$SCRPID"
curl -s http://127.0.0.1:$PORT/metrics > "$R/metrics_after.txt"
# 6. stop the server (SIGTERM to its group: the last spans flush), then the recorder
mark server_stop
stop_group "$SRVPID"
mark server_exited
sleep 1
stop_group "$RECPID"
mark recorder_stopped
PIDS=()
[ "$rc" = 0 ] || { tail -n 30 "$R/client/vllm_bench_$NAME.log" >&2; echo "$NAME: client failed rc=$rc" >&2; exit 1; }
sed -n '/Serving Benchmark Result/,/^=*$/p' "$R/client/vllm_bench_$NAME.log" | grep -v '^\s*$' >&2 || true
"$VPY" "$HERE/finish_run.py" "$NAME" "$KEY"
