#!/usr/bin/env bash
# vllm serve on 127.0.0.1:8501, KV events PUB bound on tcp://*:5567, OTLP to 127.0.0.1:$1/v1/traces
# (4328 for the observe session, 4329 for the loadgen session). Foreground; run under setsid.
OTLP_PORT=${1:?otlp port}
exec env PYTHONPATH=/work/main/bench/vllm_cpu VLLM_TARGET_DEVICE=cpu VLLM_CPU_KVCACHE_SPACE=1 \
  VLLM_SERVER_DEV_MODE=1 OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf OTEL_BSP_SCHEDULE_DELAY=200 \
  /work/venvs/vllm/bin/vllm serve /work/vllmrun/model --served-model-name tiny \
  --host 127.0.0.1 --port 8501 --dtype float32 --max-model-len 512 --max-num-seqs 16 \
  --max-num-batched-tokens 2048 --block-size 32 --enable-prefix-caching --num-gpu-blocks-override 64 \
  --generation-config vllm --seed 0 --enable-logging-iteration-details \
  --kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5567", "topic": "kv-events"}' \
  --otlp-traces-endpoint "http://127.0.0.1:${OTLP_PORT}/v1/traces"
