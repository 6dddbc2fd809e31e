"""One run from several files: a client's per-request file, the server's iteration log, its
request spans, its KV events and /metrics samples, joined onto one clock and by request.

The base is the file with the client's requests (else the spans' requests, else the first
file); every other file is moved onto its clock by an offset, found in one of three ways, each
stated with its uncertainty:
- both clocks are epoch clocks (AIPerf, guidellm, spans, KV events, scrapes): the difference of
  their origins (exact when one host wrote both; otherwise as good as the hosts' clock sync);
- a perf_counter client (vllm bench serve, inference-perf) and epoch spans: the requests are
  paired (by id, else in order of arrival) and the offset is the median of (span start -
  client send); the uncertainty is half the spread of those differences;
- the iteration log (wall clock, one-second resolution, no year, the server's time zone): its
  calendar time gives the offset to the hour; the offset within +-1.5 s (and whole hours, for
  the time zone) that puts the most logged prefill steps at the spans' first scheduled times
  (arrival + time in queue) is kept, and the median distance of those is its uncertainty.
Each file's role comes from its kind (core.trace.imports.sniff.IMPORTERS: requests, spans,
steps, telemetry; one of our own traces by what it holds), and each role's join is one entry
of `JOINS`; the spans' and the log's alignments live beside their importers (otlp.py,
vllm_log.py). Spans add each request's engine-side view (engine_arrival_ms, engine_ttft_ms, engine_e2e_ms and
the phases) to the matching client request; steps, KV events and gauges are shifted. Events
that land before the base's origin are dropped and counted.
"""
from __future__ import annotations

import pandas as pd

from core.errors import TraceError
from core.trace.imports import otlp, vllm_log
from core.trace.imports.imported import Imported, epoch_offset
from core.trace.imports.sniff import role_of
from core.trace.model import Trace, frame
from core.trace.schema import KV_EVENT, STEP


def _trace(x) -> Trace:
    tr = x.trace if isinstance(x, Imported) else x
    if tr is None:
        raise TraceError("a summary-only file has nothing to merge")
    return tr


def _clock(tr: Trace, name: str) -> dict:
    c = tr.meta.get("clock")
    if not isinstance(c, dict) or c.get("kind") not in ("epoch", "perf_counter", "wall-clock"):
        raise TraceError(f"{name}: its clock is not recorded (meta.clock): merge needs to know what t_ms 0 is")
    return c


def role(part) -> str:
    """What a part adds to the run: an imported file by its kind; one of our own traces by what
    it holds (requests whose arrivals were measured at the engine are spans, as `gpu_runner
    observe` records them; requests otherwise; an iteration log's steps on a wall clock; else
    telemetry)."""
    if isinstance(part, Imported):
        return role_of(part.kind)
    tr = part
    if len(tr.requests):
        where = str((tr.meta.get("provenance") or {}).get("arrival_ms", ""))
        return "spans" if where.startswith("engine") else "requests"
    if (tr.meta.get("clock") or {}).get("kind") == "wall-clock" and len(tr.steps):
        return "steps"
    return "telemetry"


def _shift_table(df: pd.DataFrame, off: float) -> tuple[pd.DataFrame, int]:
    if not len(df):
        return df, 0
    t = df["t_ms"].to_numpy(dtype=float) + off
    keep = t >= 0
    out = df[keep].copy()
    out["t_ms"] = t[keep]
    return out.reset_index(drop=True), int((~keep).sum())


class _Run:
    """The merge in progress: the base, the output, each part's offset, the epoch origin."""

    def __init__(self, trs, clocks, names, roles, b):
        self.trs, self.clocks, self.names, self.roles, self.b = trs, clocks, names, roles, b
        self.base, self.base_c = trs[b], clocks[b]
        base = self.base
        self.out = Trace(meta=dict(base.meta), requests=base.requests.copy(), tokens=base.tokens,
                         finishes=base.finishes, steps=base.steps, batch=base.batch, kv=base.kv,
                         kv_events=base.kv_events, preempts=base.preempts, other=list(base.other),
                         request_extra=[dict(e) for e in base.request_extra], extra=dict(base.extra))
        self.offsets = {b: 0.0}
        c = self.base_c
        # the base's origin on the epoch clock: its own, or found through the first aligned epoch file
        self.epoch0 = (c["t0_s"], float(c.get("resolution_ms") or 0)) if c["kind"] == "epoch" else None


def _join_spans(run: _Run, k: int, row: dict):
    tr, c = run.trs[k], run.clocks[k]
    off, unc, how, pairs = otlp.align_spans(run.base, run.base_c, tr, c)
    otlp.attach_spans(run.out, tr, pairs, off)
    row.update(role="engine spans -> engine_* per request", matched=f"{len(pairs)} of {len(run.base.ids)}")
    if run.epoch0 is None and c["kind"] == "epoch":
        run.epoch0 = (c["t0_s"] - off / 1000.0, unc)
    return off, unc, how


