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
  calendar time gives the offset in each real time zone (every UTC offset on a 15-minute grid,
  -12:00..+14:00); the zone and the offset within +-1.5 s that put the most logged prefill steps
  at the spans' first scheduled times (arrival + time in queue) are kept, and the median distance
  of those is its uncertainty.
Each file's role comes from its kind (core.trace.imports.sniff.IMPORTERS: requests, spans,
steps, telemetry; one of our own traces by what it holds), and each role's join is one entry
of `JOINS`; the spans' and the log's alignments live beside their importers (otlp.py,
vllm_log.py). Spans add each request's engine-side view (engine_arrival_ms, engine_ttft_ms,
engine_e2e_ms and the phases) to the matching client request; steps, KV events and gauges are
shifted, whichever file holds them (`gpu_runner observe` writes spans, KV events and gauges in
one trace).

Nothing is dropped without saying so. Engine events before the client's first request (its
warm-up or test request, samples taken before the run) are kept: the trace's origin moves to the
earliest event. A file with several runs (a guidellm sweep) joins with every run, on their common
epoch clock (or one run, chosen). What a join leaves out (spans that match no client request,
events of kinds a merge does not join) is counted in the trace's notes.

Files that cannot belong to the run are refused, each with its reason: the same file twice, a
second client's file, a second file of request spans, a second capture of KV events or steps,
a file whose events do not overlap the run in time, and one whose alignment is less certain
than the run is long.
"""
from __future__ import annotations

import hashlib

import numpy as np
import pandas as pd

from core.errors import TraceError
from core.trace.imports import otlp, vllm_log
from core.trace.imports.imported import Imported, epoch_offset
from core.trace.imports.sniff import role_of
from core.trace.model import Trace, frame
from core.trace.schema import KV_EVENT, STEP, TABLE_EVENTS
from core.workload import MAX_TIME_MS

NAMED = 5                    # runs named in a message about a file of many runs
EXTRA_TIMES = ("engine_arrival_ms", "abort_at_ms")    # per-request fields that are times on the trace's clock


def _fingerprint(tr: Trace) -> bytes:
    """What a file holds, in 16 bytes: its clock and every table's times (two files with the same
    fingerprint hold the same data)."""
    h = hashlib.blake2b(digest_size=16)
    h.update(repr(sorted((tr.meta.get("clock") or {}).items())).encode())
    for df, col in ((tr.requests, "arrival_ms"), *((getattr(tr, r.table), "t_ms") for r in TABLE_EVENTS)):
        h.update(len(df).to_bytes(8, "little"))
        if len(df):
            h.update(np.ascontiguousarray(df[col].to_numpy(dtype=float)).tobytes())
    h.update(repr([e.get("t_ms") for e in tr.other]).encode())
    return h.digest()


def _distinct(trs: list[Trace], names: list[str]):
    seen: dict[bytes, int] = {}
    for k, tr in enumerate(trs):
        j = seen.setdefault(_fingerprint(tr), k)
        if j != k:
            same = "is given twice" if names[j] == names[k] else f"holds the same data as {names[j]}"
            raise TraceError(f"{names[k]}: {same} (the same file twice, or one capture in two forms); give each "
                             "file of the run once")


def _labels(runs) -> str:
    shown = ", ".join(f"{k}: {r.run_label or k}" for k, r in enumerate(runs[:NAMED]))
    return shown + (f", and {len(runs) - NAMED:,} more" if len(runs) > NAMED else "")


def _epoch_runs(x: Imported, name: str) -> tuple[list[Trace], list[dict]]:
    """Each run's trace and clock, refused unless every run has requests on an epoch clock."""
    trs = [r.trace for r in x.runs]
    if any(t is None for t in trs):
        raise TraceError(f"{name}: holds {len(trs):,} runs ({_labels(x.runs)}), some with a summary only: choose "
                         f"one with requests (--run K, K in 0..{len(trs) - 1})")
    clocks = [t.meta.get("clock") or {} for t in trs]
    if any(c.get("kind") != "epoch" for c in clocks):
        kinds = sorted({str(c.get("kind") or "no") for c in clocks})
        raise TraceError(f"{name}: holds {len(trs):,} runs ({_labels(x.runs)}) on their own {'/'.join(kinds)} "
                         f"clocks, which do not place them in one run: choose one (--run K, K in 0..{len(trs) - 1})")
    return trs, clocks


