"""Cut one bench/vllm_repeats.sh session into one folder per measured run (run in the vLLM venv:
the recorder's decoders need its msgpack and protobuf).

    python bench/vllm_repeats/finish.py RAW_DIR DEST_DIR

RAW_DIR holds marks.txt (wall-clock ns of each phase), server.log, rec/ (the recorder's raw KV
events and OTLP bodies), client/ (each run's `vllm bench serve` result), ds/ (the prompts). The
server log is cut after each `POST /reset_prefix_cache` access line (one reset before each run);
KV events and OTLP bodies by the time they arrived, from a run's reset to the next reset. Lines are
copied unchanged.
"""
import gzip
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

RAW, DEST = Path(sys.argv[1]), Path(sys.argv[2])
# the other clients' per-request and summary files (AIPerf, guidellm, inference-perf), copied unchanged
CLIENT_FILES = {"profile_export.jsonl", "profile_export_aiperf.json", "benchmarks.json",
                "per_request_lifecycle_metrics.json", "summary_lifecycle_metrics.json"}
REC = Path(__file__).resolve().parents[1] / "vllm_cpu/record_telemetry.py"
marks = [(k, int(v)) for k, v in (ln.split() for ln in (RAW / "marks.txt").read_text().splitlines())]
at = dict(marks)
tags = [k[len("start_"):] for k, _ in marks if k.startswith("start_")]
DEST.mkdir(parents=True, exist_ok=True)

log = (RAW / "server.log").read_bytes().split(b"\n")
resets = [i for i, ln in enumerate(log) if b'"POST /reset_prefix_cache HTTP/1.1"' in ln]
assert len(resets) == len(tags), f"{len(resets)} reset lines in the log for {len(tags)} runs"
cuts = [0] + [i + 1 for i in resets] + [len(log)]
pieces = [b"\n".join(log[a:b]) for a, b in zip(cuts[:-1], cuts[1:])]
assert b"\n".join(pieces) == (RAW / "server.log").read_bytes()
(DEST / "server_start.log").write_bytes(pieces[0] + b"\n")

bounds = {}
for j, tag in enumerate(tags):
    end = at[f"reset_call_{tags[j + 1]}"] if j + 1 < len(tags) else at["server_exited"]
    bounds[tag] = (at[f"reset_returned_{tag}"], end)

quiet = dict(ln.split(" ", 1) for ln in (RAW / "quiet.txt").read_text().splitlines() if ln.strip())
summary = {"session": DEST.name, "marks_ns": at, "server_cmd": (RAW / "server_cmd.txt").read_text().strip(),
           "client_cmds": (RAW / "client_cmds.txt").read_text().strip().splitlines(), "runs": {}}
for j, tag in enumerate(tags):
    o = DEST / tag
    if o.exists():
        shutil.rmtree(o)
    o.mkdir()
    with gzip.GzipFile(o / "server.log.gz", "wb", compresslevel=9, mtime=0) as f:   # (iteration lines: ~350 KB plain)
        f.write(pieces[j + 1] + (b"\n" if not pieces[j + 1].endswith(b"\n") else b""))
    t0, t1 = bounds[tag]
    counts = {}
    for src in ("kv_events.jsonl", "otlp_bodies.jsonl"):
        n = 0
        with open(o / src, "w") as f:
            for ln in (RAW / "rec" / src).read_text().splitlines(keepends=True):
                if t0 <= json.loads(ln)["recv_ns"] < t1:
                    f.write(ln)
                    n += 1
        counts[src] = n
    counts["kv"] = json.loads(subprocess.run([sys.executable, str(REC), "kv-decode", str(o / "kv_events.jsonl")],
                                             check=True, capture_output=True, text=True).stdout)   # (counts only)
    counts["otlp"] = json.loads(subprocess.run([sys.executable, str(REC), "otlp-json", str(o / "otlp_bodies.jsonl"),
                                                "--out", str(o / "spans.otlp.jsonl")],
                                               check=True, capture_output=True, text=True).stdout)
    (o / "otlp_bodies.jsonl").unlink()        # (the raw protobuf bodies: spans.otlp.jsonl holds them as JSON)
    workload = tag.rsplit("_r", 1)[0]
    other = RAW / "client" / tag       # (another client's run: its own folder, its own prompts)
    if other.is_dir():
        for f in sorted((other / "out").rglob("*")):
            if f.name in CLIENT_FILES and f.stat().st_size > 256_000:   # (guidellm's report: ~630 KB, read gzipped)
                with open(f, "rb") as src, gzip.GzipFile(o / (f.name + ".gz"), "wb", compresslevel=9, mtime=0) as dst:
                    shutil.copyfileobj(src, dst)
            elif f.name in CLIENT_FILES:
                shutil.copy(f, o / f.name)
        shutil.copy(other / "stdout.txt", o / "client_stdout.txt")
        if (other / "ip.yaml").exists():
            shutil.copy(other / "ip.yaml", o / "ip_config.yaml.txt")
        cj = {}
    else:
        shutil.copy(RAW / "ds" / f"{workload}.jsonl", o / "dataset.jsonl")
        shutil.copy(RAW / "client" / f"vllm_bench_{tag}.json", o / f"vllm_bench_{tag}.json")
        shutil.copy(RAW / "client" / f"vllm_bench_{tag}.log", o / "client_stdout.txt")
        cj = json.loads((o / f"vllm_bench_{tag}.json").read_text())
    (o / "quiet.txt").write_text(f"before the run: {quiet.get(tag, '?')}\n")
    its = len(re.findall(rb"Iteration\(\d+\)", pieces[j + 1]))
    summary["runs"][tag] = {"window_ns": [t0, t1], "iteration_lines": its, **counts,
                            "client": {k: cj.get(k) for k in ("completed", "failed", "duration", "mean_ttft_ms",
                                                              "median_ttft_ms", "mean_e2el_ms", "median_e2el_ms")},
                            "quiet": quiet.get(tag)}
    print(tag, json.dumps(summary["runs"][tag]["client"]))
VERSIONS = "import vllm, torch; print(vllm.__version__, torch.__version__)"
summary["versions"] = subprocess.run([sys.executable, "-c", VERSIONS],
                                     capture_output=True, text=True).stdout.strip()
(DEST / "session.json").write_text(json.dumps(summary, indent=1))
