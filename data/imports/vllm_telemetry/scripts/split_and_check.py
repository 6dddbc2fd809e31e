"""Split the session's raw captures into the two run folders, convert, decode, count.
Run in the vLLM venv:  python split_and_check.py
"""
import base64, json, lzma, re, shutil, subprocess, sys
from pathlib import Path

R = Path("/work/vllmrun"); D = Path("/work/main/data/imports/vllm_telemetry")
REC = "/work/main/bench/vllm_cpu/record_telemetry.py"; VPY = "/work/venvs/vllm/bin/python"
marks = {}
for line in open(R / "logs/marks.txt"):
    if line.startswith("#"): continue
    k, v = line.split(); marks[k] = int(v)
T12 = marks["reset_returned"]            # boundary between the run folders (ns, wall clock)
runs = {"run1_c4_p128_o32": (0, T12), "run2_poisson4_p192_o48": (T12, 1 << 62)}
names = {"run1_c4_p128_o32": "run1", "run2_poisson4_p192_o48": "run2"}

# server log: split right after the access line of POST /reset_prefix_cache
log = (R / "logs/server.log").read_bytes().split(b"\n")
cut = next(i for i, l in enumerate(log) if b'"POST /reset_prefix_cache HTTP/1.1"' in l) + 1
parts = {"run1_c4_p128_o32": b"\n".join(log[:cut]) + b"\n", "run2_poisson4_p192_o48": b"\n".join(log[cut:])}
assert parts["run1_c4_p128_o32"] + parts["run2_poisson4_p192_o48"] == (R / "logs/server.log").read_bytes()

it_re = re.compile(rb"Iteration\((\d+)\)")
summary = {"marks_ns": marks, "boundary_ns": T12, "server_log_split_after_line": cut}
for run, (t0, t1) in runs.items():
    o = D / run; o.mkdir(parents=True, exist_ok=True)
    (o / "server.log").write_bytes(parts[run])
    its = [int(m.group(1)) for l in parts[run].split(b"\n") if (m := it_re.search(l))]
    info = {"iteration_lines": len(its), "iteration_first": its[0] if its else None, "iteration_last": its[-1] if its else None}
    for src, dst, key in (("kv_events.jsonl", "kv_events.jsonl", "recv_ns"), ("otlp_bodies.jsonl", "otlp_bodies.jsonl", "recv_ns")):
        n = 0
        with open(o / dst, "w") as f:
            for line in open(R / "rec" / src):
                if t0 <= json.loads(line)[key] < t1:
                    f.write(line); n += 1
        info[dst + "_lines"] = n
    kv = subprocess.run([VPY, REC, "kv-decode", str(o / "kv_events.jsonl"), "--out", str(o / "kv_events.decoded.jsonl")],
                        check=True, capture_output=True, text=True).stdout
    info["kv"] = json.loads(kv)
    ot = subprocess.run([VPY, REC, "otlp-json", str(o / "otlp_bodies.jsonl"), "--out", str(o / "spans.otlp.jsonl")],
                        check=True, capture_output=True, text=True).stdout
    info["otlp"] = json.loads(ot)
    # metrics: all scrapes raw, xz-compressed; a handful uncompressed
    raw = R / "raw_metrics" / f"{names[run]}.jsonl"
    scr = [json.loads(l) for l in open(raw)]
    with lzma.open(o / "metrics_scrapes_all.jsonl.xz", "wb", preset=9) as f:
        f.write(raw.read_bytes())
    load0, load1 = marks[f"{names[run]}_start"], marks[f"{names[run]}_end"]
    # keep: the first and last scrape, and up to 6 evenly spaced among the "busy" ones
    def running(t):
        m = re.search(r"^vllm:num_requests_running\{[^}]*\} (\S+)$", t, re.M)
        return float(m.group(1)) if m else 0.0
    def gen(t):
        m = re.search(r"^vllm:generation_tokens_total\{[^}]*\} (\S+)$", t, re.M)
        return float(m.group(1)) if m else 0.0
    # "busy": requests running at the scrape, or generation_tokens_total moved since the previous one
    busy = [i for i, s in enumerate(scr) if running(s.get("text", "")) > 0
            or (i > 0 and gen(s.get("text", "")) != gen(scr[i - 1].get("text", "")))]
    step = max(1, -(-len(busy) // 6))
    idx = sorted({0, len(scr) - 1} | set(busy[::step]))
    info["metrics_scrapes_busy_idx"] = busy
    with open(o / "metrics_scrapes.jsonl", "w") as f:
        for i in idx:
            f.write(json.dumps(scr[i], separators=(",", ":")) + "\n")
    info["metrics_scrapes_all"] = len(scr); info["metrics_scrapes_kept_idx"] = idx
    def val(text, name):
        m = re.search(r"^" + re.escape(name) + r"\{[^}]*\} (\S+)$", text, re.M)
        return float(m.group(1)) if m else None
    first, last = scr[0]["text"], scr[-1]["text"]
    info["metrics_first_last"] = {n: [val(first, n), val(last, n)] for n in (
        "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:num_preemptions_total",
        "vllm:prompt_tokens_total", "vllm:generation_tokens_total")}
    shutil.copy(R / "datasets" / f"{names[run]}.jsonl", o / "dataset.jsonl")
    summary[run] = info
shutil.copy(R / "logs/metrics_after_final.txt", D / "run2_poisson4_p192_o48" / "metrics_sample.txt")
json.dump(summary, open(D / "split_summary.json", "w"), indent=1)
print(json.dumps(summary, indent=1))
