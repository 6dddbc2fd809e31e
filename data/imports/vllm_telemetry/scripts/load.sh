#!/usr/bin/env bash
# load phases against the running vllm serve (127.0.0.1:8301); record_telemetry.py record runs throughout
set -euo pipefail
R=/work/vllmrun; D=/work/main/data/imports/vllm_telemetry; REC=/work/main/bench/vllm_cpu/record_telemetry.py
VPY=/work/venvs/vllm/bin/python; VLLM=/work/venvs/vllm/bin/vllm
VENV_ENV=(env PYTHONPATH=/work/main/bench/vllm_cpu VLLM_TARGET_DEVICE=cpu)
mark() { echo "$1 $(date +%s%N)" | tee -a $R/logs/marks.txt; }
bench() {  # NAME DATASET OUTLEN OUTDIR extra...
  local name=$1 ds=$2 olen=$3 out=$4; shift 4
  nice -n -10 "${VENV_ENV[@]}" $VLLM bench serve --backend openai --base-url http://127.0.0.1:8301 \
    --endpoint /v1/completions --model tiny --tokenizer /work/vllmrun/model \
    --dataset-name custom --dataset-path "$ds" --disable-shuffle --skip-chat-template \
    --custom-output-len "$olen" --num-prompts 48 --ignore-eos --temperature 0 --seed 0 \
    --percentile-metrics ttft,tpot,itl,e2el \
    --save-result --save-detailed --result-dir "$out" --result-filename "vllm_bench_$name.json" "$@" \
    > "$out/vllm_bench_$name.log" 2>&1
}
scrape_start() { setsid $VPY $REC scrape --url http://127.0.0.1:8301/metrics --every 0.5 --out "$1" > "$1.log" 2>&1 < /dev/null & SCR=$!; }
scrape_stop() { kill -TERM $SCR; wait $SCR || true; }
mkdir -p $D/run1_c4_p128_o32 $D/run2_poisson4_p192_o48 $R/warmup
echo "# load.sh $(date -u +%FT%TZ)" >> $R/logs/marks.txt
mark warmup_start
nice -n -10 "${VENV_ENV[@]}" $VLLM bench serve --backend openai --base-url http://127.0.0.1:8301 \
    --endpoint /v1/completions --model tiny --tokenizer /work/vllmrun/model \
    --dataset-name custom --dataset-path $R/datasets/warmup.jsonl --disable-shuffle --skip-chat-template \
    --custom-output-len 32 --num-prompts 16 --ignore-eos --temperature 0 --seed 0 --max-concurrency 4 \
    --save-result --result-dir $R/warmup --result-filename warmup.json > $R/warmup/warmup.log 2>&1
mark warmup_end
sleep 2
O1=$D/run1_c4_p128_o32
scrape_start $O1/metrics_scrapes.jsonl
mark run1_start
bench run1 $R/datasets/run1.jsonl 32 $O1 --max-concurrency 4 --request-rate inf
mark run1_end
sleep 2
mark reset_call
curl -s -X POST http://127.0.0.1:8301/reset_prefix_cache -w ' http=%{http_code}\n' | tee $R/logs/reset_response.txt
mark reset_returned
sleep 2
scrape_stop
mark run1_scrape_stopped
O2=$D/run2_poisson4_p192_o48
scrape_start $O2/metrics_scrapes.jsonl
mark run2_start
bench run2 $R/datasets/run2.jsonl 48 $O2 --request-rate 4
mark run2_end
sleep 3
scrape_stop
curl -s http://127.0.0.1:8301/metrics > $R/logs/metrics_after.txt
mark done