def _shifted_tables(t: Trace, shift: float, base: int) -> dict[str, pd.DataFrame]:
    """A run's event tables, times moved by `shift` ms and request rows by `base`."""
    out = {}
    for rec in TABLE_EVENTS:
        df = getattr(t, rec.table).copy()
        for f in rec.columns:
            if f.name == "t_ms":
                df["t_ms"] = df["t_ms"] + shift
            elif f.type == "req":
                df[f.name] = np.where(df[f.name] >= 0, df[f.name] + base, df[f.name])
        out[rec.table] = df
    return out


def _all_runs_meta(x: Imported, name: str, first: Trace, t0: float) -> dict:
    n = len(x.runs)
    meta = {k: v for k, v in first.meta.items() if k != "load"}     # (each run's own place on a load sweep)
    return {**meta, "clock": {**first.meta["clock"], "t0_s": t0},
            "label": f"{name} (all {n} runs: {_labels(x.runs)})",
            "notes": f"Every one of the {n:,} runs of {name} ({_labels(x.runs)}), on their common epoch clock; "
                     "each request's run is in request_extra.run. " + str(first.meta.get("notes") or "")}


def _all_runs(x: Imported, name: str) -> Trace:
    """One trace of every run of a file of several (a guidellm sweep): requests and events of each
    on their common epoch clock, each request's run in request_extra["run"] (ids prefixed with the
    run's label when two runs share one)."""
    trs, clocks = _epoch_runs(x, name)
    t0 = min(c["t0_s"] for c in clocks)
    ids = [i for t in trs for i in t.ids]
    clash = pd.Index(ids).has_duplicates
    base = 0
    tables: dict[str, list[pd.DataFrame]] = {r.table: [] for r in TABLE_EVENTS}
    reqs, extra, other = [], [], []
    for r, t, c in zip(x.runs, trs, clocks):
        shift = (c["t0_s"] - t0) * 1000.0
        q = t.requests.copy()
        q["arrival_ms"] = q["arrival_ms"] + shift
        if clash:
            q["id"] = [f"{r.run_label}/{i}" for i in q["id"]]
        reqs.append(q)
        extra += [{**e, "run": r.run_label, **{f: e[f] + shift for f in EXTRA_TIMES if isinstance(e.get(f), float)}}
                  for e in t.request_extra]
        for table, df in _shifted_tables(t, shift, base).items():
            tables[table].append(df)
        other += [{**e, "t_ms": e["t_ms"] + shift} if "t_ms" in e else dict(e) for e in t.other]
        base += len(t.requests)
    first = trs[int(np.argmin([c["t0_s"] for c in clocks]))]
    tr = Trace(meta=_all_runs_meta(x, name, first, t0), requests=pd.concat(reqs, ignore_index=True),
               request_extra=extra, other=other)
    for rec in TABLE_EVENTS:
        setattr(tr, rec.table, frame(rec, {f.name: pd.concat(tables[rec.table], ignore_index=True)[f.name]
                                           for f in rec.columns}))
    return tr


def _trace(x, name: str, run: int | None) -> Trace:
    if isinstance(x, Imported) and len(x.runs) > 1:
        if run is None:
            return _all_runs(x, name)
        if not 0 <= run < len(x.runs):
            raise TraceError(f"{name}: --run {run}: the file holds runs 0..{len(x.runs) - 1} ({_labels(x.runs)})")
        x = x.runs[run]
    tr = x.trace if isinstance(x, Imported) else x
    if tr is None:
        raise TraceError(f"{name}: a summary-only file has nothing to merge")
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


def _times(tr: Trace) -> list[np.ndarray]:
    """Every absolute time a trace holds, ms on its clock (a step until its end)."""
    out = [tr.requests["arrival_ms"].to_numpy(dtype=float)]
    out += [getattr(tr, r.table)["t_ms"].to_numpy(dtype=float) for r in TABLE_EVENTS]
    if len(tr.steps):
        out.append(tr.steps["t_ms"].to_numpy(dtype=float) + tr.steps["dur_ms"].to_numpy(dtype=float))
    out.append(np.array([e["t_ms"] for e in tr.other if isinstance(e.get("t_ms"), (int, float))], dtype=float))
    return out


def _span(tr: Trace) -> tuple[float, float] | None:
    ts = [a for a in _times(tr) if len(a)]
    return (min(float(a.min()) for a in ts), max(float(a.max()) for a in ts)) if ts else None


def _apart(ms: float) -> str:
    s = abs(ms) / 1000.0
    for unit, size in (("days", 86400.0), ("h", 3600.0), ("min", 60.0)):
        if s >= size:
            return f"{s / size:,.1f} {unit}"
    return f"{s:,.3f} s"


