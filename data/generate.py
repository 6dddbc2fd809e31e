"""Regenerate the built-in workloads and given traces in data/ (deterministic, seeded).

    python -m data.generate        (from the repository root)

The chapter's numbers are assigned teaching values (Chapter 31, Table 31.1), so the given
traces carry meta.source = "given"; the synthetic workloads are seeded random draws.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from core.trace import given_trace, save_trace
from core.workload import Request, Workload

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "data"
CREATED = "2026-11-29T00:00:00+00:00"  # fixed so regenerating gives identical files

CHAPTER31 = Workload([
    Request("A", 0.0, 4, 3, prompt_ids=(10, 11, 12, 13)),
    Request("B", 20.0, 4, 2, prompt_ids=(10, 11, 12, 14)),
    Request("C", 40.0, 2, 1, prompt_ids=(20, 21)),
], name="chapter31")

CHAPTER31_SERIAL = {"A": [100, 140, 180], "B": [260, 300], "C": [360]}
CHAPTER31_CONTINUOUS = {"A": [100, 150, 200], "B": [150, 200], "C": [180]}


def burst5() -> Workload:
    return Workload([Request(f"R{i + 1}", 0.0, 8, n) for i, n in enumerate([5, 20, 10, 15, 10])], name="burst5")


def shared_prefix(n=200, rate_per_s=20.0, seed=31) -> Workload:
    """Chat traffic: Poisson arrivals; each request starts with one of two system prompts
    (tenants 'acme' and 'globex' each have their own), then a user turn of random tokens."""
    rng = np.random.default_rng(seed)
    vocab = 32000
    system = {"acme": rng.integers(100, vocab, 384).tolist(), "globex": rng.integers(100, vocab, 256).tolist()}
    arrivals = np.concatenate([[0.0], np.cumsum(rng.exponential(1000.0 / rate_per_s, n - 1))])
    reqs = []
    for i, t in enumerate(arrivals):
        tenant = "acme" if rng.random() < 0.6 else "globex"
        user = rng.integers(100, vocab, int(rng.integers(16, 257))).tolist()
        ids = system[tenant] + user
        reqs.append(Request(f"q{i:03d}", round(float(t), 3), len(ids), int(rng.integers(8, 257)),
                            prompt_ids=tuple(ids), tenant=tenant))
    return Workload(reqs, name="shared_prefix_200")


def poisson_mixed_csv(n=500, rate_per_s=8.0, seed=7) -> str:
    """Vidur-style CSV (arrived_at in seconds): a long-tailed mix of prompt/output lengths."""
    rng = np.random.default_rng(seed)
    t = np.concatenate([[0.0], np.cumsum(rng.exponential(1.0 / rate_per_s, n - 1))])
    prompt = np.clip(rng.lognormal(6.0, 1.0, n), 8, 8192).astype(int)
    out = np.clip(rng.lognormal(4.8, 0.9, n), 1, 2048).astype(int)
    lines = ["arrived_at,num_prefill_tokens,num_decode_tokens"]
    lines += [f"{a:.6f},{p},{o}" for a, p, o in zip(t, prompt, out)]
    return "\n".join(lines) + "\n"


def llmservingsim_jsonl(n=64, seed=3) -> str:
    rng = np.random.default_rng(seed)
    t_ns = np.concatenate([[0], np.cumsum(rng.exponential(50e6, n - 1))]).astype(np.int64)
    rows = [{"input_toks": int(rng.integers(32, 1025)), "output_toks": int(rng.integers(16, 513)),
             "arrival_time_ns": int(a)} for a in t_ns]
    return "".join(json.dumps(r) + "\n" for r in rows)


def vllm_style_result(trace, fail_ids=(), name="example") -> dict:
    """A result file in vLLM's `--save-result` format, synthesized from a simulated trace so the
    importer has a realistic file to read (it is NOT a vLLM measurement). Summary fields follow
    vLLM's calculate_metrics: successful requests only; TPOT = (latency - TTFT)/(n - 1) for
    n > 1; ITL pooled over all chunk gaps; np.percentile's default (linear) estimator."""
    ids = trace.ids
    tk = trace.tokens.sort_values(["req", "index"])
    arrival = trace.requests["arrival_ms"].to_numpy() / 1000.0
    ttfts, itls, outs, ins, errors = [], [], [], [], []
    for r, g in tk.groupby("req"):
        t = g["t_ms"].to_numpy() / 1000.0
        failed = ids[r] in fail_ids
        ttfts.append(0.0 if failed else float(t[0] - arrival[r]))
        itls.append([] if failed else np.diff(t).tolist())
        outs.append(0 if failed else len(t))
        ins.append(int(trace.requests["prompt_tokens"].iloc[r]))
        errors.append("ClientPayloadError: Response payload is not completed" if failed else "")
    ok = [i for i, e in enumerate(errors) if not e]
    ttft = np.array([ttfts[i] for i in ok])
    lat = np.array([ttfts[i] + sum(itls[i]) for i in ok])
    tpot = np.array([(lat[k] - ttft[k]) / (outs[i] - 1) for k, i in enumerate(ok) if outs[i] > 1])
    itl = np.array([g for i in ok for g in itls[i]])
    start = float(arrival.min())
    end = max(float(arrival[i] + ttfts[i] + sum(itls[i])) for i in ok)
    duration = end - start
    res = {"date": "20261129-000000", "backend": "vllm", "model_id": "example (simulated)",
           "request_rate": "inf", "duration": duration, "completed": len(ok), "failed": len(ids) - len(ok),
           "total_input_tokens": int(sum(ins[i] for i in ok)), "total_output_tokens": int(sum(outs[i] for i in ok)),
           "request_throughput": len(ok) / duration, "output_throughput": sum(outs[i] for i in ok) / duration}
    for m, v in (("ttft", ttft), ("tpot", tpot), ("itl", itl), ("e2el", lat)):
        res[f"mean_{m}_ms"] = float(np.mean(v) * 1000)
        res[f"median_{m}_ms"] = float(np.median(v) * 1000)
        res[f"std_{m}_ms"] = float(np.std(v) * 1000)
        for q in (90, 99):
            res[f"p{q}_{m}_ms"] = float(np.percentile(v, q) * 1000)
    res.update({"input_lens": ins, "output_lens": outs, "ttfts": ttfts, "itls": itls, "errors": errors,
                "note": f"{name}: synthesized in vLLM's result format from a core simulation; not a measurement"})
    return res


