#!/usr/bin/env bash
# Session 1: gpu_runner observe (+ record_telemetry.py record as a second SUB) started before vLLM;
# vllm bench serve twice (24 prompts each, max concurrency 4) with POST /reset_prefix_cache between.
set -uo pipefail
R=/work/obsrun; L=$R/logs; S=/work/main/data/imports/vllm_observed/scripts
VLLM=/work/venvs/vllm/bin/vllm; VPY=/work/venvs/vllm/bin/python
mark() { echo "$1 $(date +%s%N)" | tee -a $L/marks1.txt; }
metrics() { curl -s http://127.0.0.1:8501/metrics > $L/metrics1_$1.txt; mark "metrics_$1"; }
bench() {  # NAME
  nice -n -10 env PYTHONPATH=/work/main/bench/vllm_cpu VLLM_TARGET_DEVICE=cpu $VLLM bench serve \
    --backend openai --base-url http://127.0.0.1:8501 --endpoint /v1/completions --model tiny \
    --tokenizer /work/vllmrun/model --dataset-name custom --dataset-path $R/inputs/bench.jsonl \
    --disable-shuffle --skip-chat-template --custom-output-len 32 --num-prompts 24 --ignore-eos \
    --temperature 0 --seed 0 --percentile-metrics ttft,tpot,itl,e2el --max-concurrency 4 --request-rate inf \
    --save-result --save-detailed --result-dir $R/bench --result-filename "vllm_bench_$1.json" > $L/vllm_bench_$1.log 2>&1
  echo "bench $1 rc=$?" | tee -a $L/marks1.txt
}
mkdir -p $R/bench $L; : > $L/marks1.txt
cd /work/main
mark observe_start
setsid python -m gpu_runner observe --kv-events tcp://127.0.0.1:5567 --otlp-port 4328 \
  --metrics http://127.0.0.1:8501/metrics --metrics-interval 0.5 --out $R/observed.json.gz \
  > $L/observe.stdout 2> $L/observe.stderr < /dev/null & OBS=$!
setsid $VPY bench/vllm_cpu/record_telemetry.py record --dir $R/rec --kv tcp://127.0.0.1:5567 --otlp-port 4338 \
  > $L/record.log 2>&1 < /dev/null & REC=$!
echo "observe pid $OBS recorder pid $REC" | tee -a $L/marks1.txt
sleep 3
mark server_start
setsid bash $S/serve.sh 4328 > $L/server1.log 2>&1 < /dev/null & SRV=$!
echo "server pid $SRV" | tee -a $L/marks1.txt; echo $SRV > $L/server1.pid
for i in $(seq 300); do curl -sf http://127.0.0.1:8501/health >/dev/null && break; kill -0 $SRV || { echo server died; tail $L/server1.log; exit 1; }; sleep 1; done
mark server_ready
metrics before_a
mark benchA_start; bench A; mark benchA_end
sleep 2; metrics after_a
mark reset_call
curl -s -X POST http://127.0.0.1:8501/reset_prefix_cache -w ' http=%{http_code}\n' | tee $L/reset_response.txt
mark reset_returned
sleep 2; metrics after_reset
mark benchB_start; bench B; mark benchB_end
sleep 3; metrics after_b
mark observe_sigterm
kill -TERM $OBS; wait $OBS; echo "observe rc=$?" | tee -a $L/marks1.txt
mark observe_exited
kill -TERM $REC; wait $REC; echo "recorder rc=$?" | tee -a $L/marks1.txt
mark server_sigterm
kill -TERM -- -$SRV; wait $SRV; echo "server rc=$?" | tee -a $L/marks1.txt
mark server_exited
