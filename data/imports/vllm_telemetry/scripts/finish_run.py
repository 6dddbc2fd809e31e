"""Fill one run folder from run_one.sh's raw captures, convert, decode, count, cross-check.
Run in the vLLM venv:  python finish_run.py NAME KEY
  raw:    /work/vllmrun/runs/NAME/ (marks.txt, server.log, rec/, client/, metrics_scrapes_all.jsonl, ...)
  folder: /work/main/data/imports/vllm_telemetry/NAME/
Each folder holds the WHOLE life of that run's server (start-up, warm-up, reset, measured run, exit);
the counts below are split at the marks (wall clock ns) into "before" (start-up + warm-up) and "measured".
Prints the counts and merges them into ../runs3_9_summary.json.
"""
import json, lzma, re, shutil, subprocess, sys
from pathlib import Path

NAME, KEY = sys.argv[1], sys.argv[2]
R = Path("/work/vllmrun/runs") / NAME; D = Path("/work/main/data/imports/vllm_telemetry")
O = D / NAME; O.mkdir(parents=True, exist_ok=True)
REC = "/work/main/bench/vllm_cpu/record_telemetry.py"; VPY = sys.executable
marks = {k: int(v) for k, v in (l.split() for l in open(R / "marks.txt"))}
T_RESET, T0, T1 = marks["reset_returned"], marks["run_start"], marks["run_end"]
info = {"name": NAME, "marks_ns": marks}

# server log: the whole log of this run's server, unchanged
shutil.copy(R / "server.log", O / "server.log")
lines = (O / "server.log").read_bytes().split(b"\n")
it_re = re.compile(rb"Iteration\((\d+)\): (\d+) context requests, (\d+) context tokens, (\d+) generation requests")
reset_line = next(i for i, l in enumerate(lines) if b'"POST /reset_prefix_cache HTTP/1.1"' in l)
its = [(i, m) for i, l in enumerate(lines) if (m := it_re.search(l))]
meas = [m for i, m in its if i > reset_line]
info["iteration_lines"] = {"total": len(its), "first": int(its[0][1].group(1)), "last": int(its[-1][1].group(1)),
                           "before_reset": len(its) - len(meas), "after_reset (measured run)": len(meas),
                           "max_requests_in_a_step_measured": max(int(m.group(2)) + int(m.group(4)) for m in meas)}
# raw captures, unchanged
for f in ("kv_events.jsonl", "otlp_bodies.jsonl"):
    shutil.copy(R / "rec" / f, O / f)
kv = json.loads(subprocess.run([VPY, REC, "kv-decode", str(O / "kv_events.jsonl"), "--out",
                                str(O / "kv_events.decoded.jsonl")], check=True, capture_output=True, text=True).stdout)
ot = json.loads(subprocess.run([VPY, REC, "otlp-json", str(O / "otlp_bodies.jsonl"), "--out",
                                str(O / "spans.otlp.jsonl")], check=True, capture_output=True, text=True).stdout)
info["kv_all"], info["otlp_all"] = kv, ot
# KV events split at reset_returned (the AllBlocksCleared comes with the first step after it)
split = {"before": {"messages": 0, "stored_events": 0, "stored_blocks": 0, "removed_events": 0, "removed_blocks": 0, "cleared": 0},
         "measured": {"messages": 0, "stored_events": 0, "stored_blocks": 0, "removed_events": 0, "removed_blocks": 0, "cleared": 0}}
for l in open(O / "kv_events.decoded.jsonl"):
    m = json.loads(l); c = split["before" if m["recv_ns"] < T_RESET else "measured"]
    c["messages"] += 1
    for ev in m["payload"][1]:
        t = ev.get("type")
        if t == "BlockStored": c["stored_events"] += 1; c["stored_blocks"] += len(ev["block_hashes"])
        elif t == "BlockRemoved": c["removed_events"] += 1; c["removed_blocks"] += len(ev["block_hashes"])
        elif t == "AllBlocksCleared": c["cleared"] += 1
