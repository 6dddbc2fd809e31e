#!/usr/bin/env bash
# bench/sglang_router.sh: sglang-router (PyPI `sglang-router`, the router SGLang users deploy) in
# front of two `python -m gpu_runner serve` replicas, driven by the guidellm benchmark client
# (issue 38 item 4). Not part of CI. Binds 127.0.0.1 only; every wait is bounded; everything it
# starts it stops (trap). How the bundled files were made: data/imports/sglang_router/SOURCE.md.
#
#   bash bench/sglang_router.sh          # writes $OUT (default data/imports/sglang_router)
#
#   1. separate virtual environments under $VENV_DIR (created when absent, never the main
#      interpreter): sglang-router==$SGLANG_ROUTER_VERSION, and guidellm==$GUIDELLM_VERSION on
#      the CPU torch wheel ($TORCH_WHEEL, default the local /opt/wheels one when present)
#   2. the bundled tiny model exported as an HF directory: guidellm's tokenizer (1 token = 1 byte)
#   3. per run: 2 replicas (--prefix-caching --threads 1, each --trace-out), the router
#      (--policy P, --log-level debug: its log names the worker each request was sent to),
#      guidellm against the router (concurrent, $STREAMS streams, $N requests); then the
#      router and the replicas are stopped (SIGTERM; a replica writes its trace then)
#        round_robin:  synthetic prompts of $PROMPT_TOKENS tokens, $OUTPUT_TOKENS out
#        cache_aware:  $PREFIX_COUNT shared prefixes of $PREFIX_TOKENS tokens + $SUFFIX_TOKENS
#                      unique tokens, $OUTPUT_TOKENS out
#        request_ids:  round_robin, 8 requests each with its own X-Request-Id (a few lines of
#                      httpx: guidellm sends none), to show the id reaching the replica's trace
#   4. each run's replica traces merged into one fleet trace with `python -m core fleet-merge`,
#      the replicas' clocks aligned on guidellm's (see "Clocks" in SOURCE.md)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
SGLANG_ROUTER_VERSION=0.3.2
GUIDELLM_VERSION=0.8.1
VENV_DIR=${VENV_DIR:-/work/venvs}
TORCH_WHEEL=${TORCH_WHEEL:-$(ls /opt/wheels/torch-2.13.0+cpu-cp311-*.whl 2>/dev/null | head -1 || true)}
OUT=${OUT:-$ROOT/data/imports/sglang_router}
WORK=${WORK:-$(mktemp -d /tmp/sglang_router.XXXXXX)}
PY=${PY:-python}
PORT0=${PORT0:-8101}; PORT1=${PORT1:-8102}; ROUTER_PORT=${ROUTER_PORT:-30000}; PROM_PORT=${PROM_PORT:-29000}
N=${N:-48}; STREAMS=${STREAMS:-4}; OUTPUT_TOKENS=${OUTPUT_TOKENS:-24}
PROMPT_TOKENS=${PROMPT_TOKENS:-160}
PREFIX_COUNT=${PREFIX_COUNT:-4}; PREFIX_TOKENS=${PREFIX_TOKENS:-96}; SUFFIX_TOKENS=${SUFFIX_TOKENS:-64}
CLIENT_TIMEOUT_S=${CLIENT_TIMEOUT_S:-600}
ROUTER_PY=$VENV_DIR/sglang-router/bin/python
GUIDELLM=$VENV_DIR/guidellm/bin/guidellm
mkdir -p "$OUT" "$WORK"
echo "work: $WORK  out: $OUT"

PIDS=()
stop_all() {   # only what this script started, by pid
    for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do timeout 30 tail --pid="$pid" -f /dev/null 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true; done
    PIDS=()
}
trap stop_all EXIT

wait_http() {   # URL SECONDS [GREP]: until the URL answers 200 (and its body holds GREP)
    local deadline=$((SECONDS + $2))
    until body=$(curl -sf --max-time 5 "$1") && [[ -z "${3:-}" || "$body" == *"$3"* ]]; do
        (( SECONDS < deadline )) || { echo "no answer from $1 within $2 s" >&2; return 1; }
        sleep 0.5
    done
}

