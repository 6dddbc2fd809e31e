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
Spans add each request's engine-side view (engine_arrival_ms, engine_ttft_ms, engine_e2e_ms and
the phases) to the matching client request; steps, KV events and gauges are shifted. Events
that land before the base's origin are dropped and counted.
"""
from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import pandas as pd

from core.errors import TraceError
from core.trace.imports.imported import Imported
from core.trace.model import Trace, frame
from core.trace.schema import KV_EVENT, STEP

PHASE_KEYS = ("engine_queue_ms", "engine_prefill_ms", "engine_decode_ms", "engine_inference_ms")


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


def _is_spans(tr: Trace) -> bool:
    return bool(len(tr.requests)) and "spans" in str(tr.meta.get("label", "")).lower() or (
        bool(len(tr.requests)) and any("engine_queue_ms" in e or "engine_e2e_ms" in e for e in tr.request_extra[:1])
        and tr.meta.get("provenance", {}).get("arrival_ms", "").startswith("engine"))


def _first_token(tr: Trace) -> pd.Series:
    tk = tr.tokens
    return tk[tk["index"] == 0].set_index("req")["t_ms"]


def pair_requests(base: Trace, spans: Trace) -> list[tuple[int, int]]:
    """(base row, span row) pairs: by id (the span's request id contains the client's request or
    response id, as vLLM builds it from X-Request-Id), else in order of arrival when the counts
    agree."""
    sid = spans.ids
    by_id = []
    keys = []
    for i, rid in enumerate(base.ids):
        ex = base.request_extra[i] if i < len(base.request_extra) else {}
        keys.append([k for k in (ex.get("response_id"), rid) if isinstance(k, str) and len(k) >= 8])
    index = {}
    for j, s in enumerate(sid):
        index.setdefault(s, j)
    for i, ks in enumerate(keys):
        j = next((index[s] for k in ks for s in (k, f"{k}-0", f"cmpl-{k}", f"cmpl-{k}-0") if s in index), None)
        if j is None:
            j = next((jj for jj, s in enumerate(sid) for k in ks if k in s), None)
        if j is not None:
            by_id.append((i, j))
    if len(by_id) >= max(1, len(base.ids) // 2):
        return by_id
    if len(base.ids) == len(sid):
        bi = np.argsort(base.requests["arrival_ms"].to_numpy(), kind="stable")
        sj = np.argsort(spans.requests["arrival_ms"].to_numpy(), kind="stable")
        return list(zip(bi.tolist(), sj.tolist()))
    return []


def _offset_epoch(base_c: dict, part_c: dict) -> tuple[float, float, str]:
    off = (part_c["t0_s"] - base_c["t0_s"]) * 1000.0
    unc = max(float(base_c.get("resolution_ms") or 0), float(part_c.get("resolution_ms") or 0))
    return off, unc, "both epoch clocks: the difference of their origins (one host, or hosts in clock sync)"


def _offset_by_pairs(base: Trace, spans: Trace, pairs) -> tuple[float, float, str]:
    """offset that moves span times onto the base: base send ~ span start - network delay."""
    if not pairs:
        raise TraceError("cannot pair the client's requests with the spans (no shared ids, and the counts differ)")
    a = base.requests["arrival_ms"].to_numpy()
    s = spans.requests["arrival_ms"].to_numpy()
    d = np.array([a[i] - s[j] for i, j in pairs])
    return float(np.median(d)), float((d.max() - d.min()) / 2), \
        f"paired {len(pairs)} requests; offset = median(client send - span start)"


def _log_calendar_epoch(clock: dict, near: float) -> float:
    """Epoch seconds of the log's t0 read as UTC, in the year that puts it nearest `near`."""
    best = None
    year0 = datetime.fromtimestamp(near, tz=UTC).year
    for year in (year0 - 1, year0, year0 + 1):
        try:
            t = datetime(year, clock["month"], clock["day"], tzinfo=UTC).timestamp()
        except ValueError:          # February 29 in a year without it
            continue
        t += float(clock["seconds_of_day"])
        if best is None or abs(t - near) < abs(best - near):
            best = t
    return best


def _scheduled(ref: Trace, ref_offset: float) -> np.ndarray:
    """The spans' requests' first scheduled times (arrival + time in queue) on the base clock, sorted."""
    arr = ref.requests["arrival_ms"].to_numpy() + ref_offset
    q = np.array([e.get("engine_queue_ms", np.nan) for e in ref.request_extra], dtype=float)
    return np.sort(arr + np.nan_to_num(q))


