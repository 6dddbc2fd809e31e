#!/bin/bash
# usage: run.sh RUN_NAME REQUESTS CONCURRENCY ISL OSL [extra aiperf flags...]
RUN=$1; N=$2; C=$3; ISL=$4; OSL=$5; shift 5
cd /work/clientrun/aiperf
/work/venvs/aiperf/bin/aiperf profile \
  --model tiny \
  --url http://127.0.0.1:8101 \
  --endpoint-type completions \
  --streaming \
  --tokenizer /work/clientrun/tokenizer \
  --request-count $N \
  --concurrency $C \
  --synthetic-input-tokens-mean $ISL --synthetic-input-tokens-stddev 0 \
  --output-tokens-mean $OSL --output-tokens-stddev 0 \
  --extra-inputs ignore_eos:true --extra-inputs min_tokens:$OSL \
  --random-seed 42 \
  --no-gpu-telemetry \
  --ui-type none \
  --artifact-dir /work/clientrun/aiperf/$RUN \
  "$@"
