#!/usr/bin/env bash
# Session 2: vLLM restarted with OTLP to 4329; gpu_runner loadgen drives it (32 text prompts, concurrency 4)
# subscribing to the KV events and receiving the spans itself; record_telemetry.py record as a second SUB.
set -uo pipefail
R=/work/obsrun; L=$R/logs; S=/work/main/data/imports/vllm_observed/scripts; VPY=/work/venvs/vllm/bin/python
mark() { echo "$1 $(date +%s%N)" | tee -a $L/marks2.txt; }
metrics() { curl -s http://127.0.0.1:8501/metrics > $L/metrics2_$1.txt; mark "metrics_$1"; }
: > $L/marks2.txt; cd /work/main
setsid $VPY bench/vllm_cpu/record_telemetry.py record --dir $R/rec2 --kv tcp://127.0.0.1:5567 --otlp-port 4338 \
  > $L/record2.log 2>&1 < /dev/null & REC=$!
mark server_start
setsid bash $S/serve.sh 4329 > $L/server2.log 2>&1 < /dev/null & SRV=$!
echo "server pid $SRV recorder pid $REC" | tee -a $L/marks2.txt
for i in $(seq 300); do curl -sf http://127.0.0.1:8501/health >/dev/null && break; kill -0 $SRV || { echo server died; tail $L/server2.log; exit 1; }; sleep 1; done
mark server_ready
# attempt 1 used 2 s here: the request spans were stuck behind the start-up spans' export retries (see MADE.md)
sleep ${LOADGEN_DELAY:-2}; metrics before
mark loadgen_start
nice -n -10 python -m gpu_runner loadgen --url http://127.0.0.1:8501 --workload $R/inputs/workload.json \
  --concurrency 4 --kv-events tcp://127.0.0.1:5567 --otlp-port 4329 --out $R/loadgen_both.json.gz \
  > $L/loadgen.stdout 2> $L/loadgen.stderr
echo "loadgen rc=$?" | tee -a $L/marks2.txt
mark loadgen_end
sleep 1; metrics after
kill -TERM $REC; wait $REC; echo "recorder rc=$?" | tee -a $L/marks2.txt
kill -TERM -- -$SRV; wait $SRV; echo "server rc=$?" | tee -a $L/marks2.txt
mark server_exited
