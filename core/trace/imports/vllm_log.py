"""vLLM's server log with `--enable-logging-iteration-details`: one line per engine step that
did work,

    (EngineCore pid=7) INFO 12-01 20:06:51 [core.py:427] Engine 000: Iteration(118): 1 context requests,
    128 context tokens, 3 generation requests, 3 generation tokens, iteration elapsed time: 21.07 ms,
    CPU KV cache usage: 1.2%

becomes one `step` event (its counts in prefill_reqs / prefill_tokens / decode_reqs /
decode_tokens, its logged duration in dur_ms) and one `gauge` event (the KV-cache usage at the
step's end). The log has no request ids, so there are no requests and no batch entries.

Time. A line's timestamp has no year and one-second resolution, and is written when the step
has ended. Steps are placed as early as their timestamps allow, back to back: a step ends at
max(the previous step's end + its own duration, the start of its logged second). Durations are
exact (the logged ones); start times are within the logged second's resolution (up to 1 s off
in absolute time, and gaps shorter than a second between busy periods are not seen).
"""
from __future__ import annotations

import re
from datetime import UTC, datetime

import numpy as np
import pandas as pd

from core.errors import TraceError
from core.trace.imports.imported import Imported
from core.trace.model import Trace, frame
from core.trace.schema import REQUEST, STEP

# A step's line, read in two bounded pieces (never one pattern with an unbounded gap: on a long hostile
# line that costs quadratic time): the step's counts, matched at an "Iteration(" within WINDOW characters,
# and the log's timestamp (no year, the server's time zone), the first within WINDOW characters before it.
STEP_COUNTS = re.compile(
    r"Iteration\((?P<it>\d{1,18})\): (?P<creq>\d{1,18}) context requests?, (?P<ctok>\d{1,18}) context tokens?, "
    r"(?P<greq>\d{1,18}) generation requests?, (?P<gtok>\d{1,18}) generation tokens?, "
    r"iteration elapsed time: (?P<ms>[0-9.]{1,32}(?:[eE][-+]?\d{1,4})?) ms"
    r"(?:[^\n]{0,200}?KV cache usage: (?P<kv>[0-9.]{1,32})%)?")
STAMP = re.compile(r"(?P<mon>\d\d)-(?P<day>\d\d) (?P<h>\d\d):(?P<m>\d\d):(?P<s>\d\d)(?:[.,](?P<frac>\d{1,9}))?\b")
ENGINE = re.compile(r"Engine (?P<engine>\d{1,9}): \Z")      # right before "Iteration(", when vLLM names it
WINDOW = 512
MARK = "Iteration("
# vLLM's startup line `non-default args: {...}` (a Python repr, never evaluated: only these
# plain values are read) -> our scheduler options
ARGS = {"max_num_seqs": ("max_seqs", int), "max_num_batched_tokens": ("token_budget", int),
        "block_size": ("block_size", int), "num_gpu_blocks_override": ("kv_blocks", int),
        "enable_prefix_caching": ("prefix_caching", lambda v: v == "True"), "max_model_len": ("max_model_len", int)}
ARG = re.compile(r"'(" + "|".join(ARGS) + r")': (\d+|True|False)\b")
CACHE_TOKENS = re.compile(r"KV cache size: ([\d,]+) tokens")
MAX_LINES = 20_000_000


# vLLM's logger: "(EngineCore pid=7) INFO 12-01 20:06:51 [core.py:427] ..." (the process prefix optional)
LOGGER_LINE = re.compile(r"^(?:\([\w ]+pid=\d+\) )?(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d "
                         r"\d\d:\d\d:\d\d(?:\.\d+)? \[[\w./-]+\.py:\d+\]", re.M)


def looks_like_vllm_log(text: str) -> bool:
    """A log written by vLLM's logger (with or without iteration lines)."""
    return bool(LOGGER_LINE.search(text[: 1 << 20]))


def step_line(ln: str) -> dict | None:
    """One iteration line's fields (mon, day, h, m, s, frac, engine, it, creq, ctok, greq, gtok, ms,
    kv), or None. Each pattern sees at most WINDOW characters, so a line costs time linear in its
    length whatever it holds."""
    pos = ln.find(MARK)
    while pos >= 0:
        g = STEP_COUNTS.match(ln, pos, pos + WINDOW)
        ts = STAMP.search(ln, max(0, pos - WINDOW), pos) if g else None
        if ts:
            eng = ENGINE.search(ln, max(0, pos - 20), pos)
            return {**ts.groupdict(), "engine": eng and eng["engine"], **g.groupdict()}
        pos = ln.find(MARK, pos + 1)
    return None


