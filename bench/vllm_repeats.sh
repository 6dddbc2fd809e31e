#!/usr/bin/env bash
# bench/vllm_repeats.sh: the real engine's own repeat noise, and runs to fit and predict, from ONE
# start of vLLM's CPU server. Not part of CI (it needs the vLLM venv of bench/vllm_cpu.sh).
#
#   SESSION=s1 ROUNDS=3 bash bench/vllm_repeats.sh
#
# One recorder (bench/vllm_cpu/record_telemetry.py: OTLP spans, KV events), one `vllm serve` (flags
# below), an unmeasured warm-up, then ROUNDS rounds; each round runs every workload of
# bench/vllm_repeats/make_datasets.py once (WORKLOADS: a subset, comma-separated), in the same
# order, so that the machine's drift over minutes falls on every workload alike. Before each run the
# prefix cache is reset (POST /reset_prefix_cache, VLLM_SERVER_DEV_MODE=1): every repeat starts from
# an empty cache and sends the same prompts at the same Poisson times (`vllm bench serve --seed 0`).
# Then bench/vllm_repeats/finish.py cuts the session into one folder per run:
#   $DEST/$SESSION/<workload>_r<K>/   server.log.gz (this run's part of the log: no start-up lines),
#                                     spans.otlp.jsonl, kv_events.jsonl (raw: record_telemetry.py
#                                     kv-decode reads it), the client's result and its stdout
#                                     (client_stdout.txt), dataset.jsonl, quiet.txt
#   $DEST/$SESSION/server_start.log   the log up to the first measured run (start-up lines: flags)
#   $DEST/$SESSION/session.json       marks, commands, versions, counts
# and `python -m core fidelity --repeats` reads a workload's repeats.
#
# Knobs: SESSION (required), DEST (data/imports/vllm_repeats), ROUNDS (3), WORKLOADS (all),
# VLLM_VENV (/opt/vllm-venv), MODEL_DIR (/tmp/vllm_repeats_model: the tiny model exported to HF
# form, made if missing), PORT (8301), MAX_SEQS (16), BLOCK_SIZE (32), NUM_BLOCKS (64),
# TOKEN_BUDGET (2048), AIPERF / GUIDELLM / INFERENCE_PERF (the other clients' venvs, /work/venvs/<name>:
# bench/vllm_repeats/CLIENTS.md), QUIET_WAIT (120: s to wait before each run until no foreign process uses
# over 20% of a core), RAW (/tmp/vllm_repeats_raw).
set -euo pipefail
: "${SESSION:?set SESSION (the folder name of this server start)}"
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${VLLM_VENV:-/opt/vllm-venv}; VPY=$VENV/bin/python; VLLM=$VENV/bin/vllm
DEST=${DEST:-$ROOT/data/imports/vllm_repeats}; RAW=${RAW:-/tmp/vllm_repeats_raw}/$SESSION
MODEL_DIR=${MODEL_DIR:-/tmp/vllm_repeats_model}; PORT=${PORT:-8301}; ROUNDS=${ROUNDS:-3}
REC=$ROOT/bench/vllm_cpu/record_telemetry.py; QUIET=$ROOT/data/imports/vllm_telemetry/scripts/wait_quiet.py
VENV_ENV=(env PYTHONPATH=$ROOT/bench/vllm_cpu VLLM_TARGET_DEVICE=cpu)
rm -rf "$RAW"; mkdir -p "$RAW/client" "$RAW/ds"
mark() { echo "$1 $(date +%s%N)" >> "$RAW/marks.txt"; }
# shellcheck source=bench/process_groups.sh
source "$ROOT/bench/process_groups.sh"     # PIDS, stop_group, cleanup (on EXIT)

[ -x "$VLLM" ] || { echo "no vLLM at $VLLM: make the venv as bench/vllm_cpu.sh does" >&2; exit 1; }
if [ ! -f "$MODEL_DIR/config.json" ]; then
  (cd "$ROOT" && python -m gpu_runner export-hf --model tiny --out "$MODEL_DIR" --eos-token-id 257 --bos-token-id 256)
