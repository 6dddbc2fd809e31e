"""Fit on one vLLM run, predict another workload's run (issue 15's vLLM CPU target: median
per-request TTFT and E2E error <= 15% with the vllm-v1 policy and vLLM's settings).

    python -m bench.vllm_fidelity RUN_A.json RUN_B.json [RUN_C.json ...] [--max-seqs 16]
        [--token-budget 2048] [--block-size 128] [--method steps|requests] [--replay auto|send-times]
        [--engine-side]

RUN_A / RUN_B: `vllm bench serve --save-result` files with per-request details and send times
(bench/vllm_cpu.sh writes them as $OUT/vllm_bench_vllm.json), of different workloads on the
same server settings. Each is fitted (`--method steps`, the default: to the engine steps
inferred from the streamed token times, core.fit.stepinfer; `requests`: to the per-request TTFT
and E2E, core.fit.reqfit) and used to predict the others: the other file's requests (prompt and
output lengths) simulated with the fitted step model and compared request by request with
what vLLM measured. How the requests arrive (`--replay auto`): a run whose client kept a fixed
number of requests in flight (request rate inf, max concurrency C) is simulated as that
closed loop, each request sent when one finishes in the simulation; any other run at its
measured send times (`--replay send-times` forces that for all: a closed loop's send times
then carry the measured engine's speed into the prediction). With three or more runs, also
each run predicted by a joint fit of all the others. Prints; asserts nothing. Not run in CI.

`--engine-side`: compare with what vLLM measured itself rather than the client: each request's
TTFT and E2E from vLLM's OpenTelemetry span (bench/vllm_cpu.sh with OTLP=1 writes
vllm_spans.jsonl and windows.txt beside the result), from its arrival at vLLM's engine
front-end, simulated at those arrival times (open loop) or as the closed loop with the run's
own round trips (the k-th finish to the arrival of the request it released: the client's and
the API server's reaction, measured; the engine's finishes are simulated). That leaves out the HTTP
client and the API server's streaming, which on the 2-core machine share a saturated core.
"""
import argparse
import dataclasses
import json
import re
from pathlib import Path

import numpy as np

from core.analysis.metrics import request_metrics
from core.config import SchedulerConfig
from core.experiments.sweep import simulate_closed
from core.fit.predict import replayed_run
from core.fit.predict import round_trips_ms as core_round_trips
from core.fit.reqfit import errors, fit_from_requests
from core.fit.stepinfer import closed_loop_clients, fit_inferred
from core.sim.simulate import simulate
from core.trace import open_trace
from core.workload import Workload

INDEX = re.compile(r".*-(\d+)-\d+$")


def _run_spans(path: Path) -> list[dict] | None:
    """The `llm_request` spans that started inside the run's wall-clock window (windows.txt beside
    the result file), or None without spans or without the run's window."""
    spans_file, windows = path.parent / "vllm_spans.jsonl", path.parent / "windows.txt"
    if not spans_file.exists() or not windows.exists():
        return None
    window = {ln.split()[0]: (float(ln.split()[1]), float(ln.split()[2])) for ln in windows.read_text().splitlines()
              if ln.strip()}
    lo, hi = window.get(path.name, (None, None))
    if lo is None:
        return None
    spans = [json.loads(ln) for ln in spans_file.read_text().splitlines() if ln.strip()]
    return [sp for sp in spans if sp["name"] == "llm_request" and lo * 1e9 <= sp["start_ns"] <= hi * 1e9]


def _spans_by_request(path: Path, spans: list[dict], reqs: list) -> dict:
    """The spans by the id the importer gave their request, from the dataset index in vLLM's request id."""
    # `vllm bench serve` names request i of its dataset "bench-<hash>-i" (vLLM: "cmpl-bench-<hash>-i-0");
    # the importer names the same request "req<i>". Matching by send order is not enough: sends
    # 0.03 ms apart can reach the engine in either order.
    by_index = {}
    for sp in spans:
        m = INDEX.match(str(sp["attributes"].get("gen_ai.request.id", "")))
        if m is None:
            raise SystemExit(f"{path}: span request id {sp['attributes'].get('gen_ai.request.id')!r} has no index")
        by_index[f"req{int(m.group(1))}"] = sp
    if set(by_index) != {r.id for r in reqs}:
        raise SystemExit(f"{path}: the spans' request indices do not match the file's requests")
    return by_index


def _engine_view(path: Path, reqs: list, by_index: dict, t0: int) -> tuple[list, dict, dict]:
    """The requests at the engine front-end's arrival times (from t0, its first span's start), and
    vLLM's own TTFT and E2E (ms) by request id."""
    ttft, e2e, out = {}, {}, []
    for r in reqs:
        sp = by_index[r.id]
        a = sp["attributes"]
        if (a["gen_ai.usage.prompt_tokens"], a["gen_ai.usage.completion_tokens"]) != (r.prompt_tokens,
                                                                                       r.max_output_tokens):
            raise SystemExit(f"{path}: span and request {r.id} disagree on token counts")
        out.append(dataclasses.replace(r, arrival_ms=(sp["start_ns"] - t0) / 1e6))
        ttft[r.id] = a["gen_ai.latency.time_to_first_token"] * 1000.0
        e2e[r.id] = a["gen_ai.latency.e2e"] * 1000.0
    return out, ttft, e2e


