"""Lay out one bench/vllm_fleet.sh run as bundled files (run in the vLLM venv: the recorder's
decoders need its protobuf).

    python bench/vllm_fleet_finish.py RAW_DIR DEST_DIR

Each replica's folder gets its whole server log (gzipped), its OTLP spans as OTLP/JSON, its raw
KV-event frames and its /metrics scrapes from 3 s before the client's start (gzipped); the client's
result, stdout and dataset, the router's log (ANSI colour codes stripped) and the commands go beside
them. Nothing a tool wrote is edited otherwise.
"""
import gzip
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

RAW, DEST = Path(sys.argv[1]), Path(sys.argv[2])
START_NS = int((RAW / "client_start_ns.txt").read_text())
REC = Path(__file__).resolve().parent / "vllm_cpu/record_telemetry.py"
if DEST.exists():
    shutil.rmtree(DEST)
DEST.mkdir(parents=True)
summary = {}
for k in (0, 1):
    o = DEST / f"replica{k}"
    o.mkdir()
    with gzip.GzipFile(o / "server.log.gz", "wb", compresslevel=9, mtime=0) as f:
        f.write((RAW / f"server{k}.log").read_bytes())
    rec = RAW / f"rec{k}"
    shutil.copy(rec / "kv_events.jsonl", o / "kv_events.jsonl")
    # the scrapes from 3 s before the client's start (the recorder began while the server was still
    # loading: its first minutes are errors and idle pages), gzipped; lines unchanged
    with open(rec / "metrics_scrapes.jsonl") as src, \
            gzip.GzipFile(o / "metrics_scrapes.jsonl.gz", "wb", compresslevel=9, mtime=0) as dst:
        for ln in src:
            if json.loads(ln)["t_ns"] >= START_NS - 3_000_000_000:
                dst.write(ln.encode())
    kv = json.loads(subprocess.run([sys.executable, str(REC), "kv-decode", str(o / "kv_events.jsonl")],
                                   check=True, capture_output=True, text=True).stdout)
    otlp = json.loads(subprocess.run([sys.executable, str(REC), "otlp-json", str(rec / "otlp_bodies.jsonl"),
                                      "--out", str(o / "spans.otlp.jsonl")],
                                     check=True, capture_output=True, text=True).stdout)
    summary[f"replica{k}"] = {"kv": kv, "otlp": otlp,
                              "iteration_lines": len(re.findall(rb"Iteration\(\d+\)",
                                                                (RAW / f"server{k}.log").read_bytes()))}
shutil.copy(RAW / "vllm_bench_fleet.json", DEST / "vllm_bench_fleet.json")
shutil.copy(RAW / "client_stdout.txt", DEST / "client_stdout.txt")
shutil.copy(RAW / "ds/wA_poisson8_p192_o48.jsonl", DEST / "dataset.jsonl")
(DEST / "router.log").write_text(re.sub(r"\x1b\[[0-9;]*m", "", (RAW / "router_raw.log").read_text()))
for name in ("commands.txt", "versions.txt", "started_utc.txt", "router_workers.json"):
    if (RAW / name).exists():
        shutil.copy(RAW / name, DEST / name)
(DEST / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
print(json.dumps(summary))