def _check_belongs(run: _Run, k: int, off: float, unc: float, how: str):
    """Refuse a part whose alignment is less certain than the run is long, or whose events do not
    overlap the run's time at all (another session's capture, a file from another day or year)."""
    name, (r0, r1) = run.names[k], run.span
    length = r1 - r0
    if unc > max(length, 1.0):
        raise TraceError(f"{name}: aligned to the run only within ± {unc:,.0f} ms, more than the run lasts "
                         f"({length:,.0f} ms) ({how}): its events cannot be placed in this run; is it from it?")
    sp = _span(run.trs[k])
    if sp is None:
        return
    lo, hi = sp[0] + off, sp[1] + off
    if hi + unc < r0 or lo - unc > r1:
        when = f"{_apart(r0 - hi)} before the run begins" if hi < r0 else f"{_apart(lo - r1)} after the run ends"
        raise TraceError(f"{name}: its events end {when} (on the run's clock: {lo:,.0f} .. {hi:,.0f} ms, the run "
                         f"{r0:,.0f} .. {r1:,.0f} ms; {how}): it is not from this run")


class _Run:
    """The merge in progress: the base, the output, each part's offset, the epoch origin, and
    which file gave the run's steps and KV events."""

    def __init__(self, trs, clocks, names, roles, b):
        self.trs, self.clocks, self.names, self.roles, self.b = trs, clocks, names, roles, b
        self.base, self.base_c = trs[b], clocks[b]
        base = self.base
        self.out = Trace(meta=dict(base.meta), requests=base.requests.copy(), tokens=base.tokens,
                         finishes=base.finishes, steps=base.steps, batch=base.batch, kv=base.kv,
                         kv_events=base.kv_events, preempts=base.preempts, other=list(base.other),
                         request_extra=[dict(e) for e in base.request_extra], extra=dict(base.extra))
        self.offsets = {b: 0.0}
        self.span = _span(base)
        if self.span is None:
            raise TraceError(f"{names[b]}: holds no events to merge onto")
        self.steps_from = names[b] if len(base.steps) else None
        self.kv_from = names[b] if len(base.kv_events) else None
        c = self.base_c
        # the base's origin on the epoch clock: its own, or found through the first aligned epoch file
        self.epoch0 = (c["t0_s"], float(c.get("resolution_ms") or 0)) if c["kind"] == "epoch" else None

    def add_steps(self, k: int, steps: pd.DataFrame):
        if self.steps_from is not None:
            raise TraceError(f"{self.names[k]}: the run already has engine steps (from {self.steps_from}); one "
                             "engine's steps twice would double every step")
        self.out.steps, self.steps_from = steps, self.names[k]

    def add_engine_events(self, k: int, off: float, row: dict):
        """A part's KV events, gauge samples and steps (whichever it holds), moved by `off`; other
        events are counted in the row's left_out."""
        tr, name, out = self.trs[k], self.names[k], self.out
        if len(tr.kv_events):
            if self.kv_from is not None:
                raise TraceError(f"{name}: the run already has KV events (from {self.kv_from}); two captures of one "
                                 "engine's KV events would count every block twice")
            kv = tr.kv_events.copy()
            kv["t_ms"] = kv["t_ms"] + off
            out.kv_events, self.kv_from = frame(KV_EVENT, {f.name: kv[f.name] for f in KV_EVENT.columns}), name
        gauges = [{**e, "t_ms": e["t_ms"] + off} for e in tr.other if e.get("type") == "gauge"]
        out.other += gauges
        if len(tr.steps):
            steps = tr.steps.copy()
            steps["t_ms"] = steps["t_ms"] + off
            self.add_steps(k, steps)
        rest = [e.get("type") for e in tr.other if e.get("type") != "gauge"]
        if rest:
            row["dropped"] += len(rest)
            row["left_out"].append(f"{len(rest)} event(s) of type {', '.join(sorted(map(str, set(rest))))} (a merge "
                                   "joins requests, spans, steps, KV events and gauges)")
        added = ((len(tr.kv_events), "KV event rows"), (len(gauges), "gauge samples"), (len(tr.steps), "steps"))
        row["added"] = ", ".join(f"{n:,} {what}" for n, what in added if n)


def _join_spans(run: _Run, k: int, row: dict):
    tr, c = run.trs[k], run.clocks[k]
    off, unc, how, pairs = otlp.align_spans(run.base, run.base_c, tr, c)
    _check_belongs(run, k, off, unc, how)
    otlp.attach_spans(run.out, tr, pairs, off)
    row.update(role="engine spans -> engine_* per request", matched=f"{len(pairs)} of {len(run.base.ids)}")
    lone = len(tr.requests) - len({j for _, j in pairs})
    if lone:
        row["left_out"].append(f"{lone} of its {len(tr.requests)} request spans matched no client request (the "
                               "client's warm-up or test requests, or requests it did not record): their engine-side "
                               "times are not in the trace")
    if run.epoch0 is None and c["kind"] == "epoch":
        run.epoch0 = (c["t0_s"] - off / 1000.0, unc)
    run.add_engine_events(k, off, row)      # gpu_runner observe: KV events and gauges beside the spans
    return off, unc, how