def looks_like_iteration_log(text: str) -> bool:
    return MARK in text and any(step_line(ln) for ln in text.splitlines() if MARK in ln)


def _second(mon: str, day: str, h: str, m: str, s: str) -> float:
    """Seconds since 2000-01-01 of a log timestamp (the log has no year; 2000 is a leap year, so
    every month-day parses)."""
    return (datetime(2000, int(mon), int(day), int(h), int(m), int(s)) - datetime(2000, 1, 1)).total_seconds()


def engine_options(text: str) -> dict:
    """The scheduler options the log's startup lines state (vLLM's non-default args and its KV
    cache size), as our SchedulerConfig fields; {"name": "vllm"} alone when the log starts later."""
    out: dict = {"name": "vllm"}
    # the line that states them, wherever it is (a log cut into runs may hold it anywhere, or not at all)
    at, line = text.find("non-default args:"), ""
    if at >= 0:
        end = text.find("\n", at)
        line = text[text.rfind("\n", 0, at) + 1: end if end >= 0 else len(text)]
    for key, value in ARG.findall(line):
        field, conv = ARGS[key]
        out[field] = conv(value)
    if "kv_blocks" not in out and "block_size" in out:
        m = CACHE_TOKENS.search(text)
        if m:
            out["kv_blocks"] = int(m.group(1).replace(",", "")) // out["block_size"]
    if len(out) > 1:
        out["policy"] = "vllm-v1"
        out["kv_manager"] = "vllm-v1"
        out["options_from"] = "the log's startup lines (non-default args, KV cache size); vLLM's defaults for the rest"
    return out


def _step_lines(text: str, name: str) -> tuple[list[dict], int]:
    """(each iteration line's fields, how many lines mention Iteration( but do not parse)."""
    rows, bad = [], 0
    for ln in text.splitlines():
        if MARK not in ln:
            continue
        g = step_line(ln)
        if g is None:
            bad += 1
            continue
        rows.append(g)
        if len(rows) > MAX_LINES:
            raise TraceError(f"{name}: more than {MAX_LINES:,} iteration lines")
    if not rows:
        raise TraceError(f"{name}: no 'Iteration(i): ... iteration elapsed time: X ms' lines (vLLM writes them "
                         "with --enable-logging-iteration-details)")
    return rows, bad


def _logged_seconds(df: pd.DataFrame) -> tuple[np.ndarray, float]:
    """(each line's timestamp in seconds since 2000-01-01, years counted on at new year's eve; its resolution, s)."""
    frac = df["frac"].fillna("").map(lambda f: float("0." + f) if f else 0.0).to_numpy()
    sec = np.array([_second(*r) for r in df[["mon", "day", "h", "m", "s"]].itertuples(index=False)]) + frac
    year = 366 * 86400.0
    sec = sec + year * np.concatenate([[0], np.cumsum(np.diff(sec) < -300 * 86400)])  # past new year's eve
    return sec, 1.0 if not frac.any() else 0.001


def _back_to_back(dur: np.ndarray, sec_ms: np.ndarray, resolution: float) -> tuple[np.ndarray, int]:
    """(each step's earliest feasible end: back to back, not before its logged second; how many end
    past their logged second)."""
    end = np.empty(len(dur))
    late, prev = 0, -np.inf
    for i in range(len(dur)):
        e = max(prev + dur[i], sec_ms[i])
        if e > sec_ms[i] + resolution * 1000.0:
            late += 1
        end[i] = prev = e
    return end, late


def _wall_clock(first: pd.Series, t0: float, resolution: float) -> dict:
    day0 = _second(first["mon"], first["day"], "00", "00", "00")
    return {"kind": "wall-clock", "t0_s": t0, "resolution_ms": resolution * 1000.0,
            "t0": f"{first['mon']}-{first['day']} (no year) {first['h']}:{first['m']}:{first['s']}",
            "month": int(first["mon"]), "day": int(first["day"]), "seconds_of_day": t0 - day0,
            "how": "t0_s is seconds since 2000-01-01 00:00 (the log has no year; month, day and seconds_of_day "
                   "say when in the year, in the server's time zone); each step's end is the later of its "
                   "logged second and the previous step's end plus its duration"}


