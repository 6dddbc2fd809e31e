"""Load, SLOs and capacity for the "Load & SLOs" page: sweeps per policy, the point a page
inspects, and Exercise 6 of chapter 31 with numbers.

Exercise 6 asks whether a server that completes more tokens by delaying first tokens beyond
the application's limit has improved under a contract with a hard TTFT bound. It has not: a
bound is a gate, not a preference that throughput can buy off. `exercise6()` builds such a
pair of schedules with the simulator: the same burst of long prompts arriving while short
requests decode, scheduled without chunking (each long prompt prefilled in one step) and with
small prefill chunks (decodes keep flowing, so more tokens come out in the fixed window,
while the long prompts' first tokens slip past the bound).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from core.analysis.metrics import SLO, summarize
from core.config import SchedulerConfig
from core.config import describe_options as describe
from core.errors import InputError
from core.experiments.sweep import point_summary, retimed, sweep
from core.lessons.schedules import POLICY_LABELS, policy_config
from core.sim.simulate import simulate
from core.sim.stepmodel import StepModel
from core.workload import Request, Workload

MAX_POINTS_PER_POLICY = 24   # a page's sweep; python -m core sweep takes up to core.experiments.sweep.MAX_POINTS
# A page's capacity search (what one click may start; a link starts none): at most this many simulated
# tokens (core.experiments.search.simulated_tokens: configurations x the workload's prompt + output tokens;
# measured here 0.1-0.6 us per token on one CPU, ~25 us when every step holds one request of a
# one-token chunk), and no configuration started after SEARCH_BUDGET_S seconds.
SEARCH_MAX_TOKENS = 40_000_000
SEARCH_BUDGET_S = 60.0
NOTE_CHARS = 48              # a note fits the table's wide column; longer reasons are listed below it


def sweep_policies(workload: Workload, policies: list[str], config: SchedulerConfig, step_model: StepModel,
                   chunk: int | None, rates=None, concurrency=None, seed: int = 0, slo: SLO | None = None,
                   attainment: float = 0.9) -> dict[str, dict]:
    """{policy label: core.experiments.sweep.sweep result} for each policy (core.analysis.compare's names)."""
    return {POLICY_LABELS[p]: sweep(workload, policy_config(p, config, chunk), step_model, rates=rates,
                                    concurrency=concurrency, seed=seed, slo=slo, attainment=attainment)
            for p in policies}


@dataclass(frozen=True)
class Exercise6:
    workload: Workload
    step_model: StepModel
    schedules: dict[str, SchedulerConfig]
    slo: SLO
    window_ms: tuple[float, float]
    notes: list[str] = field(default_factory=list)


def exercise6_preset() -> Exercise6:
    """8 short requests decoding from t=0 (16-token prompts, 60 output tokens) and 6 long
    ones (400-token prompts, 40 output tokens) arriving every 15 ms from 20 ms; affine step
    model 5 ms + 0.2 ms per prefill token + 0.5 ms per decoding sequence; contract: TTFT <=
    500 ms; throughput counted in the fixed window [0, 400] ms."""
    reqs = ([Request(f"short{i}", 0.0, 16, 60) for i in range(8)]
            + [Request(f"long{i}", 20.0 + 15.0 * i, 400, 40) for i in range(6)])
    return Exercise6(
        Workload(reqs, name="exercise 6: long prompts arrive while short requests decode"),
        StepModel("affine", base_ms=5.0, prefill_ms_per_token=0.2, decode_ms_per_seq=0.5),
        {"no chunking": SchedulerConfig("continuous"),
         "chunks of 32, 48-token budget": SchedulerConfig("continuous", chunk=32, token_budget=48)},
        SLO(ttft_ms=500.0), (0.0, 400.0))


def exercise6(ex: Exercise6 | None = None) -> list[dict]:
    """Per schedule: tokens and tokens/s in the fixed window, the TTFT bound's verdict (how
    many requests exceed it, the worst TTFT), and whether the contract holds."""
    ex = ex or exercise6_preset()
    rows = []
    for label, cfg in ex.schedules.items():
        tr = simulate(ex.workload, cfg, ex.step_model, label=label)
        s = summarize(tr, window=ex.window_ms, slo=ex.slo, per_request=False)["summary"]
        slo = s["slo"]
        rows.append({"schedule": label, "trace": tr, "window_tokens": s["output_tokens"],
                     "window_tok_per_s": s["output_tok_per_s"], "ttft_max_ms": s["ttft_ms"]["max"],
                     "ttft_median_ms": s["ttft_ms"]["median"], "over_bound": slo["violations"]["ttft"],
                     "requests": slo["requests"], "contract_holds": slo["violations"]["ttft"] == 0
                     and slo["violations"]["failed"] == 0})
    return rows


def parse_loads(text: str, kind: str) -> list[float]:
    """Loads typed on the page ("5, 10, 20"): sorted, distinct, positive; closed loops take
    whole numbers of clients."""
    parts = [x.strip() for x in text.replace(";", ",").split(",") if x.strip()]
    if not parts:
        raise InputError("loads: expected comma-separated numbers, e.g. 5,10,20")
    out = []
    for x in parts:
        try:
            v = float(x)
        except ValueError:
            raise InputError(f"loads: {x!r} is not a number") from None
        if not v > 0 or v != v or v == float("inf") or (kind == "closed" and not v.is_integer()):
            what = "a whole number of clients" if kind == "closed" else "a rate"
            raise InputError(f"loads: {x!r}: expected {what} > 0")
        out.append(v)
    if len(out) > MAX_POINTS_PER_POLICY:
        raise InputError(f"loads: {len(out)} points; at most {MAX_POINTS_PER_POLICY} per sweep here "
                         "(python -m core sweep takes up to 200)")
    return sorted(set(out))


_NOTE_LOAD = (re.compile(r"closed loop, concurrency (\d+)"), re.compile(r"Poisson ([0-9.]+) req/s"))


def run_load(trace, file_summary: dict | None = None) -> dict | None:
    """Where a measured run sits on a sweep's axis: {"kind": "open", "rate"} or {"kind":
    "closed", "concurrency"}, from meta.load (gpu_runner loadgen, core.experiments.sweep), a vLLM result
    file's max_concurrency / request_rate, or (captures made before meta.load existed) the
    loadgen note "closed loop, concurrency N" / "Poisson R req/s". None: not a load run."""
    meta = trace.meta if trace is not None else {}
    load = meta.get("load")
    if isinstance(load, dict) and load.get("kind") in ("open", "closed"):
        return load
    fs = file_summary or {}
    if fs.get("max_concurrency") not in (None, "None"):
        return {"kind": "closed", "concurrency": int(fs["max_concurrency"])}
    rate = fs.get("request_rate")
    if rate not in (None, "inf", float("inf")):
        return {"kind": "open", "rate": float(rate)}
    notes = str(meta.get("notes") or "")
    m = _NOTE_LOAD[0].search(notes)
    if m:
        return {"kind": "closed", "concurrency": int(m.group(1))}
    m = _NOTE_LOAD[1].search(notes)
    if m:
        return {"kind": "open", "rate": float(m.group(1))}
    return None


def measured_point(label: str, trace, slo: SLO | None, file_summary: dict | None = None) -> dict | None:
    """A measured or imported run as a sweep point (core.experiments.sweep.point_summary) with its load
    and label; None when the file does not say what load it ran under."""
    load = run_load(trace, file_summary)
    if load is None or trace is None or not len(trace.tokens):
        return None
    key = "rate" if load["kind"] == "open" else "concurrency"
    return {"label": label, "kind": load["kind"], key: load[key], "origin": trace.meta.get("source"),
            **point_summary(trace, slo)}


def search_table(found: dict) -> tuple[list[dict], list[dict], list[str]]:
    """A capacity search's points as table rows: (shown, exported, reasons). Shown: numbers as text,
    an em dash where a configuration has none, and a short note saying why (stopped early, invalid,
    not simulated, no goodput) or whether it meets the SLOs and is the answer; an invalid point's
    reason, often longer than a table cell, is numbered and listed in `reasons` ("invalid: reason 1
    below"). Exported: the same rows with numbers (None where missing) and the whole reasons."""
    priced = found.get("usd_per_hour") is not None
    best = (found.get("best") or {}).get("config")
    reasons: list[str] = []
    shown, exported = [], []
    for p in found["points"]:
        ran = "slo" in p
        nums = {"SLO met": p["slo"]["attainment"] if ran else None,
                "goodput tok/s": p["slo"]["goodput_tok_per_s"] if ran else None,
                "TTFT p99 ms": p["ttft_ms"]["p99"] if ran else None}
        if priced:
            nums["USD per 1k good tokens"] = p.get("cost_per_1k_good_tokens_usd")
        if "invalid" in p:
            if p["invalid"] not in reasons:
                reasons.append(p["invalid"])
            note, full = f"invalid: reason {reasons.index(p['invalid']) + 1} below", f"invalid: {p['invalid']}"
        elif p.get("pruned"):
            note = f"stopped early: {p['prefix_misses']} of the first {p['prefix_requests']} missed"
            full = (f"stopped early: {p['prefix_misses']} of the first {p['prefix_requests']} requests missed the "
                    f"SLOs (attainment at most {p['attainment_at_most']:.3f})")
        elif "not_run" in p:
            note, full = "not simulated: the time budget was spent", p["not_run"]
        elif not p["slo"]["goodput_tok_per_s"]:
            note = full = "no request met the SLOs: no goodput, no cost"
        else:
            note = full = ("cheapest meeting the SLOs" if priced else "the answer") if p["config"] == best else (
                "meets the SLOs" if p["meets"] else "misses the SLOs")
        name = describe(p["config"])
        shown.append({"configuration": name, **{k: _cell(k, v) for k, v in nums.items()}, "note": note})
        exported.append({"configuration": name, **nums, "note": full})
    return shown, exported, reasons


def _cell(column: str, v) -> str:
    """A number as the table shows it (plain decimals, never 1e-05 or µ), an em dash for none."""
    if v is None or v != v:
        return "—"
    if column == "SLO met":
        return f"{v:.3f}"
    if column.startswith("USD"):
        import numpy as np
        return np.format_float_positional(v, precision=3, unique=False, fractional=False, trim="-")
    return f"{v:,.1f}"


def searched_workload(workload: Workload, rate: float, seed: int) -> Workload:
    """The workload a capacity search simulated (core.experiments.search: retimed at `rate`, Poisson, `seed`),
    named so that the Schedules page says where it came from."""
    timed = retimed(workload, rate, seed)
    return Workload(timed.requests, name=f"{workload.name} at {rate:g} req/s (Poisson, seed {seed}), from the "
                                         "Load & SLOs capacity search")


def schedules_link(config: dict, policy: str, chunk: int, block_size: int, step_model: StepModel,
                   usd_per_hour: float | None) -> dict[str, str]:
    """The Schedules page's URL parameters (ui.URL_KEYS) of a searched configuration on the searched
    workload (its scenario "Upload": the workload is handed over in the session)."""
    params = {"sc": "Upload", "pol": policy, "ms": str(config.get("max_seqs") or 0),
              "tb": str(config.get("token_budget") or 0), "kb": str(config.get("kv_blocks") or 0),
              "ch": str(int(chunk)), "bs": str(int(block_size)), "s_kind": "affine",
              "s_base": f"{step_model.base_ms:g}", "s_pp": f"{step_model.prefill_ms_per_token:g}",
              "s_pd": f"{step_model.decode_ms_per_seq:g}"}
    if usd_per_hour:
        params["usd"] = f"{usd_per_hour:g}"
    return params


def search_signature(*args) -> str:
    """A digest of a capacity search's inputs (a workload by its requests), to tell whether a result
    kept in a session is the one of the inputs now on the page."""
    import hashlib
    h = hashlib.sha256()
    for a in args:
        if isinstance(a, Workload):
            for col in (a.arrival_ms, a.prompt_tokens, a.max_output_tokens):
                h.update(memoryview(col.astype("float64")).cast("B"))
            h.update(repr(list(a.ids)).encode())
        else:
            h.update(repr(a).encode())
    return h.hexdigest()
