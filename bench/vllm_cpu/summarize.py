"""Write OUT/summary.txt and OUT/summary.json from what bench/vllm_cpu.sh left in OUT.

Each (engine, client) pair has REPEATS runs (PREFIX_rK.json); the median of each figure
over them is reported, and the repeat with the median output tok/s is copied to PREFIX.json.
Every run is measured twice where it can be: the file's own figures (a `vllm bench serve`
result JSON reports output_throughput = output tokens / benchmark duration, and mean/p99
TTFT/TPOT) and `python -m core metrics FILE --json` (output tok/s over the drain window
[first send, last token], the same definition for every file). loadgen traces only have
the latter.

    python bench/vllm_cpu/summarize.py OUT
"""
from __future__ import annotations

import datetime
import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

GROUPS = [  # (file prefix, engine, client): files PREFIX_rK.json, one per repeat
    ("vllm_bench_vllm", "vLLM 0.32.0 (CPU)", "vllm bench serve"),
    ("vllm_loadgen", "vLLM 0.32.0 (CPU)", "gpu_runner loadgen"),
    ("vllm_bench_runner", "gpu_runner serve", "vllm bench serve"),
    ("runner_loadgen", "gpu_runner serve", "gpu_runner loadgen"),
    ("runner_capture", "gpu_runner capture", "none (in-process)"),
]
KEYS = ("output_tok_per_s", "ttft_mean_ms", "ttft_p99_ms", "tpot_mean_ms", "tpot_p99_ms")


def core_metrics(path: Path) -> dict:
    r = subprocess.run([sys.executable, "-m", "core", "metrics", str(path), "--json"], cwd=REPO,
                       capture_output=True, text=True)
    if r.returncode != 0:
        return {"error": (r.stderr.strip().splitlines() or ["?"])[-1]}
    s = json.loads(r.stdout)["summary"]
    return {"output_tok_per_s": s["output_tok_per_s"], "completed": s.get("completed"),
            "output_tokens": s.get("output_tokens"), "failed": s.get("failed", 0),
            "ttft_mean_ms": s["ttft_ms"]["mean"], "ttft_p99_ms": s["ttft_ms"]["p99"],
            "tpot_mean_ms": s["tpot_ms"]["mean"], "tpot_p99_ms": s["tpot_ms"]["p99"],
            "itl_mean_ms": (s.get("itl_ms") or {}).get("mean"), "e2e_mean_ms": s["e2e_ms"]["mean"]}


def file_figures(path: Path) -> dict | None:
    d = json.loads(path.read_text())
    if "output_throughput" not in d:
        return None
    return {"output_tok_per_s": d["output_throughput"], "completed": d.get("completed"),
            "failed": d.get("failed"), "duration_s": d.get("duration"),
            "ttft_mean_ms": d.get("mean_ttft_ms"), "ttft_p99_ms": d.get("p99_ttft_ms"),
            "tpot_mean_ms": d.get("mean_tpot_ms"), "tpot_p99_ms": d.get("p99_tpot_ms"),
            "itl_mean_ms": d.get("mean_itl_ms")}


def fmt(v, nd=1):
    return "-" if v is None else f"{v:,.{nd}f}"


def read(out: Path, name: str) -> str:
    p = out / name
    return p.read_text().strip() if p.exists() else "(missing)"


def row(engine, client, how, m) -> str:
    if "error" in m:
        return f"{engine:<18} {client:<19} {how:<22} ERROR {m['error']}"
    done = m.get("completed")
    return (f"{engine:<18} {client:<19} {how:<22} {fmt(m['output_tok_per_s']):>9} "
            f"{fmt(m['ttft_mean_ms']):>9} {fmt(m['ttft_p99_ms']):>9} "
            f"{fmt(m['tpot_mean_ms'], 2):>9} {fmt(m['tpot_p99_ms'], 2):>9} "
            f"{done if done is not None else '-':>5}/{m.get('failed') or 0}")


def _figures(run: dict) -> dict | None:
    f = run.get("file_figures") or run["core_metrics"]   # `vllm bench serve`: what that client reports
    return None if "error" in f or f.get("output_tok_per_s") is None else f


def _capture_side(run: dict) -> tuple[bool, dict] | None:
    """gpu_runner capture (True) or vLLM served through `vllm bench serve` (False), both by core metrics
    (tok/s over [first arrival, last token]; capture's TTFT counts the queue); None for any other run."""
    side = True if run["engine"] == "gpu_runner capture" else \
        False if run["client"] == "vllm bench serve" and run["engine"].startswith("vLLM") else None
    if side is None or "error" in run["core_metrics"]:
        return None
    return side, run["core_metrics"]