def engine_side(path: Path, trace):
    """vLLM's own view of a run from the OpenTelemetry spans bench/vllm_cpu.sh collects (OTLP=1):
    the `llm_request` spans that started inside the run's wall-clock window (windows.txt beside
    the result file), matched to the result's requests by the dataset index in vLLM's request id
    (checked: vLLM's TTFT never exceeds the client's). Returns (workload with the engine
    front-end's arrival times, {id: TTFT ms}, {id: E2E ms}) or None without spans."""
    spans = _run_spans(path)
    if spans is None:
        return None
    reqs = trace.workload().requests            # send order
    if len(spans) != len(reqs):
        raise SystemExit(f"{path}: {len(spans)} vLLM spans in the run's window for {len(reqs)} requests")
    by_index = _spans_by_request(path, spans, reqs)
    out, ttft, e2e = _engine_view(path, reqs, by_index, min(sp["start_ns"] for sp in spans))
    measured = request_metrics(trace).set_index("id")
    late = [r.id for r in reqs if ttft[r.id] > measured.at[r.id, "ttft_ms"] + 1.0]
    if late:
        raise SystemExit(f"{path}: vLLM's TTFT exceeds the client's for {len(late)} requests (e.g. {late[0]}): "
                         "spans and requests are not matched")
    return Workload(out, name=f"{path.stem} (vLLM's arrivals)"), ttft, e2e


def round_trips_ms(workload, e2e: dict, clients: int) -> np.ndarray:
    """A closed loop's round trips on vLLM's clock (core.fit.predict.round_trips_ms)."""
    return core_round_trips([r.arrival_ms for r in workload.requests], [e2e[r.id] for r in workload.requests],
                            clients)


def run_name(path: Path) -> str:
    """The file's name, with its folder when the name is bench/vllm_cpu.sh's generic one."""
    return f"{path.parent.name}/{path.stem}" if path.stem.startswith("vllm_bench_") else path.stem


def row(fit_names, pred_name, how, e):
    print(f"{' + '.join(fit_names):>60} {pred_name:>40} {how:>16} {np.median(e['ttft_ms']):>9.1%} "
          f"{np.percentile(e['ttft_ms'], 90):>9.1%} {np.median(e['e2e_ms']):>8.1%} "
          f"{np.percentile(e['e2e_ms'], 90):>8.1%}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", help="two or more vLLM result files of different workloads")
    ap.add_argument("--max-seqs", type=int, default=16)
    ap.add_argument("--token-budget", type=int, default=2048)
    ap.add_argument("--block-size", type=int, default=128)
    ap.add_argument("--method", choices=("steps", "requests"), default="steps")
    ap.add_argument("--model", choices=("affine", "features"), default="affine")
    ap.add_argument("--replay", choices=("auto", "send-times"), default="auto")
    ap.add_argument("--engine-side", action="store_true",
                    help="compare with vLLM's own per-request TTFT and E2E (its OpenTelemetry spans, "
                         "vllm_spans.jsonl and windows.txt beside each result file) from its own arrival "
                         "times, leaving out the HTTP client and API server")
    a = ap.parse_args()
    cfg = SchedulerConfig("vllm-v1", max_seqs=a.max_seqs, token_budget=a.token_budget, block_size=a.block_size)
    runs, engine = [], {}
    for path in a.runs:
        imp = open_trace(path)
        if imp.trace is None or getattr(imp, "aligned_at_zero", False):
            raise SystemExit(f"{path}: needs per-request details with send times")
        runs.append((run_name(Path(path)), imp.trace))
        if a.engine_side:
            view = engine_side(Path(path), imp.trace)
            if view is None:
                raise SystemExit(f"{path}: --engine-side needs vllm_spans.jsonl and windows.txt beside it "
                                 "(bench/vllm_cpu.sh with OTLP=1)")
            engine[run_name(Path(path))] = view

    def fit(traces):
        if a.method == "steps":
            return fit_inferred(traces, cfg, a.model)[0]
        return fit_from_requests(traces, cfg, a.model)[0]

    def predict(sm, tr):
        clients = closed_loop_clients(tr) if a.replay == "auto" else None
        if a.engine_side:
            w, ttft, e2e = engine[tr_name[id(tr)]]
            if clients:
                delay = round_trips_ms(w, e2e, clients)
                sim = simulate_closed(w, cfg, sm, clients, delay_ms=delay)[0]
                how = f"closed {clients} +{np.median(delay):.1f}"
            else:
                sim, how = simulate(w, cfg, sm), "vLLM arr."
            p = request_metrics(sim).set_index("id")
            ids = [r.id for r in w.requests]
            return how, {"ttft_ms": np.array([abs(p.at[i, "ttft_ms"] - ttft[i]) / ttft[i] for i in ids]),
                         "e2e_ms": np.array([abs(p.at[i, "e2e_ms"] - e2e[i]) / e2e[i] for i in ids])}
        sim, clients = replayed_run(tr, cfg, sm, closed_loop=a.replay == "auto")
        return (f"closed {clients}" if clients else "send times"), errors(sim, tr)

    tr_name = {id(tr): name for name, tr in runs}
    print(f"scheduler: {cfg.to_dict()}; fitted to {a.method}, {a.model} model; "
          + ("vLLM's own TTFT/E2E (spans)" if a.engine_side else "the client's TTFT/E2E"))
    print(f"{'fit on':>60} {'predict':>40} {'arrivals':>16} {'TTFT med':>9} {'TTFT p90':>9} {'E2E med':>8} "
          f"{'E2E p90':>8}")
    for name, tr in runs:               # each run alone, predicting every run
        sm = fit(tr)
        for other, tb in runs:
            row([name], "(itself)" if other == name else other, *predict(sm, tb))
        print(f"{'':>60} {sm.describe()}")
    if len(runs) > 2:                   # all the others together, predicting the one left out
        for name, tr in runs:
            rest = [(n, t) for n, t in runs if n != name]
            sm = fit([t for _, t in rest])
            row([n for n, _ in rest], name, *predict(sm, tr))
            print(f"{'':>60} {sm.describe()}")


if __name__ == "__main__":
    main()
