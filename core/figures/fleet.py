"""The fleet (core.fleet) drawn: requests as lanes grouped by replica (a heatmap of replicas over
time past MAX_LANES lanes), each replica's running / waiting / KV blocks on one time axis, its
prefix-cache hits, the routing policies side by side, and two experiments (router staleness; the
split of a fixed number of replicas into prefill and decode ones). Figures take data in: the
routing read back is core.analysis.routing's, the experiments' runs core.experiments.fleet's."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from core.analysis.fleet import prefix_cache
from core.analysis.metrics import InMemory, request_metrics, request_spans
from core.analysis.routing import drains_of, replica_roles, request_replicas, transfer_table
from core.figures import BLUE, GRAY, ORANGE, PALETTE, PURPLE, SKY, VERMILLION, base_layout
from core.figures.timeline import DECODE_COLOR, MAX_HEIGHT, MAX_LANES, PREFILL_COLOR, QUEUE_COLOR, TIME_BINS
from core.fleet.router import POLICIES

# 16 replicas at most on the page: Okabe-Ito first, then six more that stay apart from them
REPLICA_COLORS = PALETTE + ["#1B9E77", "#7570B3", "#E7298A", "#66A61E", "#A6761D", "#1F78B4"]
TRANSFER_COLOR = PURPLE
WHOLE_PD_COLOR = "#009E73"       # a short prompt run whole on a decode replica (pd_min_prompt)
MIN_BAR_FRACTION = 120           # a lane's bar is drawn at least 1/120 of the time axis wide (~6 px)
MAX_SIGNAL_POINTS = 1500         # per replica and signal: more steps are drawn as the peak of each bin


def color_of(replica: int) -> str:
    return REPLICA_COLORS[replica % len(REPLICA_COLORS)]


# ---- figures -----------------------------------------------------------------------------------------

def _route_text(trace, routes: pd.DataFrame, m: pd.DataFrame | None = None) -> list[str]:
    """Hover text per request: the router's choice and its reason, scores, and what it saw."""
    ids = trace.requests["id"].tolist()
    ttft = m["ttft_ms"].to_numpy(dtype=float) if m is not None else np.full(len(ids), np.nan)
    out = []
    for k, (rid, rep, dec, stage, reason, dreason, scores, sig) in enumerate(zip(
            ids, routes["replica"], routes["decode"], routes["stage"], routes["reason"], routes["decode_reason"],
            routes["scores"], routes["signals"])):
        head = f"<b>{rid}</b> → " + ("rejected at the router" if stage == "rejected" else f"replica {rep}"
                                     + (f" (prefill), decode on replica {dec}" if dec >= 0 else ""))
        lines = [head]
        if reason:
            lines.append(f"why: {reason}" + (f"; decode: {dreason}" if dreason else ""))
        if scores:
            lines.append("scores: " + ", ".join(f"r{r} {v:g}" for r, v in scores.items()))
        if sig:
            lines.append("router saw: " + "; ".join(
                f"r{r} {s.get('requests', 0)} req, KV {100 * float(s.get('kv_usage', 0)):.0f}%"
                + (f", prefix {s['prefix_blocks']} blk" if s.get("prefix_blocks") else "")
                for r, s in sig.items()))
        if not math.isnan(ttft[k]):
            lines.append(f"TTFT {ttft[k]:.3f} ms")
        out.append("<br>".join(lines))
    return out