def _side(run: dict, client: str) -> tuple[bool, dict] | None:
    """Whether the run is ours (True) or vLLM's (False) for `client`, with its figures; None if not compared."""
    if client == "gpu_runner capture":   # the in-process run against vLLM served through `vllm bench serve`
        return _capture_side(run)
    if run["client"] == client and _figures(run) is not None:
        return run["engine"].startswith("gpu_runner"), _figures(run)
    return None


def _by_round(runs: list[dict], client: str) -> dict:
    """{ours: {round: figures}} over the repeated runs compared for `client` (ours: True, vLLM: False)."""
    by = {}
    for r in runs:
        if "_r" not in r["file"]:
            continue
        compared = _side(r, client)
        if compared is None:
            continue
        side, fig = compared
        by.setdefault(side, {})[int(r["file"].rsplit("_r", 1)[1].split(".")[0])] = fig
    return by


def _ratios(client: str, ours: dict, theirs: dict, rounds: list[int]) -> tuple[dict, list[str]]:
    """Ours over vLLM's per round, best against best and the rounds' median: the figures and their lines."""
    tps = [ours[k]["output_tok_per_s"] / theirs[k]["output_tok_per_s"] for k in rounds]
    ttft = [ours[k]["ttft_mean_ms"] / theirs[k]["ttft_mean_ms"] for k in rounds]
    best_tps = (max(o["output_tok_per_s"] for o in ours.values())
                / max(t["output_tok_per_s"] for t in theirs.values()))
    best_ttft = min(o["ttft_mean_ms"] for o in ours.values()) / min(t["ttft_mean_ms"] for t in theirs.values())
    doc = {"rounds": rounds, "tok_s_ratio": tps, "ttft_ratio": ttft, "best_tok_s_ratio": best_tps,
           "best_ttft_ratio": best_ttft, "median_tok_s_ratio": statistics.median(tps),
           "median_ttft_ratio": statistics.median(ttft)}
    lines = [f"  {client}: per round tok/s " + ", ".join(f"{x:.2f}x" for x in tps)
             + "; TTFT " + ", ".join(f"{x:.2f}x" for x in ttft),
             f"  {client}: best of {len(ours)} vs best of {len(theirs)}: tok/s {best_tps:.2f}x, "
             f"TTFT {best_ttft:.2f}x;"
             f" median of the rounds: tok/s {statistics.median(tps):.2f}x, TTFT {statistics.median(ttft):.2f}x"]
    return doc, lines


def versus(runs: list[dict]) -> dict:
    """Ours against vLLM for each client: per round (the repeat number: with ALTERNATE=1 the two runs
    were back to back), best of all repeats each (highest tok/s, lowest mean TTFT) and the median."""
    lines, doc = [], {}
    for client in ("vllm bench serve", "gpu_runner loadgen", "gpu_runner capture"):
        by = _by_round(runs, client)
        ours, theirs = by.get(True, {}), by.get(False, {})
        rounds = sorted(set(ours) & set(theirs))
        if not rounds:
            continue
        doc[client], more = _ratios(client, ours, theirs, rounds)
        lines += more
    return {"lines": lines or ["  (no pair of runs)"], "doc": doc}


def _group_files(out: Path, prefix: str) -> list[Path]:
    """The group's repeats (PREFIX_rK.json, by K), else PREFIX.json alone, else none."""
    return sorted(out.glob(f"{prefix}_r*.json"), key=lambda p: int(p.stem.rsplit("_r", 1)[1])) \
        or ([out / f"{prefix}.json"] if (out / f"{prefix}.json").exists() else [])


def _measure(files: list[Path], prefix: str, engine: str, client: str, runs: list, rows: list) -> list[dict]:
    """Each repeat measured (core metrics; a `vllm bench serve` file's own figures too), added to runs
    and its rows to rows; returns the group's repeats."""
    reps = []
    for p in files:
        run = {"file": p.name, "engine": engine, "client": client, "core_metrics": core_metrics(p)}
        if prefix.startswith("vllm_bench"):
            run["file_figures"] = file_figures(p)
        reps.append(run)
        runs.append(run)
        tag = p.stem.rsplit("_", 1)[1] if "_r" in p.stem else "-"
        if run.get("file_figures"):
            rows.append(row(engine, client, f"{tag} file's own", run["file_figures"]))
        rows.append(row(engine, client, f"{tag} core metrics", run["core_metrics"]))
    return reps


