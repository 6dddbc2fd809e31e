#!/usr/bin/env bash
# vllm bench sweep serve against our server (gpu_runner serve), launched by the sweep itself.
#   bash /work/sweeprun/sweep.sh EXPERIMENT_NAME BENCH_PARAMS [SERVE_PARAMS|-] NUM_RUNS [extra sweep args...]
set -euo pipefail
EXP=$1; BP=$2; SP=$3; NR=$4; shift 4
cd /work/main   # `-m gpu_runner` resolves from the repo root (not installed)
export PYTHONPATH=/work/main/bench/vllm_cpu VLLM_TARGET_DEVICE=cpu   # pitfalls a/b of bench/vllm_cpu.sh
SERVE_CMD="/root/.pyenv/versions/3.11.7/bin/python -m gpu_runner serve --host 127.0.0.1 --port 8401 --threads 1 --max-seqs 16 --token-budget 2048 --served-model-name tiny"
BENCH_CMD="nice -n -10 /work/venvs/vllm/bin/vllm bench serve --backend openai --base-url http://127.0.0.1:8401 --endpoint /v1/completions --model tiny --tokenizer /work/sweeprun/model --dataset-name random --random-input-len 64 --random-output-len 32 --num-prompts 24 --ignore-eos --temperature 0 --seed 0 --save-detailed"
SERVE_ARGS=(); [ "$SP" != "-" ] && SERVE_ARGS=(--serve-params "$SP")
set -x
/work/venvs/vllm/bin/vllm bench sweep serve \
  --serve-cmd "$SERVE_CMD" --bench-cmd "$BENCH_CMD" \
  --after-bench-cmd "curl -sf http://127.0.0.1:8401/health" \
  "${SERVE_ARGS[@]}" --bench-params "$BP" \
  --num-runs "$NR" --warmup-num-prompts 4 --server-ready-timeout 120 --show-stdout \
  -o /work/sweeprun/results -e "$EXP" "$@"