def import_iteration_log(text: str, name: str) -> Imported:
    rows, bad = _step_lines(text, name)
    engines = sorted({r["engine"] or "000" for r in rows})
    notes = []
    if len(engines) > 1:
        notes.append(f"{len(engines)} engines log iterations ({', '.join(engines)}); only engine {engines[0]}'s "
                     "steps are kept (one step sequence per trace).")
        rows = [r for r in rows if (r["engine"] or "000") == engines[0]]
    df = pd.DataFrame(rows)
    dur = df["ms"].astype(float).to_numpy()
    sec, resolution = _logged_seconds(df)
    base = float(sec[0])
    sec_ms = (sec - base) * 1000.0        # in ms from the first line's timestamp (exact integers for whole seconds)
    end, late = _back_to_back(dur, sec_ms, resolution)
    start = end - dur
    t0_ms = float(start.min())
    t0 = base + t0_ms / 1000.0
    it = df["it"].astype(np.int64).to_numpy()
    step_no = it if np.all(np.diff(it) > 0) else np.arange(len(it))
    if step_no is not it:
        notes.append("Iteration numbers do not increase along the log (a restart?); steps are numbered in log "
                     "order.")
    steps = frame(STEP, {"t_ms": start - t0_ms, "step": step_no, "dur_ms": dur,
                         "prefill_reqs": df["creq"].astype(np.int64), "prefill_tokens": df["ctok"].astype(np.int64),
                         "decode_reqs": df["greq"].astype(np.int64), "decode_tokens": df["gtok"].astype(np.int64)})
    gauges = [{"t_ms": float(e - t0_ms), "type": "gauge", "kv_usage": float(k) / 100.0}
              for e, k in zip(end, df["kv"]) if isinstance(k, str)]
    notes.append(f"{len(steps):,} steps from the log's Iteration lines: durations as logged (iteration elapsed "
                 f"time); start times placed back to back within each line's {resolution:g} s timestamp "
                 "(absolute times within that resolution).")
    if late:
        notes.append(f"{late} step(s) could not end within their logged second when placed back to back (their "
                     "logged durations overlap); they are kept after the previous step.")
    if bad:
        notes.append(f"{bad} line(s) mention Iteration( but do not parse; they were skipped.")
    clock = _wall_clock(df.iloc[int(np.argmin(start))], t0, resolution)
    meta = {"source": "imported", "label": f"{name} (vLLM iteration log)", "created": "unknown",
            "engine": engine_options(text), "device": "not recorded in the log", "clock": clock,
            "provenance": {"steps": "engine: vLLM's iteration log (--enable-logging-iteration-details)",
                           "dur_ms": "engine: 'iteration elapsed time' of each logged step",
                           "kv_usage": "engine: 'KV cache usage' at the step's log line",
                           "t_ms": f"engine log timestamps, {resolution:g} s resolution (see clock)"},
            "notes": " ".join(notes)}
    tr = Trace(meta=meta, requests=frame(REQUEST, {f.name: [] for f in REQUEST.columns}), steps=steps,
               other=gauges)
    summary = {"steps": len(steps), "prefill_tokens": int(steps["prefill_tokens"].sum()),
               "decode_tokens": int(steps["decode_tokens"].sum()), "busy_ms": float(dur.sum()),
               "engines": engines}
    return Imported(tr, "vllm", summary, notes=notes, tool="vLLM", what="iteration log", origin=meta["provenance"])


# ---- putting the log on a merged run's clock (core.trace.imports.merge) ---------------------------

ZONES_MIN = np.arange(-12 * 60, 14 * 60 + 1, 15)    # every UTC offset in use (India +05:30, Nepal +05:45, ...)
COARSE_REQUESTS = 2000

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


def zone_name(minutes: int) -> str:
    return f"UTC{'-' if minutes < 0 else '+'}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}"