def _median(out: Path, prefix: str, engine: str, client: str, ok: list[dict]) -> tuple[str, dict]:
    """The median of each figure over the repeats measured, its row and its record; the repeat with
    the median output tok/s is copied to PREFIX.json."""
    med = {k: statistics.median(r["core_metrics"][k] for r in ok) for k in KEYS}
    by_tps = sorted(ok, key=lambda r: r["core_metrics"]["output_tok_per_s"])
    chosen = by_tps[(len(by_tps) - 1) // 2]
    if chosen["file"] != f"{prefix}.json":
        shutil.copyfile(out / chosen["file"], out / f"{prefix}.json")
    med.update(completed=sum(r["core_metrics"]["completed"] or 0 for r in ok),
               failed=sum(r["core_metrics"]["failed"] or 0 for r in ok))
    return (row(engine, client, f"median of {len(ok)}", med),
            {"engine": engine, "client": client, "repeats": len(ok), "median_core_metrics": med,
             "copied_to": f"{prefix}.json", "copied_from": chosen["file"]})


def _cpu_model() -> str:
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    return next((ln.split(":", 1)[1].strip() for ln in lscpu.splitlines() if ln.startswith("Model name")), "?")


def _summary_text(out: Path, doc: dict, model: str, medians: list[str], verdict: dict, rows: list[str]) -> str:
    head = (f"{'engine':<18} {'client':<19} {'run, figures':<22} {'out tok/s':>9} {'TTFT mean':>9} {'TTFT p99':>9} "
            f"{'TPOT mean':>9} {'TPOT p99':>9} {'done/failed':>11}")
    return "\n".join([
        "bench/vllm_cpu.sh: vLLM CPU vs gpu_runner serve, tiny byte model (2.9 M parameters, float32)",
        f"date: {doc['date']}",
        f"cpu: {model}",
        "", "versions:", read(out, "versions.txt"),
        "", "load average (/proc/loadavg: 1, 5, 15 min):", read(out, "loadavg.txt"),
        "", "readiness:", read(out, "readiness.txt"),
        "", "notes:", read(out, "notes.txt"),
        "", "results, median over repeats (core metrics; ms; the repeat with the median tok/s is copied to "
            "PREFIX.json):",
        head, "-" * len(head), *medians,
        "", "ours / vLLM per client (tok/s: higher is better for us; TTFT mean: lower is better for us); a round is"
            " one run of each engine, back to back:", *verdict["lines"],
        "", "every repeat (out tok/s: file's own = output tokens / benchmark duration; core metrics = drain window):",
        head, "-" * len(head), *rows,
        "(a) the server's own trace spans the greedy check, the warm-up and every repeat, idle gaps included:",
        "    its tok/s is not a throughput figure; its TTFT/TPOT are server-side (no network, no client)",
        "", "greedy equality (temperature 0, 32 tokens, token ids):", read(out, "greedy.txt"),
        "", "commands:", read(out, "commands.txt"),
    ])


def main() -> int:
    out = Path(sys.argv[1]).resolve()
    rows, medians, doc = [], [], {"runs": []}
    for prefix, engine, client in GROUPS:
        files = _group_files(out, prefix)
        if not files:
            continue
        reps = _measure(files, prefix, engine, client, doc["runs"], rows)
        ok = [r for r in reps if "error" not in r["core_metrics"]]
        if ok:
            med_row, med_doc = _median(out, prefix, engine, client, ok)
            medians.append(med_row)
            doc.setdefault("medians", []).append(med_doc)
    verdict = versus(doc["runs"])
    doc["versus"] = verdict["doc"]
    if (out / "served.json").exists():
        m = core_metrics(out / "served.json")
        doc["served_trace"] = m
        rows.append(row("gpu_runner serve", "server-side trace", "all it served (a)", m))
    model = _cpu_model()
    doc.update({"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                "cpu": model, "versions": read(out, "versions.txt"), "greedy": read(out, "greedy.txt"),
                "loadavg": read(out, "loadavg.txt"), "notes": read(out, "notes.txt")})
    text = _summary_text(out, doc, model, medians, verdict, rows)
    (out / "summary.txt").write_text(text + "\n")
    (out / "summary.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