def _join_steps(run: _Run, k: int, row: dict):
    tr, names = run.trs[k], run.names
    ref = next((kk for kk in run.offsets if run.roles[kk] == "spans"), None)
    if ref is None:
        raise TraceError(f"{names[k]}: aligning an iteration log needs the run's spans (its requests' "
                         "scheduled times) among the files")
    steps, gauges, off, unc, how = vllm_log.align_steps(tr, run.trs[ref], run.offsets[ref], run.epoch0[0])
    _check_belongs(run, k, off, unc, how)
    run.add_steps(k, steps)
    run.out.other += gauges
    engine = tr.meta.get("engine") or {}
    if "policy" in engine:      # the log's own scheduler options, for re-simulating the run
        run.out.meta["engine"] = {**(run.out.meta.get("engine") or {}), **engine}
    row["role"] = "engine steps (iteration log)"
    row["added"] = f"{len(steps)} steps, {len(gauges)} KV-usage samples"
    return off, unc, how


def _join_telemetry(run: _Run, k: int, row: dict):
    c, names, base_c = run.clocks[k], run.names, run.base_c
    if c["kind"] != "epoch" or run.epoch0 is None:
        raise TraceError(f"{names[k]}: a {c['kind']} clock cannot be aligned with the base's "
                         f"{base_c['kind']} clock by itself; add the run's spans")
    off, unc, how = epoch_offset({"t0_s": run.epoch0[0], "resolution_ms": run.epoch0[1]}, c)
    if base_c["kind"] != "epoch":
        how += " (the base's origin on the epoch clock from the spans)"
    _check_belongs(run, k, off, unc, how)
    row["role"] = "KV events / gauges / steps"
    run.add_engine_events(k, off, row)
    return off, unc, how


# role -> how a part of that role joins the base (a file of a client's role without requests: its telemetry)
JOINS = {"spans": _join_spans, "steps": _join_steps, "telemetry": _join_telemetry, "requests": _join_telemetry}


def _one_of_each(trs, roles, names) -> int:
    """The base: the client's file, else the spans; a second of either is refused."""
    clients = [k for k, t in enumerate(trs) if roles[k] == "requests" and len(t.requests)]
    spans_k = [k for k, t in enumerate(trs) if roles[k] == "spans" and len(t.requests)]
    if len(clients) > 1:
        raise TraceError(f"{names[clients[1]]}: a second client's requests ({names[clients[0]]} has the run's); a "
                         "run has one client file: merge each client's file with the engine's files on its own")
    if len(spans_k) > 1:
        raise TraceError(f"{names[spans_k[1]]}: a second file of request spans ({names[spans_k[0]]} has the "
                         "run's); give one")
    b = clients[0] if clients else spans_k[0] if spans_k else 0
    if roles[b] == "steps":
        raise TraceError(f"{names[b]}: an iteration log alone has no requests to merge onto; give a client's file "
                         "or the spans too")
    return b


def move_origin(out: Trace) -> tuple[float, int]:
    """Move the trace's zero to its earliest event when some came before it (the engine's work for
    a warm-up request, samples before the first request): (ms moved, events that were before)."""
    ts = [a for a in _times(out) if len(a)]
    lo = min(float(a.min()) for a in ts)
    hi = max(float(a.max()) for a in ts)
    if hi - min(lo, 0.0) > MAX_TIME_MS:
        raise TraceError(f"the files' events span {_apart(hi - min(lo, 0.0))}, more than a trace holds "
                         f"({_apart(MAX_TIME_MS)})")
    if lo >= 0:
        return 0.0, 0
    before = sum(int((a < 0).sum()) for a in ts)
    d = -lo
    out.requests = out.requests.copy()
    out.requests["arrival_ms"] = out.requests["arrival_ms"] + d
    for r in TABLE_EVENTS:
        df = getattr(out, r.table)
        if len(df):
            df = df.copy()
            df["t_ms"] = df["t_ms"] + d
            setattr(out, r.table, df)
    out.other = [{**e, "t_ms": e["t_ms"] + d} if isinstance(e.get("t_ms"), (int, float)) else e for e in out.other]
    out.request_extra = [{**e, **{f: e[f] + d for f in EXTRA_TIMES if isinstance(e.get(f), (int, float))}}
                         for e in out.request_extra]
    w = out.meta.get("client_window")
    if isinstance(w, dict) and all(isinstance(w.get(k), (int, float)) for k in ("start_ms", "end_ms")):
        out.meta["client_window"] = {**w, "start_ms": w["start_ms"] + d, "end_ms": w["end_ms"] + d}
    c = dict(out.meta.get("clock") or {})
    if isinstance(c.get("t0_s"), (int, float)):
        c["t0_s"] = c["t0_s"] - d / 1000.0
        c["how"] = f"{c.get('how', '')}; moved {d:.3f} ms earlier by the merge, to its earliest event"
        out.meta["clock"] = c
    return d, before