fi
mapfile -t PLAN < <(python3 "$ROOT/bench/vllm_repeats/make_datasets.py" "$RAW/ds")
keep=()   # (WORKLOADS unset: every `vllm bench serve` workload; the other clients' only when named)
for line in "${PLAN[@]}"; do
  if [ -n "${WORKLOADS:-}" ]; then [[ ",$WORKLOADS," == *",${line%%|*},"* ]] && keep+=("$line")
  else [[ $line == *"|vllm" ]] && keep+=("$line"); fi
done
PLAN=("${keep[@]}")
[ ${#PLAN[@]} -gt 0 ] || { echo "no workload chosen" >&2; exit 1; }

mark recorder_start
setsid "$VPY" "$REC" record --dir "$RAW/rec" --kv tcp://127.0.0.1:5557 --otlp-port 4318 > "$RAW/recorder.log" 2>&1 < /dev/null &
RECPID=$!; PIDS+=("$RECPID")
for i in $(seq 1 50); do curl -sf -o /dev/null --max-time 1 http://127.0.0.1:4318/health && break; sleep 0.2; done

SERVER_CMD=(env PYTHONPATH=$ROOT/bench/vllm_cpu VLLM_TARGET_DEVICE=cpu VLLM_CPU_KVCACHE_SPACE=1
  VLLM_SERVER_DEV_MODE=1 OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf OTEL_BSP_SCHEDULE_DELAY=200
  "$VLLM" serve "$MODEL_DIR" --served-model-name tiny
  --host 127.0.0.1 --port "$PORT" --dtype float32 --max-model-len 512 --max-num-seqs "${MAX_SEQS:-16}"
  --max-num-batched-tokens "${TOKEN_BUDGET:-2048}" --block-size "${BLOCK_SIZE:-32}" --enable-prefix-caching
  --num-gpu-blocks-override "${NUM_BLOCKS:-64}" --generation-config vllm --seed 0 --enable-logging-iteration-details
  --chat-template "$ROOT/bench/vllm_repeats/chat_template.jinja"
  --kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5557", "topic": "kv-events"}'
  --otlp-traces-endpoint http://127.0.0.1:4318/v1/traces)
printf '%q ' "${SERVER_CMD[@]}" > "$RAW/server_cmd.txt"; echo >> "$RAW/server_cmd.txt"
mark server_start
setsid "${SERVER_CMD[@]}" > "$RAW/server.log" 2>&1 < /dev/null &
SRVPID=$!; PIDS=("$SRVPID" "${PIDS[@]}")
t0=$(date +%s)
until curl -sf -o /dev/null --max-time 2 "http://127.0.0.1:$PORT/health"; do
  kill -0 "$SRVPID" 2>/dev/null || { tail -n 40 "$RAW/server.log" >&2; echo "server died" >&2; exit 1; }
  (( $(date +%s) - t0 > 400 )) && { tail -n 40 "$RAW/server.log" >&2; echo "server not ready" >&2; exit 1; }
  sleep 1
done
mark server_ready
echo "$SESSION: server ready after $(( $(date +%s) - t0 )) s" >&2

bench() {  # DATASET OUTPUT_LEN N RESULT_NAME LOG client-flags...
  local ds=$1 olen=$2 n=$3 res=$4 log=$5; shift 5
  local cmd=(nice -n -10 "${VENV_ENV[@]}" "$VLLM" bench serve --backend openai --base-url "http://127.0.0.1:$PORT"
    --endpoint /v1/completions --model tiny --tokenizer "$MODEL_DIR" --dataset-name custom --dataset-path "$ds"
    --disable-shuffle --skip-chat-template --custom-output-len "$olen" --num-prompts "$n" --ignore-eos
    --temperature 0 --seed 0 --percentile-metrics ttft,tpot,itl,e2el --save-result --save-detailed
    --result-dir "$RAW/client" --result-filename "$res" "$@")
  printf '%q ' "${cmd[@]}" >> "$RAW/client_cmds.txt"; echo >> "$RAW/client_cmds.txt"
  "${cmd[@]}" > "$log" 2>&1
}

other_client() {  # CLIENT TAG N INPUT OUTPUT: the run's files under $RAW/client/$TAG/
  local client=$1 tag=$2 n=$3 isl=$4 osl=$5 d="$RAW/client/$2" cmd
  mkdir -p "$d"
  # (AIPerf 0.13 under HF_HUB_OFFLINE=1 takes a local tokenizer folder for a hub id and fails: not set;
  # a local path never reaches the hub)
  case $client in
    aiperf) cmd=(nice -n -10 "${AIPERF:-/work/venvs/aiperf}/bin/aiperf" profile --model tiny
      --url "http://127.0.0.1:$PORT" --endpoint-type chat --streaming --tokenizer "$MODEL_DIR" --request-count "$n"
      --concurrency 4 --synthetic-input-tokens-mean "$isl" --synthetic-input-tokens-stddev 0
      --output-tokens-mean "$osl" --output-tokens-stddev 0 --extra-inputs ignore_eos:true
      --extra-inputs "min_tokens:$osl" --random-seed 42 --no-gpu-telemetry --ui-type none --artifact-dir "$d/out");;
    guidellm) cmd=(nice -n -10 env HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 "${GUIDELLM:-/work/venvs/guidellm}/bin/guidellm"
      run --backend "kind=openai_http,target=http://127.0.0.1:$PORT,model=tiny,request_format=/v1/completions,stream=true"
      --tokenizer "kind=huggingface_auto,model=$MODEL_DIR" --profile '{"kind":"sweep","sweep_size":4}'
      --constraint "kind=max_requests,count=$(( n / 4 ))" --data "kind=synthetic_text,prompt_tokens=$isl,output_tokens=$osl"
      --output "kind=json,path=$d/out/benchmarks.json" --disable-progress);;
    inference-perf) python3 "$ROOT/bench/vllm_repeats/ip_config.py" "$d/out" "$PORT" "$MODEL_DIR" "$isl" "$osl" > "$d/ip.yaml"
      cmd=(nice -n -10 env HF_HUB_OFFLINE=1 "${INFERENCE_PERF:-/work/venvs/inference-perf}/bin/inference-perf" -c "$d/ip.yaml");;
    *) echo "unknown client $client" >&2; return 1;;
  esac
  printf '%q ' "${cmd[@]}" >> "$RAW/client_cmds.txt"; echo >> "$RAW/client_cmds.txt"
  (cd "$d" && "${cmd[@]}") > "$d/stdout.txt" 2>&1
}