def _offset_log(log: Trace, ref: Trace, ref_offset: float, base_epoch: float) -> tuple[float, int, str]:
    """The iteration log's offset to the base clock from its calendar time (in the time zone, a
    whole number of hours from UTC, that best fits) and the spans' scheduled times: (offset ms,
    hours, a note on the time zone)."""
    sched = _scheduled(ref, ref_offset)
    pre = np.sort(log.steps[log.steps["prefill_reqs"] > 0]["t_ms"].to_numpy())
    if not len(sched) or not len(pre):
        raise TraceError("the log has no prefill steps or the spans no requests to align by")
    if not {"month", "day", "seconds_of_day"} <= log.meta["clock"].keys():
        raise TraceError("the log's clock has no calendar date (meta.clock month, day, seconds_of_day)")
    cal = (_log_calendar_epoch(log.meta["clock"], base_epoch) - base_epoch) * 1000.0

    def score(off):
        return float(np.median(_nearest(pre + off, sched)))
    by_hour = []
    for hours in range(-14, 15):           # the log's time zone: whole hours from UTC
        center = cal - hours * 3_600_000.0
        grid = np.arange(center - 1500.0, center + 1500.0 + 1e-9, 20.0)
        sc = [score(o) for o in grid]
        k = int(np.argmin(sc))
        by_hour.append((sc[k], float(grid[k]), hours))
    _, coarse, hours = min(by_hour)
    fine = np.arange(coarse - 25.0, coarse + 25.0 + 1e-9, 0.5)
    sc = [score(o) for o in fine]
    off = float(fine[int(np.argmin(sc))])
    tz = "" if hours == 0 else f" (the log's clock {hours:+d} h from UTC)"
    return off, hours, tz


def refine_busy_periods(steps: pd.DataFrame, off: float, sched: np.ndarray) -> tuple[np.ndarray, float]:
    """Step start times on the base clock: each busy period (steps back to back, as the log's
    placement puts them) moved later by 0..1000 ms (a line's second says only that the step ended
    within it) to put its prefill steps nearest the spans' scheduled times, periods kept in order
    without overlap. Returns (starts, median distance of prefill steps to their nearest scheduled
    time)."""
    t = steps["t_ms"].to_numpy(dtype=float) + off
    d = steps["dur_ms"].to_numpy(dtype=float)
    pre = steps["prefill_reqs"].to_numpy() > 0
    cut = np.flatnonzero(t[1:] > t[:-1] + d[:-1] + 1e-6) + 1
    bounds = np.concatenate([[0], cut, [len(t)]])
    out = t.copy()
    prev_end, prev_shift = -np.inf, 0.0
    grid = np.arange(0.0, 1000.0, 1.0)
    for a, b in zip(bounds[:-1], bounds[1:]):
        lo = max(0.0, prev_end - t[a])
        cand = grid[grid >= lo] if lo < 1000.0 else np.array([lo])
        p = t[a:b][pre[a:b]]
        if len(p) and len(sched):
            cost = np.array([np.minimum(_nearest(sched, p + c), 200.0).sum() for c in cand])
            shift = float(cand[int(np.argmin(cost))])
        else:
            shift = max(lo, prev_shift)
        out[a:b] = t[a:b] + shift
        prev_end, prev_shift = out[b - 1] + d[b - 1], shift
    dist = _nearest(sched, out[pre]) if pre.any() and len(sched) else np.array([np.nan])
    return out, float(np.median(dist))