def write_json(path: Path, doc):
    """One request per line: readable, diff-friendly."""
    path.parent.mkdir(parents=True, exist_ok=True)
    head = {k: v for k, v in doc.items() if k != "requests"}
    lines = ["{"] + [f" {json.dumps(k)}: {json.dumps(v)}," for k, v in head.items()]
    lines.append(' "requests": [')
    reqs = doc["requests"]
    lines += [f"  {json.dumps(r)}{',' if i < len(reqs) - 1 else ''}" for i, r in enumerate(reqs)]
    lines += [" ]", "}"]
    path.write_text("\n".join(lines) + "\n")


def main():
    wl = DATA / "workloads"
    write_json(wl / "chapter31.json", CHAPTER31.to_dict())
    write_json(wl / "burst5.json", burst5().to_dict())
    write_json(wl / "shared_prefix_200.json", shared_prefix().to_dict())
    (wl / "poisson500_vidur.csv").write_text(poisson_mixed_csv())
    (wl / "llmservingsim64.jsonl").write_text(llmservingsim_jsonl())
    note = ("Assigned emission timestamps from Chapter 31, Table 31.1: a teaching scenario, "
            "not a measurement of any framework.")
    for name, em in (("serial", CHAPTER31_SERIAL), ("continuous", CHAPTER31_CONTINUOUS)):
        tr = given_trace(CHAPTER31, em, {"label": f"Chapter 31 {name} schedule (given)", "created": CREATED,
                                         "notes": note, "workload": "chapter31"})
        save_trace(tr, DATA / "traces" / f"chapter31_{name}.json", pretty=True)
    # Simulated traces of the shared-prefix workload, prefix caching on vs off (compare them).
    from core.config import SchedulerConfig
    from core.sim.simulate import simulate
    from core.sim.stepmodel import StepModel
    sp = shared_prefix()
    sp = Workload(sp.requests[:60], name="shared_prefix_60")
    model = StepModel("affine", base_ms=4.0, prefill_ms_per_token=0.05, decode_ms_per_seq=0.2)
    for on in (True, False):
        cfg = SchedulerConfig("continuous", max_seqs=16, token_budget=2048, chunk=512, kv_blocks=400,
                              prefix_caching=on)
        tr = simulate(sp, cfg, model, label=f"shared prefix, prefix caching {'on' if on else 'off'} (simulated)",
                      created=CREATED)
        save_trace(tr, DATA / "traces" / f"shared_prefix_caching_{'on' if on else 'off'}.json.gz")
    # A vLLM-format result file (synthesized) with one failed request.
    base = simulate(Workload(sp.requests[:40], name="vllm_example"),
                    SchedulerConfig("continuous", max_seqs=8), model, created=CREATED)
    (DATA / "imports").mkdir(exist_ok=True)
    (DATA / "imports" / "vllm_example_result.json").write_text(
        json.dumps(vllm_style_result(base, fail_ids=("q007",), name="vllm_example_result.json")) + "\n")
    # One real vLLM run from its files (client result, iteration log, spans, KV events, /metrics), merged.
    from core.trace import open_trace
    from core.trace.imports.merge import merge
    run = DATA / "imports" / "vllm_telemetry" / "run2_poisson4_p192_o48"
    names = ["vllm_bench_run2.json", "spans.otlp.jsonl", "server.log", "kv_events.jsonl", "metrics_scrapes.jsonl"]
    merged, _ = merge([open_trace(run / n) for n in names],
                      [f"data/imports/vllm_telemetry/{run.name}/{n}" for n in names])
    save_trace(merged, DATA / "traces" / "vllm_cpu_run2_merged.json.gz")
    print("wrote", *sorted(str(p.relative_to(ROOT)) for p in (DATA / "workloads").iterdir()),
          *sorted(str(p.relative_to(ROOT)) for p in (DATA / "traces").iterdir()), sep="\n  ")


if __name__ == "__main__":
    main()