def _join_order(roles: list[str], b: int) -> list[int]:
    """The parts other than the base, spans first (the log aligns to them), then everything else."""
    spans_k = [k for k in range(len(roles)) if k != b and roles[k] == "spans"]
    return spans_k + [k for k in range(len(roles)) if k != b and k not in spans_k]


def _join(run: _Run, k: int) -> dict:
    """Join part k onto the run; its report row."""
    row = {"file": run.names[k], "clock": run.clocks[k]["kind"], "matched": None, "added": "", "dropped": 0,
           "left_out": []}
    off, unc, how = JOINS[run.roles[k]](run, k, row)
    run.offsets[k] = off
    row.update(offset_ms=off, uncertainty_ms=unc, how=how, left_out="; ".join(row["left_out"]))
    return row


def _tidy(out: Trace):
    """The joined steps as one checked table, the gauges of every source in time order (after the other events)."""
    if len(out.steps):
        out.steps = frame(STEP, {f.name: out.steps[f.name] for f in STEP.columns})
    gauges = sorted((e for e in out.other if e.get("type") == "gauge"), key=lambda e: e["t_ms"])   # several sources
    out.other = [e for e in out.other if e.get("type") != "gauge"] + gauges


def _provenance(base: Trace, trs: list[Trace], order: list[int]) -> dict:
    """The base's provenance, then each part's (a key the base has already: prefixed "engine ")."""
    prov = dict(base.meta.get("provenance") or {})
    for k in order:
        for key, v in (trs[k].meta.get("provenance") or {}).items():
            prov.setdefault(key if key not in prov else f"engine {key}", v)
    return prov


def _merge_notes(base: Trace, report: list[dict], moved: float, before: int) -> str:
    notes = [str(base.meta.get("notes") or "")] + [
        f"Merged {r['file']} ({r['role']}): offset {r['offset_ms']:.3f} ms ± {r['uncertainty_ms']:.3f} ms, "
        f"{r['how']}" + (f"; added {r['added']}" if r["added"] else "")
        + (f"; left out: {r['left_out']}" if r["left_out"] else "") + "." for r in report[1:]]
    if moved:
        notes.append(f"The trace's origin is {moved:.3f} ms before the base's first event, at the earliest event of "
                     f"any file, so that {before:,} event(s) from before the run's first request (a warm-up or test "
                     "request, samples taken before it) are kept.")
    return " ".join(n for n in notes if n)


def merge(parts: list, names: list[str], run: int | None = None) -> tuple[Trace, list[dict]]:
    """One trace of a run from its parts (Trace or Imported, with meta.clock), and one report
    row per part: {file, role, clock, offset_ms, uncertainty_ms, how, matched, added, dropped,
    left_out}. A file of several runs joins with all of them, or with run `run`."""
    trs = [_trace(p, n, run) for p, n in zip(parts, names)]
    _distinct(trs, names)
    clocks = [_clock(t, n) for t, n in zip(trs, names)]
    roles = [role(p) for p in parts]     # (a kind with role "none" never reads: its importer refuses the file)
    b = _one_of_each(trs, roles, names)
    run_ = _Run(trs, clocks, names, roles, b)
    base_c = run_.base_c
    report = [{"file": names[b], "role": "base (its clock is the trace's)", "clock": base_c["kind"], "offset_ms": 0.0,
               "uncertainty_ms": float(base_c.get("resolution_ms") or 0), "how": base_c.get("how", ""),
               "matched": None, "added": "", "dropped": 0, "left_out": ""}]
    order = _join_order(roles, b)
    report += [_join(run_, k) for k in order]
    out, base = run_.out, run_.base
    _tidy(out)
    moved, before = move_origin(out)
    out.meta["label"] = f"{base.label} + {len(parts) - 1} more file(s) (merged)"
    out.meta["merged_from"] = report
    out.meta["provenance"] = _provenance(base, trs, order)
    out.meta["notes"] = _merge_notes(base, report, moved, before)
    return out, report