mark warmup_start
bench "$RAW/ds/warmup.jsonl" 16 8 warmup.json "$RAW/client/warmup.log" --max-concurrency 4 --request-rate inf
mark warmup_end
for r in $(seq 1 "$ROUNDS"); do
  for line in "${PLAN[@]}"; do
    IFS='|' read -r name n olen flags client <<< "$line"
    tag=${name}_r$r
    sleep 1
    mark "reset_call_$tag"
    curl -s -X POST "http://127.0.0.1:$PORT/reset_prefix_cache" -w " http=%{http_code}\n" >> "$RAW/reset_responses.txt"
    mark "reset_returned_$tag"
    echo "$tag $(python3 "$QUIET" "${QUIET_WAIT:-120}" "$SRVPID" "$RECPID")  load $(cut -d' ' -f1-3 /proc/loadavg)" >> "$RAW/quiet.txt"
    mark "start_$tag"
    if [ "$client" = vllm ]; then
      # shellcheck disable=SC2086
      bench "$RAW/ds/$name.jsonl" "$olen" "$n" "vllm_bench_$tag.json" "$RAW/client/vllm_bench_$tag.log" $flags
      mark "end_$tag"
      grep -E "Mean TTFT|Mean E2EL" "$RAW/client/vllm_bench_$tag.log" | tr -s ' ' | paste -sd' ' | sed "s/^/$tag: /" >&2
    else
      other_client "$client" "$tag" "$n" "$flags" "$olen" || echo "$tag: $client exited $?" >&2
      mark "end_$tag"
      echo "$tag: $client done ($(ls "$RAW/client/$tag/out" 2>/dev/null | tr '\n' ' '))" >&2
    fi
    sleep 2    # (the last spans leave the server within OTEL_BSP_SCHEDULE_DELAY)
  done
done
mark server_stop
stop_group "$SRVPID"
mark server_exited
sleep 1
stop_group "$RECPID"
"$VPY" "$ROOT/bench/vllm_repeats/finish.py" "$RAW" "$DEST/$SESSION"