def _offset_log(log: Trace, ref: Trace, ref_offset: float, base_epoch: float) -> tuple[float, int, str]:
    """The iteration log's offset to the base clock from its calendar time, in the time zone (every
    real UTC offset, ZONES_MIN) that best fits the spans' scheduled times: (offset ms, the zone in
    minutes east of UTC, a note on the zone and the next best one)."""
    sched = _scheduled(ref, ref_offset)
    pre = np.sort(log.steps[log.steps["prefill_reqs"] > 0]["t_ms"].to_numpy())
    if not len(sched) or not len(pre):
        raise TraceError("the log has no prefill steps or the spans no requests to align by")
    if not {"month", "day", "seconds_of_day"} <= log.meta["clock"].keys():
        raise TraceError("the log's clock has no calendar date (meta.clock month, day, seconds_of_day)")
    cal = (_log_calendar_epoch(log.meta["clock"], base_epoch) - base_epoch) * 1000.0
    # a candidate offset's score: the median distance from each request's first scheduled time to the
    # nearest prefill step; the zone search scores at most COARSE_REQUESTS of them, evenly spread (a
    # median is robust to the thinning; the fine search below uses every request)
    few = sched[np.unique(np.linspace(0, len(sched) - 1, min(len(sched), COARSE_REQUESTS)).astype(np.int64))]
    grid = np.arange(-1500.0, 1500.0 + 1e-9, 20.0)        # within the log's 1 s resolution, and some
    by_zone = []
    for zone in ZONES_MIN:
        offs = cal - zone * 60_000.0 + grid
        sc = np.median(_nearest(pre, (few[None, :] - offs[:, None]).ravel()).reshape(len(offs), -1), axis=1)
        k = int(np.argmin(sc))
        by_zone.append((float(sc[k]), float(offs[k]), int(zone)))
    by_zone.sort()
    _, coarse, zone = by_zone[0]
    fine = np.arange(coarse - 25.0, coarse + 25.0 + 1e-9, 0.5)
    sc = [float(np.median(_nearest(pre + o, sched))) for o in fine]
    off = float(fine[int(np.argmin(sc))])
    second = by_zone[1]
    tz = (f" (the log's clock in {zone_name(zone)}, the best of every UTC offset on a 15-minute grid; the next "
          f"best, {zone_name(second[2])}, puts the steps a median {second[0]:.0f} ms from the spans)")
    return off, zone, tz


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
            shift = float(cand[int(np.argmin(_shift_costs(sched, p, cand)))])
        else:
            shift = max(lo, prev_shift)
        out[a:b] = t[a:b] + shift
        prev_end, prev_shift = out[b - 1] + d[b - 1], shift
    dist = _nearest(sched, out[pre]) if pre.any() and len(sched) else np.array([np.nan])
    return out, float(np.median(dist))


SHIFT_BLOCK = 1 << 21      # (candidate shift, prefill step) pairs priced at once: bounded memory


def _shift_costs(sched: np.ndarray, p: np.ndarray, cand: np.ndarray) -> np.ndarray:
    """For each candidate shift c: sum over the period's prefill steps p of min(distance from p + c
    to the nearest scheduled time, 200 ms). Vectorised over the candidates in blocks (a loop over
    1,000 candidates per busy period made a 2,000-period log take 16 s to merge)."""
    out = np.empty(len(cand))
    rows = max(1, SHIFT_BLOCK // len(p))
    for i in range(0, len(cand), rows):
        c = cand[i:i + rows]
        out[i:i + len(c)] = np.minimum(_nearest(sched, p[None, :] + c[:, None]), 200.0).sum(axis=1)
    return out


def _nearest(xs: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """For each of ref, the distance to the nearest of xs (sorted)."""
    if len(xs) == 1:
        return np.abs(ref - xs[0])
    k = np.clip(np.searchsorted(xs, ref), 1, len(xs) - 1)
    return np.minimum(np.abs(ref - xs[k - 1]), np.abs(ref - xs[k]))


def align_steps(log: Trace, spans: Trace, spans_offset: float, base_epoch: float):
    """The log's steps on a merged run's clock, by the spans' first scheduled times: (steps with
    their t_ms moved, the log's KV-usage gauges moved with their steps, offset ms, uncertainty ms,
    how)."""
    off, _, tz = _offset_log(log, spans, spans_offset, base_epoch)
    starts, unc = refine_busy_periods(log.steps, off, _scheduled(spans, spans_offset))
    steps = log.steps.copy()
    steps["t_ms"] = starts
    # a gauge was read at its step's end: it moves as its step did
    t = log.steps["t_ms"].to_numpy(dtype=float)
    ends = t + log.steps["dur_ms"].to_numpy(dtype=float)
    moved = starts - t
    gauges = []
    for e in log.other:
        if e.get("type") == "gauge" and len(ends):
            k = min(int(np.searchsorted(ends, e["t_ms"] - 1e-6)), len(ends) - 1)
            gauges.append({**e, "t_ms": e["t_ms"] + moved[k]})
    how = (f"the log's 1 s timestamps{tz}; each busy period then moved within its second to put its prefill "
           f"steps at the spans' scheduled times (arrival + time in queue): median distance {unc:.2f} ms")
    return steps, gauges, off, unc, how