def _join_steps(run: _Run, k: int, row: dict):
    tr, names = run.trs[k], run.names
    ref = next((kk for kk in run.offsets if run.roles[kk] == "spans"), None)
    if ref is None:
        raise TraceError(f"{names[k]}: aligning an iteration log needs the run's spans (its requests' "
                         "scheduled times) among the files")
    if len(run.out.steps):
        raise TraceError(f"{names[k]}: the base already has step events ({names[run.b]})")
    steps, off, unc, how = vllm_log.align_steps(tr, run.trs[ref], run.offsets[ref], run.epoch0[0])
    run.out.steps, row["dropped"] = _shift_table(steps, 0.0)
    engine = tr.meta.get("engine") or {}
    if "policy" in engine:      # the log's own scheduler options, for re-simulating the run
        run.out.meta["engine"] = {**(run.out.meta.get("engine") or {}), **engine}
    row["role"] = "engine steps (iteration log)"
    return off, unc, how


def _join_telemetry(run: _Run, k: int, row: dict):
    tr, c, names, base_c, out = run.trs[k], run.clocks[k], run.names, run.base_c, run.out
    if c["kind"] != "epoch" or run.epoch0 is None:
        raise TraceError(f"{names[k]}: a {c['kind']} clock cannot be aligned with the base's "
                         f"{base_c['kind']} clock by itself; add the run's spans")
    off, unc, how = epoch_offset({"t0_s": run.epoch0[0], "resolution_ms": run.epoch0[1]}, c)
    if base_c["kind"] != "epoch":
        how += " (the base's origin on the epoch clock from the spans)"
    row["role"] = "KV events / gauges / steps"
    kv, d1 = _shift_table(tr.kv_events, off)
    if len(kv):
        out.kv_events = frame(KV_EVENT, {f.name: kv[f.name] for f in KV_EVENT.columns})
    if len(kv) and len(run.base.kv_events):
        raise TraceError(f"{names[k]}: the base already has KV events")
    g = [{**e, "t_ms": e["t_ms"] + off} for e in tr.other if e.get("type") == "gauge"]
    out.other += [e for e in g if e["t_ms"] >= 0]
    row["dropped"] = d1 + sum(e["t_ms"] < 0 for e in g)
    if len(tr.steps) and not len(out.steps):
        out.steps, d2 = _shift_table(tr.steps, off)
        row["dropped"] += d2
    return off, unc, how


# role -> how a part of that role joins the base (a second client file: its telemetry, if any)
JOINS = {"spans": _join_spans, "steps": _join_steps, "telemetry": _join_telemetry, "requests": _join_telemetry}


def merge(parts: list, names: list[str]) -> tuple[Trace, list[dict]]:
    """One trace of a run from its parts (Trace or Imported, with meta.clock), and one report
    row per part: {file, role, clock, offset_ms, uncertainty_ms, how, matched, dropped}."""
    trs = [_trace(p) for p in parts]
    clocks = [_clock(t, n) for t, n in zip(trs, names)]
    roles = [role(p) for p in parts]     # (a kind with role "none" never reads: its importer refuses the file)
    clients = [k for k, t in enumerate(trs) if roles[k] == "requests" and len(t.requests)]
    spans_k = [k for k, t in enumerate(trs) if roles[k] == "spans" and len(t.requests)]
    b = clients[0] if clients else spans_k[0] if spans_k else 0
    if roles[b] == "steps":
        raise TraceError(f"{names[b]}: an iteration log alone has no requests to merge onto; give a client's file "
                         "or the spans too")
    run = _Run(trs, clocks, names, roles, b)
    base_c = run.base_c
    report = [{"file": names[b], "role": "base (its clock is the trace's)", "clock": base_c["kind"], "offset_ms": 0.0,
               "uncertainty_ms": float(base_c.get("resolution_ms") or 0), "how": base_c.get("how", ""),
               "matched": None, "dropped": 0}]
    # spans first (the log aligns to them), then everything else
    order = [k for k in spans_k if k != b] + [k for k in range(len(trs)) if k != b and k not in spans_k]
    for k in order:
        row = {"file": names[k], "clock": clocks[k]["kind"], "matched": None, "dropped": 0}
        off, unc, how = JOINS[roles[k]](run, k, row)
        run.offsets[k] = off
        row.update(offset_ms=off, uncertainty_ms=unc, how=how)
        report.append(row)
    out, base = run.out, run.base
    if len(out.steps):
        out.steps = frame(STEP, {f.name: out.steps[f.name] for f in STEP.columns})
    out.meta["label"] = f"{base.label} + {len(parts) - 1} more file(s) (merged)"
    out.meta["merged_from"] = report
    prov = dict(base.meta.get("provenance") or {})
    for k in order:
        for key, v in (trs[k].meta.get("provenance") or {}).items():
            prov.setdefault(key if key not in prov else f"engine {key}", v)
    out.meta["provenance"] = prov
    out.meta["notes"] = " ".join([str(base.meta.get("notes") or "")] + [
        f"Merged {r['file']} ({r['role']}): offset {r['offset_ms']:.3f} ms ± {r['uncertainty_ms']:.3f} ms, "
        f"{r['how']}" + (f"; {r['dropped']} event(s) before the base's origin dropped" if r["dropped"] else "") + "."
        for r in report[1:]])
    return out, report