info["kv_split"] = split
# spans
spans = []
for l in open(O / "spans.otlp.jsonl"):
    for rs in json.loads(l)["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            spans += ss["spans"]
def attr(s, k):
    for a in s.get("attributes", []):
        if a["key"] == k:
            v = a["value"]; return int(v["intValue"]) if "intValue" in v else v.get("doubleValue", v.get("stringValue"))
req = [s for s in spans if s["name"] == "llm_request"]
mreq = [s for s in req if int(s["startTimeUnixNano"]) >= T0]
info["spans"] = {"total": len(spans), "llm_request": len(req), "llm_request_measured": len(mreq),
                 "llm_request_warmup": len(req) - len(mreq),
                 "other": sorted({s["name"] for s in spans if s["name"] != "llm_request"}),
                 "measured_prompt_tokens": sorted({attr(s, "gen_ai.usage.prompt_tokens") for s in mreq}),
                 "measured_completion_tokens": sorted({attr(s, "gen_ai.usage.completion_tokens") for s in mreq}),
                 "measured_window_s": (max(int(s["endTimeUnixNano"]) for s in mreq) - min(int(s["startTimeUnixNano"]) for s in mreq)) / 1e9}
# client
shutil.copy(R / "client" / f"vllm_bench_{NAME}.json", O / f"vllm_bench_{NAME}.json")
shutil.copy(R / "client" / f"vllm_bench_{NAME}.log", O / f"vllm_bench_{NAME}.log")
cj = json.load(open(O / f"vllm_bench_{NAME}.json"))
info["client"] = {k: cj.get(k) for k in ("num_prompts", "completed", "failed", "request_rate", "max_concurrency", "duration",
                                          "total_input_tokens", "total_output_tokens", "mean_ttft_ms", "median_ttft_ms",
                                          "p99_ttft_ms", "mean_e2el_ms", "median_e2el_ms", "p99_e2el_ms", "max_concurrent_requests")}
info["client"]["input_lens"] = sorted(set(cj["input_lens"])); info["client"]["output_lens"] = sorted(set(cj["output_lens"]))
info["client"]["errors_nonempty"] = sum(1 for e in cj["errors"] if e)
shutil.copy(Path("/work/vllmrun/datasets") / f"{KEY}.jsonl", O / "dataset.jsonl")
shutil.copy(R / "loadavg.txt", O / "loadavg.txt")
shutil.copy(R / "metrics_after.txt", O / "metrics_sample.txt")
# metrics: all scrapes xz-compressed; a handful uncompressed (first, last, up to 6 busy), as split_and_check.py
raw = R / "metrics_scrapes_all.jsonl"
scr = [json.loads(l) for l in open(raw)]
with lzma.open(O / "metrics_scrapes_all.jsonl.xz", "wb", preset=9) as f:
    f.write(raw.read_bytes())
def val(text, name):  # summed over the label sets
    ms = re.findall(r"^" + re.escape(name) + r"\{[^}]*\} (\S+)$", text, re.M)
    return sum(float(v) for v in ms) if ms else None
ok = [i for i, s in enumerate(scr) if "text" in s]
busy = [i for j, i in enumerate(ok) if (val(scr[i]["text"], "vllm:num_requests_running") or 0) > 0
        or (j > 0 and val(scr[i]["text"], "vllm:generation_tokens_total") != val(scr[ok[j - 1]]["text"], "vllm:generation_tokens_total"))]
# (fewer busy ones if the folder would pass ~1.45 MB: each scrape is ~50 KB)
for nbusy in (6, 5, 4, 3, 2, 1, 0):
    step = max(1, -(-len(busy) // nbusy)) if nbusy else len(busy) + 1
    idx = sorted({ok[0], ok[-1]} | set(busy[::step][:nbusy]))
    with open(O / "metrics_scrapes.jsonl", "w") as f:
        for i in idx:
            f.write(json.dumps(scr[i], separators=(",", ":")) + "\n")
    if sum(p.stat().st_size for p in O.iterdir()) < 1_450_000:
        break
first, last = scr[ok[0]]["text"], (R / "metrics_after.txt").read_text()
names = ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:num_preemptions_total",
         "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:request_success_total")
info["metrics"] = {"scrapes": len(scr), "scrape_errors": len(scr) - len(ok), "kept_idx": idx, "busy_idx": busy,
                   "first_scrape_vs_after": {n: [val(first, n), val(last, n)] for n in names}}
# cross-check: stored blocks of the measured run = full blocks of KV computed - hit blocks
bs = int(re.search(r"--block-size (\d+)", (R / "server_cmd.txt").read_text()).group(1))
q0, q1 = info["metrics"]["first_scrape_vs_after"]["vllm:prefix_cache_queries_total"]
h0, h1 = info["metrics"]["first_scrape_vs_after"]["vllm:prefix_cache_hits_total"]
full = sum((attr(s, "gen_ai.usage.prompt_tokens") + attr(s, "gen_ai.usage.completion_tokens") - 1) // bs for s in mreq)
if q0 is not None and q1 is not None:
    hit = h1 - h0
    info["crosscheck"] = {"block_size": bs, "queried_tokens": q1 - q0, "hit_tokens": hit, "hit_blocks": hit / bs,
                          "full_blocks_computed": full, "expected_stored": full - hit / bs,
                          "kv_stored_blocks_measured": split["measured"]["stored_blocks"]}
else:
    info["crosscheck"] = {"block_size": bs, "note": "no prefix_cache counters in /metrics", "full_blocks_computed": full,
                          "kv_stored_blocks_measured": split["measured"]["stored_blocks"]}
# the shared VM: foreign processes over 20% of a core (run_one.sh's 1 s sampler) inside the engine-side
# window of the measured run (first llm_request start .. last end, 1 s resolution)
import datetime as _dt
w0 = min(int(s["startTimeUnixNano"]) for s in mreq) / 1e9; w1 = max(int(s["endTimeUnixNano"]) for s in mreq) / 1e9
day = _dt.datetime.fromtimestamp(T0 / 1e9, _dt.timezone.utc).date()
fb = R / "foreign_busy.txt"
inwin = []
for l in (fb.read_text().splitlines() if fb.exists() else []):
    hh, mm, ss = map(int, l.split()[0].split(":"))
    t = _dt.datetime(day.year, day.month, day.day, hh, mm, ss, tzinfo=_dt.timezone.utc).timestamp()
    if int(w0) <= t < int(w1) + 2:   # the sample labelled t covers (t-1, t]
        inwin.append(l)
info["engine_window_utc"] = [_dt.datetime.fromtimestamp(w0, _dt.timezone.utc).strftime("%H:%M:%S.%f")[:-3],
                             _dt.datetime.fromtimestamp(w1, _dt.timezone.utc).strftime("%H:%M:%S.%f")[:-3]]
info["foreign_busy_samples_in_engine_window"] = inwin
with open(O / "loadavg.txt", "a") as f:
    f.write(f"engine-side window of the measured run (llm_request spans, UTC): {info['engine_window_utc'][0]} .. "
            f"{info['engine_window_utc'][1]}; foreign busy samples inside it: {len(inwin)}\n")
info["folder_bytes"] = sum(p.stat().st_size for p in O.iterdir())
info["loadavg"] = (O / "loadavg.txt").read_text()
print(json.dumps(info, indent=1))
sp = D / "runs3_9_summary.json"
allinfo = json.load(open(sp)) if sp.exists() else {}
allinfo[NAME] = info
json.dump(allinfo, open(sp, "w"), indent=1)