# 1. virtual environments
if ! "$ROUTER_PY" -c "import sglang_router" 2>/dev/null; then
    python3 -m venv "$VENV_DIR/sglang-router"
    "$ROUTER_PY" -m pip install -q --upgrade pip
    "$ROUTER_PY" -m pip install -q "sglang-router==$SGLANG_ROUTER_VERSION"
fi
if [[ ! -x "$GUIDELLM" ]]; then
    python3 -m venv "$VENV_DIR/guidellm"
    "$VENV_DIR/guidellm/bin/pip" install -q --upgrade pip
    if [[ -n "$TORCH_WHEEL" ]]; then "$VENV_DIR/guidellm/bin/pip" install -q "$TORCH_WHEEL"; fi
    "$VENV_DIR/guidellm/bin/pip" install -q "guidellm==$GUIDELLM_VERSION"
fi
have() { "$1" -m pip show "$2" 2>/dev/null | sed -n 's/^Version: //p'; }
[[ $(have "$ROUTER_PY" sglang-router) == "$SGLANG_ROUTER_VERSION" ]] || { echo "need sglang-router $SGLANG_ROUTER_VERSION" >&2; exit 2; }
[[ $(have "$VENV_DIR/guidellm/bin/python" guidellm) == "$GUIDELLM_VERSION" ]] || { echo "need guidellm $GUIDELLM_VERSION" >&2; exit 2; }

# 2. guidellm's tokenizer: the tiny model as an HF directory (tokenizer.json included)
[[ -f "$WORK/model/tokenizer.json" ]] || \
    "$PY" -m gpu_runner export-hf --model tiny --out "$WORK/model" --eos-token-id 257 --bos-token-id 256 >/dev/null