def _nearest(xs: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """For each of ref, the distance to the nearest of xs (sorted)."""
    if len(xs) == 1:
        return np.abs(ref - xs[0])
    k = np.clip(np.searchsorted(xs, ref), 1, len(xs) - 1)
    return np.minimum(np.abs(ref - xs[k - 1]), np.abs(ref - xs[k]))


def _shift_table(df: pd.DataFrame, off: float) -> tuple[pd.DataFrame, int]:
    if not len(df):
        return df, 0
    t = df["t_ms"].to_numpy(dtype=float) + off
    keep = t >= 0
    out = df[keep].copy()
    out["t_ms"] = t[keep]
    return out.reset_index(drop=True), int((~keep).sum())


def merge(parts: list, names: list[str]) -> tuple[Trace, list[dict]]:
    """One trace of a run from its parts (Trace or Imported, with meta.clock), and one report
    row per part: {file, role, clock, offset_ms, uncertainty_ms, how, matched, dropped}."""
    trs = [_trace(p) for p in parts]
    clocks = [_clock(t, n) for t, n in zip(trs, names)]
    with_req = [k for k, t in enumerate(trs) if len(t.requests)]
    clients = [k for k in with_req if not _is_spans(trs[k])]
    spans_k = [k for k in with_req if _is_spans(trs[k])]
    b = clients[0] if clients else spans_k[0] if spans_k else 0
    base, base_c = trs[b], clocks[b]
    if base_c["kind"] == "wall-clock":
        raise TraceError(f"{names[b]}: an iteration log alone has no requests to merge onto; give a client's file "
                         "or the spans too")
    out = Trace(meta=dict(base.meta), requests=base.requests.copy(), tokens=base.tokens, finishes=base.finishes,
                steps=base.steps, batch=base.batch, kv=base.kv, kv_events=base.kv_events, preempts=base.preempts,
                other=list(base.other), request_extra=[dict(e) for e in base.request_extra], extra=dict(base.extra))
    report = [{"file": names[b], "role": "base (its clock is the trace's)", "clock": base_c["kind"], "offset_ms": 0.0,
               "uncertainty_ms": float(base_c.get("resolution_ms") or 0), "how": base_c.get("how", ""),
               "matched": None, "dropped": 0}]
    offsets = {b: 0.0}
    # the base's origin on the epoch clock: its own, or found through the first aligned epoch file
    epoch0 = (base_c["t0_s"], float(base_c.get("resolution_ms") or 0)) if base_c["kind"] == "epoch" else None
    # spans first (the log aligns to them), then everything else
    order = [k for k in spans_k if k != b] + [k for k in range(len(trs)) if k != b and k not in spans_k]
    for k in order:
        tr, c = trs[k], clocks[k]
        row = {"file": names[k], "clock": c["kind"], "matched": None, "dropped": 0}
        if k in spans_k:
            pairs = pair_requests(base, tr)
            if c["kind"] == "epoch" and base_c["kind"] == "epoch":
                off, unc, how = _offset_epoch(base_c, c)
            else:
                off, unc, how = _offset_by_pairs(base, tr, pairs)
            attach_spans(out, tr, pairs, off)
            row.update(role="engine spans -> engine_* per request", matched=f"{len(pairs)} of {len(base.ids)}")
            if epoch0 is None and c["kind"] == "epoch":
                epoch0 = (c["t0_s"] - off / 1000.0, unc)
        elif c["kind"] == "wall-clock":
            ref = next((kk for kk in spans_k if kk in offsets), None)
            if ref is None:
                raise TraceError(f"{names[k]}: aligning an iteration log needs the run's spans (its requests' "
                                 "scheduled times) among the files")
            if len(out.steps):
                raise TraceError(f"{names[k]}: the base already has step events ({names[b]})")
            off, hours, tz = _offset_log(tr, trs[ref], offsets[ref], epoch0[0])
            starts, unc = refine_busy_periods(tr.steps, off, _scheduled(trs[ref], offsets[ref]))
            steps = tr.steps.copy()
            steps["t_ms"] = starts
            out.steps, row["dropped"] = _shift_table(steps, 0.0)
            engine = tr.meta.get("engine") or {}
            if "policy" in engine:      # the log's own scheduler options, for re-simulating the run
                out.meta["engine"] = {**(out.meta.get("engine") or {}), **engine}
            how = (f"the log's 1 s timestamps{tz}; each busy period then moved within its second to put its prefill "
                   f"steps at the spans' scheduled times (arrival + time in queue): median distance {unc:.2f} ms")
            row["role"] = "engine steps (iteration log)"
        else:
            if c["kind"] != "epoch" or epoch0 is None:
                raise TraceError(f"{names[k]}: a {c['kind']} clock cannot be aligned with the base's "
                                 f"{base_c['kind']} clock by itself; add the run's spans")
            off, unc, how = _offset_epoch({"t0_s": epoch0[0], "resolution_ms": epoch0[1]}, c)
            if base_c["kind"] != "epoch":
                how += " (the base's origin on the epoch clock from the spans)"
            row["role"] = "KV events / gauges / steps"
            kv, d1 = _shift_table(tr.kv_events, off)
            if len(kv):
                out.kv_events = frame(KV_EVENT, {f.name: kv[f.name] for f in KV_EVENT.columns})
            if len(kv) and len(base.kv_events):
                raise TraceError(f"{names[k]}: the base already has KV events")
            g = [{**e, "t_ms": e["t_ms"] + off} for e in tr.other if e.get("type") == "gauge"]
            out.other += [e for e in g if e["t_ms"] >= 0]
            row["dropped"] = d1 + sum(e["t_ms"] < 0 for e in g)
            if len(tr.steps) and not len(out.steps):
                out.steps, d2 = _shift_table(tr.steps, off)
                row["dropped"] += d2
        offsets[k] = off
        row.update(offset_ms=off, uncertainty_ms=unc, how=how)
        report.append(row)
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


def attach_spans(out: Trace, spans: Trace, pairs, off: float):
    """Each paired client request gets the engine's view of it: arrival at the engine, its TTFT
    and E2E from the engine's arrival, and the phases, on the base's clock."""
    tk = spans.tokens
    first = tk.groupby("req")["t_ms"].min() if len(tk) else pd.Series(dtype=float)
    last = tk.groupby("req")["t_ms"].max() if len(tk) else pd.Series(dtype=float)
    arr = spans.requests["arrival_ms"].to_numpy()
    for i, j in pairs:
        ex = spans.request_extra[j] if j < len(spans.request_extra) else {}
        view = {"engine_request_id": spans.ids[j], "engine_arrival_ms": float(arr[j] + off)}
        if j in first.index:
            view["engine_ttft_ms"] = float(first[j] - arr[j])
            view["engine_e2e_ms"] = float(last[j] - arr[j])
        view.update({k: ex[k] for k in PHASE_KEYS if k in ex})
        out.request_extra[i].update(view)
