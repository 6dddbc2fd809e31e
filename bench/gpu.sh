#!/usr/bin/env bash
# One prepared script for a CUDA machine (e.g. the lent H200). Writes everything under $OUT
# (default ./gpu_results): measured traces and decode-vs-bound numbers, with versions.
#   OUT=/tmp/out bash bench/gpu.sh
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu_results}
mkdir -p "$OUT"
python - <<'PY' > "$OUT/env.json"
import json, platform, torch
info = {"torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}
try:
    import triton; info["triton"] = triton.__version__
except Exception as e:
    info["triton"] = f"unavailable: {e}"
print(json.dumps(info))
PY
cat "$OUT/env.json"
# 1. measured traces with the bundled model (chapter workload, shared-prefix workload)
python -m gpu_runner capture --workload data/workloads/chapter31.json --out "$OUT/chapter31_cuda.json" --device cuda
python -m gpu_runner capture --workload data/workloads/shared_prefix_200.json --out "$OUT/shared_prefix_cuda.json.gz" \
    --device cuda --max-seqs 64 --token-budget 4096 --chunk 512 --prefix-caching
# 2. a random-initialised Llama-shaped ~0.5B model in bf16: realistic step times
python -m gpu_runner capture --workload data/workloads/burst5.json --out "$OUT/burst5_random05b_cuda.json" \
    --device cuda --model random-0.5b
python -m bench.gpu_decode --model random-0.5b --batches 1,8,32,64,128 --ctx 1024 --out "$OUT"
python -m bench.gpu_decode --model random-0.5b --batches 1,8,32,64,128 --ctx 1024 --attention triton --out "$OUT/triton" || true
python -m bench.triton_attention --out "$OUT"
python -m gpu_runner capture --workload data/workloads/spec_demo.json --out "$OUT/spec_cuda.json" --device cuda --speculative --gamma 4 --temperature 0.8
echo "done: $OUT"