# 3. one run: NAME POLICY CLIENT [ARGS]: replicas, router, the client (run in the run's folder)
run() {
    local name=$1 policy=$2 d=$WORK/$1 k
    shift 2
    mkdir -p "$d"
    local ports=("$PORT0" "$PORT1") urls=()
    for k in 0 1; do
        "$PY" -m gpu_runner serve --host 127.0.0.1 --port "${ports[$k]}" --threads 1 --prefix-caching \
            --served-model-name tiny --trace-out "$d/r$k.json.gz" > "$d/r$k.log" 2>&1 &
        PIDS+=($!)
        urls+=("http://127.0.0.1:${ports[$k]}")
    done
    for k in 0 1; do wait_http "${urls[$k]}/health" 120; done
    "$ROUTER_PY" -m sglang_router.launch_router --worker-urls "${urls[@]}" --policy "$policy" \
        --host 127.0.0.1 --port "$ROUTER_PORT" --prometheus-host 127.0.0.1 --prometheus-port "$PROM_PORT" \
        --log-level debug > "$d/router_raw.log" 2>&1 &
    PIDS+=($!)
    # both workers registered under the model our /server_info names
    wait_http "http://127.0.0.1:$ROUTER_PORT/v1/models" 60 '"tiny"'
    wait_http "http://127.0.0.1:$ROUTER_PORT/workers" 60 "${urls[1]}"
    curl -s "http://127.0.0.1:$ROUTER_PORT/workers" > "$d/router_workers.json"
    curl -s "http://127.0.0.1:$ROUTER_PORT/v1/models" > "$d/router_models.json"
    date -u +%Y-%m-%dT%H:%M:%SZ > "$d/started_utc.txt"
    (cd "$d" && "$@")
    stop_all     # SIGTERM: the router stops, each replica writes its trace and stops
    sed 's/\x1b\[[0-9;]*m//g' "$d/router_raw.log" > "$d/router.log" && rm "$d/router_raw.log"
    mkdir -p "$OUT/$name"
    cp "$d"/*.json "$d"/*.json.gz "$d"/*.log "$d"/*.txt "$OUT/$name/"
    cp "$d"/*.jsonl "$OUT/$name/" 2>/dev/null || true
}

guidellm_client() {   # DATA: guidellm against the router (benchmarks.json, guidellm_console.txt)
    HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 timeout "$CLIENT_TIMEOUT_S" "$GUIDELLM" run \
        --backend "kind=openai_http,target=http://127.0.0.1:$ROUTER_PORT,request_format=/v1/completions,stream=true" \
        --tokenizer "kind=huggingface_auto,model=$WORK/model" \
        --profile "kind=concurrent,streams=$STREAMS" \
        --constraint "kind=max_requests,count=$N" \
        --data "$1" \
        --output kind=json,path=benchmarks.json \
        --disable-progress > guidellm_console.txt 2>&1
}

ids_client() {   # guidellm sends no per-request id: 8 requests, one after another, each with its
                 # own X-Request-Id, which the router forwards (client_requests.jsonl)
    timeout 120 "$PY" - "$ROUTER_PORT" <<'PY'
import json, sys, time
import httpx
url = f"http://127.0.0.1:{sys.argv[1]}/v1/completions"
with open("client_requests.jsonl", "w") as out, httpx.Client(timeout=30) as c:
    for i in range(8):
        rid, prompt = f"sgr-demo-{i:02d}", f"Request {i} of the X-Request-Id demo: the quick brown fox "
        start_s = time.time()
        r = c.post(url, json={"model": "tiny", "prompt": prompt, "max_tokens": 16}, headers={"X-Request-Id": rid})
        out.write(json.dumps({"x_request_id": rid, "prompt": prompt, "start_s": start_s, "status": r.status_code,
                              "response_id": r.json().get("id"), "response_x_request_id": r.headers.get("x-request-id")}) + "\n")
PY
}

run round_robin round_robin guidellm_client \
    "kind=synthetic_text,prompt_tokens=$PROMPT_TOKENS,output_tokens=$OUTPUT_TOKENS"
run cache_aware cache_aware guidellm_client \
    "kind=synthetic_text,prompt_tokens=$SUFFIX_TOKENS,output_tokens=$OUTPUT_TOKENS,prefix_tokens=$PREFIX_TOKENS,prefix_count=$PREFIX_COUNT"
run request_ids round_robin ids_client

# 4. merge each run's replica traces (clock offsets from guidellm's request starts), print counts
for name in round_robin cache_aware request_ids; do
    d=$OUT/$name
    offsets=$("$PY" - "$d" <<'PY'
import gzip, json, statistics, sys
from pathlib import Path
d = Path(sys.argv[1])
if (d / "benchmarks.json").exists():   # guidellm's request starts, else the id client's
    b = json.loads((d / "benchmarks.json").read_text())["benchmarks"][0]
    start_ms = {json.loads(r["request_args"])["body"]["prompt"]: r["info"]["timings"]["request_start"] * 1e3
                for r in b["requests"]["successful"]}
else:
    rows = [json.loads(line) for line in (d / "client_requests.jsonl").read_text().splitlines()]
    start_ms = {r["prompt"]: r["start_s"] * 1e3 for r in rows}
t0 = min(start_ms.values())
offsets = []
for k in (0, 1):   # replica k's clock + offset = ms since guidellm's first request start (median over its requests)
    reqs = json.loads(gzip.decompress((d / f"r{k}.json.gz").read_bytes()))["requests"]
    offsets.append(statistics.median(start_ms[bytes(r["prompt_ids"]).decode()] - t0 - r["arrival_ms"] for r in reqs))
print(",".join(f"{o:.3f}" for o in offsets))
PY
)
    "$PY" -m core fleet-merge "$d/r0.json.gz" "$d/r1.json.gz" --offsets-ms="$offsets" \
        --label "sglang-router $SGLANG_ROUTER_VERSION $name, 2 gpu_runner replicas, guidellm $GUIDELLM_VERSION" \
        --out "$d/fleet.json.gz"
    echo "$name: offsets_ms $offsets" | tee "$d/offsets_ms.txt"
    for port in "$PORT0" "$PORT1"; do
        echo "  http://127.0.0.1:$port: $(grep -c "Sending request url=http://127.0.0.1:$port" "$d/router.log" || true) requests (router log)"
    done
done