def lane_table(trace, routes: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per lane, lanes grouped by replica (replica order, then arrival): req (row), replica,
    kind (whole, prefill, decode), start_ms (arrival; a decode lane: its transfer's start),
    queue_end_ms (first scheduled step; NaN: none), end_ms (a prefill lane: its transfer's start; else
    the last token), xfer_ms (a decode lane: the transfer's duration)."""
    routes = request_replicas(trace) if routes is None else routes
    sp = request_spans(trace)
    arrival, sched, last = sp["arrival"], sp["scheduled"], sp["last"]
    queue_end = np.where(np.isnan(sched), sp["first"], sched)
    xf = transfer_table(trace)
    x_start = np.full(len(arrival), np.nan)
    x_dur = np.full(len(arrival), np.nan)
    if len(xf):
        ok = xf["req"].to_numpy() >= 0
        x_start[xf["req"].to_numpy()[ok]] = xf["start_ms"].to_numpy()[ok]
        x_dur[xf["req"].to_numpy()[ok]] = xf["dur_ms"].to_numpy()[ok]
    rows = []
    rep, dec, stage = routes["replica"].to_numpy(), routes["decode"].to_numpy(), routes["stage"].to_numpy()
    for i in range(len(arrival)):
        if stage[i] == "rejected" or rep[i] < 0:
            continue
        if dec[i] >= 0:
            pre_end = x_start[i] if not np.isnan(x_start[i]) else last[i]
            rows.append((i, rep[i], "prefill", arrival[i], queue_end[i], pre_end, np.nan))
            rows.append((i, dec[i], "decode", x_start[i], np.nan, last[i], x_dur[i]))
        else:
            rows.append((i, rep[i], "whole", arrival[i], queue_end[i], last[i], np.nan))
    lanes = pd.DataFrame(rows, columns=["req", "replica", "kind", "start_ms", "queue_end_ms", "end_ms", "xfer_ms"])
    lanes["arrival_ms"] = arrival[lanes["req"].to_numpy()] if len(lanes) else []
    return lanes.sort_values(["replica", "arrival_ms"], kind="stable").reset_index(drop=True)


def _group_axis(fig, lanes: pd.DataFrame, roles: list[str], row: int | None = None):
    """y ticks at each replica's group of lanes, a line between groups."""
    ticks, labels = [], []
    reps = lanes["replica"].to_numpy()
    for r in np.unique(reps).tolist():
        where = np.flatnonzero(reps == r)
        ticks.append(float(where.mean()))
        role = roles[r] if r < len(roles) else "both"
        labels.append(f"r{r}" + ("" if role == "both" else f" {role}"))
        if where[0] > 0:
            fig.add_hline(y=where[0] - 0.5, line_color=GRAY, line_width=1, opacity=0.6)
    fig.update_yaxes(tickvals=ticks, ticktext=labels, autorange="reversed", title_text="requests by replica",
                     zeroline=False, showgrid=False)


def _drain_marks(fig, drains, lanes: pd.DataFrame | None = None, x_max: float = 0.0, **where):
    """A vertical line at each drain's time; over the drained replica's lanes, a band from then on."""
    for r, t in drains:
        fig.add_vline(x=t, line_color=VERMILLION, line_width=2, line_dash="dash", **where,
                      annotation_text=f"replica {r} drained at {t:g} ms", annotation_position="top left")
        rows = np.flatnonzero(lanes["replica"].to_numpy() == r) if lanes is not None else []
        if len(rows) and x_max > t:
            fig.add_shape(type="rect", x0=t, x1=x_max, y0=rows[0] - 0.5, y1=rows[-1] + 0.5, line_width=0,
                          fillcolor=VERMILLION, opacity=0.08, layer="below")


def fleet_lanes(trace, drains=None, max_lanes: int = MAX_LANES,
                max_height: int = MAX_HEIGHT) -> go.Figure:
    """Requests as lanes grouped by replica, on one time axis. Whole replicas: the queue wait
    (gray), then the request's service on its replica in that replica's colour. Disaggregated: a
    prefill lane on the prefill replica (queue, prefill) and a decode lane on the decode replica
    (the KV transfer, then decode to the last token). A triangle marks when the router sent the
    request there; the hover says why (its reason, scores and what it saw of each replica).
    `drains` [(replica, ms)] (default: the trace's, drains_of): a line at each time. Past `max_lanes`
    requests: `replica_heatmap`."""
    drains = drains_of(trace) if drains is None else drains
    if len(trace.requests) > max_lanes:
        return replica_heatmap(trace, drains)
    routes = request_replicas(trace)
    lanes = lane_table(trace, routes)
    roles = replica_roles(trace)
    pd_mode = bool((lanes["kind"] != "whole").any())
    text = np.asarray(_route_text(trace, routes, request_metrics(trace)), dtype=object)
    ids = np.asarray(trace.requests["id"].tolist(), dtype=object)
    y = np.arange(len(lanes), dtype=float)
    req, rep = lanes["req"].to_numpy(), lanes["replica"].to_numpy()
    fig = go.Figure()
    shown = lanes["kind"].to_numpy() != "decode"
    fig.add_trace(go.Bar(base=lanes["start_ms"][shown], x=(lanes["queue_end_ms"] - lanes["start_ms"])[shown],
                         y=y[shown], orientation="h", marker_color=QUEUE_COLOR, name="queue wait",
                         customdata=np.stack([ids[req[shown]], rep[shown]], -1) if shown.any() else None,
                         hovertemplate="%{customdata[0]} on r%{customdata[1]}: waiting %{x:.3f} ms from "
                                       "%{base:.3f} ms<extra></extra>"))
    service_start = np.where(np.isnan(lanes["queue_end_ms"]), lanes["start_ms"], lanes["queue_end_ms"])
    if pd_mode:
        segs = [("prefill", PREFILL_COLOR, lanes["kind"].to_numpy() == "prefill", service_start, lanes["end_ms"]),
                ("whole (short prompt)", WHOLE_PD_COLOR, lanes["kind"].to_numpy() == "whole", service_start,
                 lanes["end_ms"]),
                ("decode", DECODE_COLOR, lanes["kind"].to_numpy() == "decode", lanes["start_ms"] + lanes["xfer_ms"],
                 lanes["end_ms"]),
                # (over the decode lane's start: a transfer drawn wider than it lasted stays in sight)
                ("KV transfer", TRANSFER_COLOR, lanes["kind"].to_numpy() == "decode", lanes["start_ms"],
                 lanes["start_ms"] + lanes["xfer_ms"])]
    else:
        segs = [(f"replica {r}", color_of(r), rep == r, service_start, lanes["end_ms"])
                for r in np.unique(rep).tolist()]
    lo = float(np.nanmin(lanes["start_ms"])) if len(lanes) else 0.0
    min_w = (float(np.nanmax(lanes["end_ms"])) - lo) / MIN_BAR_FRACTION if len(lanes) else 0.0
    widened = False
    for name, color, m, a, b in segs:
        if not m.any():
            continue
        a, b = np.asarray(a, float)[m], np.asarray(b, float)[m]
        dur = b - a
        drawn = np.maximum(dur, min_w)       # the hover gives the true duration
        widened |= bool((drawn > dur).any())
        fig.add_trace(go.Bar(base=a, x=drawn, y=y[m], orientation="h", marker_color=color, name=name,
                             customdata=np.stack([ids[req[m]], rep[m], dur], -1), hovertext=text[req[m]],
                             hovertemplate=f"{name}: %{{customdata[2]:.3f}} ms from %{{base:.3f}} ms<br>"
                                           "%{hovertext}<extra></extra>"))
    routed = routes["routed_ms"].to_numpy()[req]
    fig.add_trace(go.Scatter(x=routed, y=y, mode="markers", name="routed here",
                             marker=dict(symbol="triangle-right", size=7, color="#777777"),
                             customdata=np.stack([ids[req], rep], -1), hovertext=text[req],
                             hovertemplate="routed at %{x:.3f} ms<br>%{hovertext}<extra></extra>"))
    per_row = max(2.0, min(22.0, (max_height - 160) / max(len(lanes), 1)))
    height = int(min(max_height, max(300, len(lanes) * per_row + 160)))
    fig.update_layout(barmode="overlay", bargap=0.3)
    _group_axis(fig, lanes, roles)
    fig.update_xaxes(title_text="time (ms)")
    x_max = float(np.nanmax(lanes["end_ms"])) if len(lanes) else 0.0
    _drain_marks(fig, drains, lanes, x_max)
    n_rep, used = len(roles), len(np.unique(rep))
    title = (f"Requests by replica: {len(trace.requests):,} requests on {n_rep} replica{'s' if n_rep != 1 else ''}"
             + (f" ({used} used)" if used < n_rep else "")
             + (" (prefill lane, KV transfer, decode lane)" if pd_mode else "")
             + (f"; bars under {min_w:.3g} ms drawn that wide (hover: the true time)" if widened else ""))
    return base_layout(fig, title, height=height)


def _running_average(t: np.ndarray, dur: np.ndarray, v: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Time-average over each bin [edges[k], edges[k+1]) of a value held during each step
    [t, t + dur) and 0 between steps (steps of one replica never overlap)."""
    if not len(t):
        return np.zeros(len(edges) - 1)
    xs = np.empty(2 * len(t))
    xs[0::2], xs[1::2] = t, t + dur
    area = np.zeros(2 * len(t))
    area[1::2] = v * dur
    cum = np.cumsum(area)
    at = np.interp(edges, xs, cum, left=0.0, right=cum[-1])
    width = np.diff(edges)
    return np.diff(at) / np.where(width > 0, width, 1.0)


def replica_heatmap(trace, drains=None, bins: int = TIME_BINS) -> go.Figure:
    """Many requests on one screen: replicas x time bins, the colour the replica's running requests
    (time-averaged over the bin, from its steps); the hover adds its waiting ones and the requests
    the router sent it in the bin."""
    roles = replica_roles(trace)
    n = max(len(roles), 1)
    st = trace.steps
    routes = request_replicas(trace)
    arrival = trace.requests["arrival_ms"].to_numpy(dtype=float)
    lo = float(arrival.min()) if len(arrival) else 0.0
    ends = [float((st["t_ms"] + st["dur_ms"]).max()) if len(st) else lo]
    if len(trace.tokens):
        ends.append(float(trace.tokens["t_ms"].max()))
    hi = max(max(ends), lo + 1.0)
    edges = np.linspace(lo, hi, bins + 1)
    centers = (edges[:-1] + edges[1:]) / 2
    running = np.zeros((n, bins))
    waiting = np.zeros((n, bins))
    rep_col = st["replica"].to_numpy() if "replica" in st else np.zeros(len(st), np.int64)
    for r in range(n):
        s = st[rep_col == r]
        t, dur = s["t_ms"].to_numpy(dtype=float), s["dur_ms"].to_numpy(dtype=float)
        running[r] = _running_average(t, dur, np.maximum(s["running"].to_numpy(dtype=float), 0), edges)
        waiting[r] = _running_average(t, dur, np.maximum(s["waiting"].to_numpy(dtype=float), 0), edges)
    routed = np.zeros((n, bins), np.int64)
    for col in ("replica", "decode"):
        r = routes[col].to_numpy()
        ok = (r >= 0) & (r < n)
        k = np.clip(np.searchsorted(edges, routes["routed_ms"].to_numpy()[ok], side="right") - 1, 0, bins - 1)
        np.add.at(routed, (r[ok], k), 1)
    labels = [f"r{r}" + ("" if roles[r] == "both" else f" {roles[r]}") for r in range(n)] if roles else ["r0"]
    fig = go.Figure(go.Heatmap(
        z=running, x=centers, y=labels, customdata=np.stack([waiting, routed], -1), colorscale="Blues", zmin=0,
        colorbar=dict(title="running"),
        hovertemplate="%{y} at %{x:.1f} ms: %{z:.2f} running, %{customdata[0]:.2f} waiting (bin averages); "
                      "%{customdata[1]} routed here in the bin<extra></extra>"))
    fig.update_yaxes(autorange="reversed", title_text="replica")
    fig.update_xaxes(title_text="time (ms)")
    _drain_marks(fig, drains_of(trace) if drains is None else drains)
    width = (hi - lo) / bins
    title = (f"Running requests per replica ({len(trace.requests):,} requests; time bins of "
             f"{f'{width:,.0f}' if width >= 100 else f'{width:.3g}'} ms)")
    return base_layout(fig, title, height=min(MAX_HEIGHT, 220 + 28 * n))


SIGNALS = (("running", "running"), ("waiting", "waiting"), ("kv_used_blocks", "KV blocks used"))


def _signal_points(t: np.ndarray, end: np.ndarray, v: np.ndarray, max_points: int):
    """A replica's signal as a step line: its value at each step's start, broken (None) where it sat
    idle between steps; past `max_points` steps, the peak of each of max_points time bins."""
    if len(t) > max_points:
        edges = np.linspace(t[0], end[-1], max_points + 1)
        k = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, max_points - 1)
        peak = np.full(max_points, -np.inf)
        np.maximum.at(peak, k, v)
        x, yv = edges[:-1], np.where(np.isfinite(peak), peak, np.nan)
        return x.tolist(), [None if np.isnan(a) else float(a) for a in yv]
    idle = np.r_[t[1:] > end[:-1] + 1e-9, True]
    xs, ys = [], []
    for a, b, val, gap in zip(t.tolist(), end.tolist(), v.tolist(), idle.tolist()):
        xs.append(a)
        ys.append(val)
        if gap:
            xs += [b, b]
            ys += [val, None]
    return xs, ys


def _gauge_samples(trace, r: int) -> dict[str, tuple[list, list]]:
    """Replica r's signals from its server's own gauge samples (core.trace.gauges: running, waiting,
    KV usage x its engine's KV blocks), for the signals its step records lack."""
    reps = (trace.meta.get("fleet") or {}).get("replicas") or []
    eng = (reps[r].get("engine") if r < len(reps) and isinstance(reps[r], dict) else None) or {}
    blocks = eng.get("kv_blocks") if isinstance(eng, dict) else None
    out: dict[str, tuple[list, list]] = {}
    for col, key, scale in (("running", "running", 1.0), ("waiting", "waiting", 1.0),
                            ("kv_used_blocks", "kv_usage", blocks)):
        if not isinstance(scale, (int, float)):
            continue
        pts = [(e["t_ms"], e[key] * scale) for e in trace.other if e.get("type") == "gauge"
               and e.get("replica", 0) == r and isinstance(e.get(key), (int, float))]
        if pts:
            out[col] = ([p[0] for p in pts], [p[1] for p in pts])
    return out


def replica_signals(trace, drains=None, max_points: int = MAX_SIGNAL_POINTS) -> go.Figure:
    """Each replica's running and waiting requests and KV blocks in use, one subplot per signal on
    one shared time axis, a line per replica (from its step events; the line breaks where the
    replica sat idle; a signal its steps do not record, from its server's /metrics samples, dotted)."""
    roles = replica_roles(trace)
    st = trace.steps
    fig = make_subplots(rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.06,
                        subplot_titles=[name for _, name in SIGNALS])
    rep_col = st["replica"].to_numpy() if "replica" in st else np.zeros(len(st), np.int64)
    for r in range(max(len(roles), 1)):
        s = st[rep_col == r]
        if not len(s):
            continue
        t = s["t_ms"].to_numpy(dtype=float)
        end = t + s["dur_ms"].to_numpy(dtype=float)
        name = f"r{r}" + ("" if roles[r] == "both" else f" {roles[r]}")
        sampled = None
        for k, (col, _) in enumerate(SIGNALS, start=1):
            v = s[col].to_numpy(dtype=float)
            if (v < 0).all():     # not in its step records (vLLM's iteration log): its /metrics samples
                sampled = _gauge_samples(trace, r) if sampled is None else sampled
                x, yv = sampled.get(col, ([], []))
                if x:
                    fig.add_trace(go.Scatter(x=x, y=yv, mode="lines+markers", line_shape="hv", marker=dict(size=3),
                                             line=dict(color=color_of(r), width=1.5, dash="dot"), name=name,
                                             legendgroup=name, showlegend=k == 1,
                                             hovertemplate=f"{name} %{{x:.1f}} ms: %{{y}} {SIGNALS[k - 1][1]} "
                                                           "(the server's own gauges, sampled)<extra></extra>"),
                                  row=k, col=1)
                continue
            x, yv = _signal_points(t, end, v, max_points)
            fig.add_trace(go.Scatter(x=x, y=yv, mode="lines", line_shape="hv", line=dict(color=color_of(r), width=1.5),
                                     name=name, legendgroup=name, showlegend=k == 1,
                                     hovertemplate=f"{name} %{{x:.1f}} ms: %{{y}} {SIGNALS[k - 1][1]}<extra></extra>"),
                          row=k, col=1)
    for _, t in (drains_of(trace) if drains is None else drains):
        fig.add_vline(x=t, line_color=VERMILLION, line_width=2, line_dash="dash")
    fig.update_xaxes(title_text="time (ms)", row=3, col=1)
    fig.update_yaxes(rangemode="nonnegative")     # (counts: an all-zero panel shows 0..1, not -1..1)
    most = int(np.bincount(rep_col).max()) if len(rep_col) else 0
    peak = f" (each bin's peak: over {max_points:,} steps a replica)" if most > max_points else ""
    return base_layout(fig, "Each replica over time: running, waiting, KV blocks used" + peak, height=560)


def _counted_hits_figure(rows: list[dict], labels: list[str]) -> go.Figure:
    """Prefix-cache hits per replica where no KV rows say which blocks hit (a vLLM fleet): the
    servers' own counters in tokens (core.analysis.fleet's prefix_hit_tokens), "unknown" where a
    replica's counters were not sampled, never 0."""
    n = len(rows)
    hits = [x["prefix_hit_tokens"] for x in rows]
    text = ["unknown" if h is None else f"{h:,} of {q:,}" if q else f"{h:,}"
            for h, q in zip(hits, (x["prefix_query_tokens"] for x in rows))]
    fig = go.Figure(go.Bar(x=labels, y=[h or 0 for h in hits], marker_color=[color_of(r) for r in range(n)],
                           text=text, textposition="auto", name="hit tokens",
                           hovertemplate="%{x}: %{text} prompt tokens hit the prefix cache (the server's own "
                                         "counters over the capture)<extra></extra>"))
    fig.update_yaxes(title_text="prefix-cache hit tokens", rangemode="nonnegative")
    return base_layout(fig, "Prefix-cache hits per replica (tokens, by each server's own counters)", height=320)


def replica_hits_figure(trace) -> go.Figure:
    """Prefix-cache hit blocks per replica as core.analysis.fleet defines them: on first admission
    (the replica's colour; the hover adds the full prompt blocks routed there and the hit rate) and,
    stacked above in gray, the hits of requests re-admitted after a preemption (not in the rate)."""
    roles = replica_roles(trace)
    n = len(roles)
    rows, _ = prefix_cache(InMemory(trace), trace.meta, list(range(n)))
    labels = [f"r{r}" + ("" if roles[r] == "both" else f" {roles[r]}") for r in range(n)]
    if all(x["prefix_hit_blocks_first"] is None for x in rows):
        return _counted_hits_figure(rows, labels)
    first = [x["prefix_hit_blocks_first"] for x in rows]
    again = [None if x["prefix_hit_blocks"] is None or f is None else x["prefix_hit_blocks"] - f
             for x, f in zip(rows, first)]
    blocks = ["—" if x["prompt_blocks"] is None else f"{x['prompt_blocks']:,}" for x in rows]
    rate = ["—" if x["prefix_hit_rate"] is None else f"{x['prefix_hit_rate']:.1%}" for x in rows]
    fig = go.Figure(go.Bar(x=labels, y=first, marker_color=[color_of(r) for r in range(n)], text=first,
                           textposition="inside", insidetextanchor="middle", name="on first admission",
                           customdata=np.stack([blocks, rate], -1),
                           hovertemplate="%{x}: %{y} hit blocks on first admission of %{customdata[0]} full prompt "
                                         "blocks routed here (hit rate %{customdata[1]})<extra></extra>"))
    if any(a for a in again):
        fig.add_trace(go.Bar(x=labels, y=again, marker=dict(color=GRAY, pattern_shape="/"), name="again after a "
                             "preemption (not in the hit rate)",
                             hovertemplate="%{x}: %{y} hit blocks of re-admitted requests<extra></extra>"))
    fig.update_layout(barmode="stack", uniformtext_minsize=10, uniformtext_mode="hide")
    fig.update_yaxes(title_text="prefix-cache hit blocks")
    return base_layout(fig, "Prefix-cache hits per replica", height=320)


def transfers_figure(trace) -> go.Figure:
    """Each KV transfer: its start and duration (markers sized by blocks, coloured by decode replica)."""
    xf = transfer_table(trace)
    fig = go.Figure()
    for dst in sorted(xf["dst"].unique().tolist()):
        x = xf[xf["dst"] == dst]
        size = 5 + 10 * np.sqrt(x["blocks"].to_numpy() / max(1, xf["blocks"].max()))
        fig.add_trace(go.Scatter(x=x["start_ms"], y=x["dur_ms"], mode="markers", name=f"to r{dst}",
                                 marker=dict(color=color_of(dst), size=size, opacity=0.7),
                                 customdata=np.stack([x["src"], x["blocks"], x["bytes"] / 1e6], -1),
                                 hovertemplate="r%{customdata[0]} → r" + str(dst) + " at %{x:.3f} ms: %{y:.3f} ms, "
                                               "%{customdata[1]} blocks, %{customdata[2]:.1f} MB<extra></extra>"))
    fig.update_xaxes(title_text="transfer start (ms)")
    fig.update_yaxes(title_text="duration (ms)")
    return base_layout(fig, f"KV transfers: {len(xf):,}, prefill to decode replicas", height=320)


POLICY_PANELS = (("TTFT (ms)", ("ttft_p50_ms", "p50"), ("ttft_p99_ms", "p99")), ("prefix hit rate", ("hit_rate", "")),
                 ("imbalance (max/mean)", ("imbalance", "")))


def policy_figure(rows: list[dict], highlight: str | None = None) -> go.Figure:
    """The policies side by side: TTFT p50 (sky) and p99 (blue), prefix hit rate, imbalance (one
    panel each); the `highlight`ed policy (the sidebar's) outlined in orange, its name in bold, in
    every panel: orange means the chosen policy and nothing else."""
    fig = make_subplots(rows=1, cols=3, subplot_titles=[p[0] for p in POLICY_PANELS], horizontal_spacing=0.08)
    names = [r["policy"] for r in rows]
    outline = dict(color=[ORANGE if n == highlight else "rgba(0,0,0,0)" for n in names], width=3)
    for c, (_, *series) in enumerate(POLICY_PANELS, start=1):
        for key, label in series:
            v = [r[key] for r in rows]
            color = {"p50": SKY, "p99": BLUE}.get(label, BLUE)
            fig.add_trace(go.Bar(x=names, y=v, name=f"TTFT {label}" if label else None, showlegend=bool(label),
                                 marker=dict(color=color, line=outline),
                                 hovertemplate="%{x}: %{y:.4g}<extra></extra>"), row=1, col=c)
    fig.update_layout(barmode="group")
    fig.update_xaxes(tickangle=-40, tickvals=names,
                     ticktext=[f"<b>{n}</b>" if n == highlight else n for n in names])
    fig.update_yaxes(tickformat=".0%", row=1, col=2)
    return base_layout(fig, "Router policies on the same workload and fleet", height=380)


def staleness_figure(rows: list[dict], highlight: str | None = None) -> go.Figure:
    """TTFT p99 against the router's staleness, a line per policy (each policy its colour in
    POLICIES' order; the `highlight`ed one, the sidebar's, drawn thick and named so)."""
    fig = go.Figure()
    for pol in dict.fromkeys(r["policy"] for r in rows):
        pts = [r for r in rows if r["policy"] == pol]
        k = POLICIES.index(pol) if pol in POLICIES else 0
        mine = pol == highlight
        fig.add_trace(go.Scatter(x=[str(int(r["staleness_ms"])) if float(r["staleness_ms"]).is_integer()
                                    else f"{r['staleness_ms']:g}" for r in pts],
                                 y=[r["ttft_p99_ms"] for r in pts], mode="lines+markers",
                                 name=pol + (" (the sidebar's)" if mine else ""),
                                 line=dict(color=PALETTE[k % len(PALETTE)], width=4 if mine else 1.5),
                                 marker=dict(size=9 if mine else 6),
                                 customdata=[[r["ttft_p50_ms"], r["imbalance"]] for r in pts],
                                 hovertemplate=pol + ", staleness %{x} ms: TTFT p99 %{y:.3f} ms (p50 "
                                               "%{customdata[0]:.3f}), imbalance %{customdata[1]:.2f}<extra></extra>"))
    fig.update_xaxes(title_text="router staleness (ms; evenly spaced)", type="category")
    fig.update_yaxes(title_text="TTFT p99 (ms)", rangemode="tozero")
    return base_layout(fig, "TTFT p99 as the router's view of the replicas gets older", height=380)


def pd_split_figure(rows: list[dict]) -> go.Figure:
    """Goodput against the prefill:decode split of a fixed number of replicas (and all whole)."""
    x = [r["split"] for r in rows]
    colors = [GRAY if r["prefill"] == 0 else BLUE for r in rows]
    fig = go.Figure(go.Bar(x=x, y=[r.get("goodput_req_per_s") for r in rows], marker_color=colors,
                           customdata=[[r.get("attainment") or 0.0, r["ttft_p99_ms"], r["tpot_p99_ms"]] for r in rows],
                           hovertemplate="%{x}: goodput %{y:.3f} req/s; SLO met by %{customdata[0]:.1%}; TTFT p99 "
                                         "%{customdata[1]:.1f} ms, TPOT p99 %{customdata[2]:.2f} ms<extra></extra>",
                           showlegend=False))
    fig.update_yaxes(title_text="goodput (req/s meeting the SLO)", rangemode="tozero")
    fig.update_xaxes(title_text="prefill : decode replicas")
    return base_layout(fig, "Goodput by prefill:decode split (gray: whole replicas)", height=360)


def fidelity_figure(table: pd.DataFrame, metric: str = "e2e_ms", roles: list[str] | None = None) -> go.Figure:
    """Each request's simulated `metric` (ttft_ms or e2e_ms) against its measured one
    (core.fit.fleet.predict_fleet's table), one color per replica that served it (a disaggregated
    request's decode replica; `roles` name each replica's role), hollow where the simulated router
    chose another replica; the diagonal is a perfect prediction."""
    word = {"ttft_ms": "TTFT", "e2e_ms": "E2E"}[metric]
    fig = go.Figure()
    x, y = table[metric].to_numpy(dtype=float), table[f"{metric}_sim"].to_numpy(dtype=float)
    ok = np.isfinite(x) & np.isfinite(y)
    hi = float(max(x[ok].max(), y[ok].max())) * 1.05 if ok.any() else 1.0
    fig.add_trace(go.Scatter(x=[0, hi], y=[0, hi], mode="lines", line=dict(color=GRAY, dash="dot"),
                             name="simulated = measured", hoverinfo="skip"))
    for k in sorted({int(r) for r in table["replica"].dropna()}):
        sel = (table["replica"] == k).to_numpy() & ok
        same = (table["replica_sim"] == k).to_numpy()
        sym = np.where(same[sel], "circle", "circle-open")
        role = roles[k] if roles is not None and k < len(roles) and roles[k] != "both" else None
        name = f"replica {k}" + (f" ({role})" if role else "")
        fig.add_trace(go.Scatter(
            x=x[sel], y=y[sel], mode="markers", name=name,
            marker=dict(color=color_of(k), symbol=sym.tolist(), size=8),
            customdata=np.stack([table["id"].to_numpy()[sel], table["replica_sim"].to_numpy()[sel]], axis=1),
            hovertemplate=f"%{{customdata[0]}}: measured %{{x:.1f}} ms, simulated %{{y:.1f}} ms on replica "
                          f"%{{customdata[1]}}<extra>{name}</extra>"))
    fig.update_layout(xaxis_title=f"measured {word} (ms)", yaxis_title=f"simulated {word} (ms)")
    return base_layout(fig, f"{word} per request: simulated vs measured", 420)
