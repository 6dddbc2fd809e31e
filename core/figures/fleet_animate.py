"""A fleet trace as a client-side animation (core.figures.animate's conventions: frames, play at
SPEEDS, pause, a slider): the router on the left, the replicas on the right (prefill and decode
columns with disaggregated serving). Each request is a marker that travels from the router to
its replica when routed, sits there while it waits and runs, and leaves when it finishes; with
prefill/decode, it moves from its prefill replica to its decode replica during its KV transfer.

Frames sample the trace's time at equal steps (at most `max_frames`); frame k stands for the
interval (t[k-1], t[k]]. Routing takes no simulated time, so a request routed within a frame's
interval is drawn on its way there (at the fraction of the interval since it was routed); one
whose KV transfer ran within the interval is drawn on the prefill -> decode path (at the fraction
of the transfer done by t[k], kept off the ends), and one that finished within it is drawn
leaving; otherwise a request sits on the replica that holds it at t[k], by the trace's times.
When several of these fall in one interval the earliest (routed, then transfer, then leaving)
is drawn. The line above the picture counts the same events and states.

Past `max_markers` requests, markers would crowd and the figure grow with every frame: the
animation shows per-replica counts instead (requests held, routed within the frame, KV
transfers under way), its size bounded by frames x replicas.
"""
from __future__ import annotations

import math

import numpy as np
import plotly.graph_objects as go

from core.figures import BLUE, GRAY, GREEN, ORANGE, PURPLE, SKY, VERMILLION, base_layout
from core.figures.animate import CONTROLS_PX, play_controls

MAX_FRAMES = 200
MAX_MARKERS = 300          # requests drawn one marker each; more: per-replica counts
ROUTER_XY = (0.06, 0.5)
SINK_XY = (0.06, 0.06)     # rejected at the router
COLUMNS = {"both": 0.78, "prefill": 0.5, "decode": 0.84}   # x of each role's column
BOX_W = 0.07               # a node's half width (x units)
EXIT_DX = 0.07             # a finished request leaves to this far right of its replica's box
SLOT_COLS, SLOT_ROWS = 8, 5
NODE_FILL = {"light": "#ECECEC", "dark": "#3A3E47"}
# (state, legend label, colour): the per-request traces, in this order
STATES = (("routed", "routed: on its way to a replica", SKY),
          ("prefill", "on a prefill replica", ORANGE),
          ("transfer", "KV transfer: prefill → decode", PURPLE),
          ("resident", "on its replica (waiting or running)", BLUE),
          ("leaving", "finished: leaving", GREEN),
          ("rejected", "rejected at the router", VERMILLION))


class _Plan:
    """Each request's route, transfer and finish as arrays (row order), and the nodes' places."""

    def __init__(self, trace):
        reps = trace.meta.get("fleet", {}).get("replicas") or [{"replica": 0, "role": "both"}]
        self.roles = [r.get("role", "both") for r in reps]
        n = len(trace.requests)
        row = {rid: k for k, rid in enumerate(trace.ids)}
        self.n = n
        self.ids = list(trace.ids)
        self.route_t = np.full(n, np.nan)
        self.first = np.full(n, -1, dtype=np.int64)      # first replica (prefill one with PD); -1 rejected
        self.second = np.full(n, -1, dtype=np.int64)     # PD: its decode replica
        for e in trace.events_of("route"):
            k = row[e["req"]]
            self.route_t[k] = e["t_ms"]
            self.first[k] = e["replica"]
            if e.get("stage") == "prefill":
                self.second[k] = e["decode"]
        if not len(trace.events_of("route")) and n:      # a single engine's trace: every request on replica 0
            self.route_t = trace.requests["arrival_ms"].to_numpy(dtype=float).copy()
            self.first[:] = 0
        self.x_start = np.full(n, np.nan)                # transfer start and duration (NaN: none)
        self.x_dur = np.full(n, np.nan)
        for e in trace.events_of("transfer"):
            k = row[e["req"]]
            self.x_start[k] = e["t_ms"]
            self.x_dur[k] = e["dur_ms"] if e["dur_ms"] is not None else np.nan
        self.fin_t = np.full(n, np.inf)                  # the client's finish (inf: never in the trace)
        f = trace.finishes
        if len(f):
            ft, fr = f["t_ms"].to_numpy(dtype=float), f["req"].to_numpy(dtype=np.int64)
            ok = fr >= 0
            np.minimum.at(self.fin_t, fr[ok], ft[ok])
        self.routed = ~np.isnan(self.route_t)
        self.pd = self.second >= 0
        self.places()

    def places(self):
        cols: dict[str, list[int]] = {}
        for i, role in enumerate(self.roles):
            cols.setdefault(role, []).append(i)
        self.xy = np.zeros((len(self.roles), 2))
        tallest = max(len(v) for v in cols.values())
        self.half_h = min(0.42 / tallest, 0.16)
        for role, members in cols.items():
            m = len(members)
            for k, i in enumerate(members):
                self.xy[i] = (COLUMNS[role], 1.0 - (k + 0.5) / m if m > 1 else 0.5)

    # ---- the trace's times -------------------------------------------------------------------
    def on_first(self, t: float) -> np.ndarray:
        """Requests on their first replica at `t`: routed there by `t`, not finished, and (PD) their
        transfer not yet started."""
        return (self.routed & (self.first >= 0) & (self.route_t <= t) & (self.fin_t > t)
                & ~(self.pd & (self.x_start <= t)))

    def on_second(self, t: float) -> np.ndarray:
        """PD requests on their decode replica at `t`: their transfer over, not finished."""
        return self.pd & (self.x_start + self.x_dur <= t) & (self.fin_t > t)

    def held(self, t: float) -> np.ndarray:
        """Requests on each replica at `t` (on_first, on_second)."""
        out = np.zeros(len(self.roles), dtype=np.int64)
        np.add.at(out, self.first[self.on_first(t)], 1)
        np.add.at(out, self.second[self.on_second(t)], 1)
        return out

    def moving(self, t0: float, t1: float) -> np.ndarray:
        """Requests whose KV transfer ran at some time in (t0, t1]."""
        return self.pd & (self.x_start <= t1) & (self.x_start + self.x_dur > t0)

    def transfers(self, t0: float, t1: float) -> np.ndarray:
        """KV transfers that ran at some time in (t0, t1], per decode replica."""
        out = np.zeros(len(self.roles), dtype=np.int64)
        np.add.at(out, self.second[self.moving(t0, t1)], 1)
        return out

    def routed_in(self, t0: float, t1: float) -> np.ndarray:
        return self.routed & (self.route_t > t0) & (self.route_t <= t1)

    def routed_between(self, t0: float, t1: float) -> np.ndarray:
        """Requests routed in (t0, t1] per first replica (index -1 of the result: rejected)."""
        out = np.zeros(len(self.roles) + 1, dtype=np.int64)
        on = self.routed_in(t0, t1)
        np.add.at(out, np.where(self.first[on] >= 0, self.first[on], len(self.roles)), 1)
        return out

    def real_end(self) -> float:
        ends = [self.route_t[self.routed], self.fin_t[np.isfinite(self.fin_t)],
                (self.x_start + self.x_dur)[self.pd & ~np.isnan(self.x_dur)]]
        return float(max((e.max() for e in ends if len(e)), default=0.0))


def _slot_xy(plan: _Plan, node: np.ndarray, rank: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A place inside each node's box for a request (its rank among those sent there, mod slots)."""
    s = rank % (SLOT_COLS * SLOT_ROWS)
    c, r = s % SLOT_COLS, s // SLOT_COLS
    cx, cy = plan.xy[node, 0], plan.xy[node, 1]
    h = plan.half_h * 0.8
    return (cx - BOX_W * 0.85 + (c + 0.5) * (1.7 * BOX_W / SLOT_COLS),
            cy + h - (r + 0.5) * (2 * h / SLOT_ROWS))


def _lerp(p0, p1, f) -> tuple[np.ndarray, np.ndarray]:
    """Points the fraction `f` (clipped to [0, 1]) of the way from p0 to p1 (each an (x, y) of
    scalars or arrays)."""
    f = np.clip(f, 0.0, 1.0)
    return p0[0] + (p1[0] - p0[0]) * f, p0[1] + (p1[1] - p0[1]) * f


def _ranks(node: np.ndarray, order: np.ndarray, nodes: int) -> np.ndarray:
    """Each request's rank among the requests sent to the same node (by `order`)."""
    rank = np.zeros(len(node), dtype=np.int64)
    seen = np.zeros(nodes + 1, dtype=np.int64)
    for k in np.argsort(order, kind="stable").tolist():
        j = node[k]
        if j >= 0:
            rank[k] = seen[j]
            seen[j] += 1
    return rank


class _Markers:
    """Per-request states and positions at frame (t0, t1] (see the module's docstring)."""

    def __init__(self, plan: _Plan):
        self.p = plan
        nodes = len(plan.roles)
        self.s1 = _slot_xy(plan, np.maximum(plan.first, 0), _ranks(plan.first, plan.route_t, nodes))
        self.s2 = _slot_xy(plan, np.maximum(plan.second, 0), _ranks(plan.second, plan.x_start, nodes))
        # where a request ends: its decode replica with PD, else its only one
        self.last = np.where(plan.pd, plan.second, plan.first)
        self.sl = (np.where(plan.pd, self.s2[0], self.s1[0]), np.where(plan.pd, self.s2[1], self.s1[1]))

    def at(self, t0: float, t1: float) -> dict[str, tuple]:
        """state -> (rows, x, y, replica) of the markers in that state."""
        p = self.p
        dt = t1 - t0
        out = {}

        def put(state, mask, x, y, rep):
            rows = np.flatnonzero(mask)
            out[state] = (rows, np.asarray(x)[rows], np.asarray(y)[rows], np.asarray(rep)[rows])

        rej = p.first < 0
        routed = p.routed_in(t0, t1)
        f = (t1 - p.route_t) / dt
        put("routed", routed & ~rej, *_lerp(ROUTER_XY, self.s1, f), p.first)
        put("rejected", routed & rej, *_lerp(ROUTER_XY, SINK_XY, f), p.first)
        busy = routed.copy()
        moving = p.moving(t0, t1) & ~busy
        done = np.clip((t1 - p.x_start) / np.where(p.x_dur > 0, p.x_dur, 1.0), 0.0, 1.0)
        put("transfer", moving, *_lerp(self.s1, self.s2, 0.15 + 0.7 * done), p.second)
        busy |= moving
        leaving = (p.fin_t > t0) & (p.fin_t <= t1) & ~busy & ~rej
        g = np.clip((t1 - p.fin_t) / dt, 0.0, 1.0)
        edge = p.xy[np.maximum(self.last, 0), 0] + BOX_W + EXIT_DX     # from its seat out past the box's edge
        put("leaving", leaving, self.sl[0] + (edge - self.sl[0]) * (0.3 + 0.7 * g), self.sl[1], self.last)
        busy |= leaving
        first, second = p.on_first(t1) & ~busy, p.on_second(t1) & ~busy
        put("prefill", first & p.pd, self.s1[0], self.s1[1], p.first)
        rows_w, rows_d = np.flatnonzero(first & ~p.pd), np.flatnonzero(second)
        out["resident"] = (np.concatenate([rows_w, rows_d]), np.concatenate([self.s1[0][rows_w], self.s2[0][rows_d]]),
                           np.concatenate([self.s1[1][rows_w], self.s2[1][rows_d]]),
                           np.concatenate([p.first[rows_w], p.second[rows_d]]))
        return out


def _frame_times(plan: _Plan, max_frames: int) -> np.ndarray:
    """Equal steps from the first route to the last event, one more after it (leaving)."""
    t0 = float(np.nanmin(plan.route_t)) if plan.routed.any() else 0.0
    frames = max(2, int(max_frames))
    dt = max(plan.real_end() - t0, 1e-3) / (frames - 2)
    return t0 + dt * np.arange(frames)


def _names(times: np.ndarray) -> list[str]:
    dt = float(times[1] - times[0]) if len(times) > 1 else 1.0
    digits = max(0, math.ceil(-math.log10(dt))) if dt > 0 else 3
    return [f"{t:,.{digits}f} ms" for t in times]


def _story(plan: _Plan, t0: float, t1: float) -> str:
    routed = plan.routed_between(t0, t1)
    held = plan.held(t1)
    xfer = int(plan.transfers(t0, t1).sum())
    done = int((plan.fin_t <= t1).sum())
    # over the frame interval (t0, t1]: routed, transfers; at t1: on replicas, finished
    parts = [f"t = {t1:,.0f} ms", f"{int(routed[:-1].sum())} routed", f"{int(held.sum())} on replicas"]
    if plan.pd.any():
        parts.append(f"{xfer} KV transfer{'s' * (xfer != 1)}")
    if routed[-1]:
        parts.append(f"{int(routed[-1])} rejected")
    parts.append(f"{done} of {plan.n} finished")
    return " · ".join(parts)


def fleet_animation(trace, theme: str = "light", max_frames: int = MAX_FRAMES,
                    max_markers: int = MAX_MARKERS) -> go.Figure:
    """The fleet trace as an animation (see the module's docstring); a single engine's trace
    (no route events) as one replica. `layout.meta` holds each frame's time (`t_ms`, the end of
    its interval), `mode` ("requests": a marker each, or "counts") and the index of each animated
    trace by name (`traces`)."""
    plan = _Plan(trace)
    times = _frame_times(plan, min(max_frames, MAX_FRAMES))
    dt = float(times[1] - times[0])
    names = _names(times)
    per_request = plan.n <= max_markers
    fig = go.Figure()
    _nodes(fig, plan, theme)
    index = _add_traces(fig, plan, per_request)
    mk = _Markers(plan) if per_request else None
    frames = []
    for k, t in enumerate(times.tolist()):
        data = _marker_frame(plan, mk, index, t - dt, t) if mk else _count_frame(plan, index, t - dt, t)
        held = plan.held(t)
        if "held" in index:
            data.append(go.Scatter(marker=dict(size=np.where(held > 0, 8 + 5 * np.sqrt(held), 0).tolist()),
                                   customdata=held))
        data.append(go.Scatter(text=[f"{h} held" for h in held.tolist()]))
        data.append(go.Scatter(text=[_story(plan, t - dt, t)]))
        frames.append(go.Frame(name=names[k], data=data, traces=list(index.values())))
    fig.frames = frames
    for i, d in zip(frames[0].traces, frames[0].data):      # the first frame is what shows before play
        fig.data[i].update(d)
    height = int(min(900, 260 + 70 * max(_tallest(plan.roles), 2)))
    base_layout(fig, height=height + CONTROLS_PX)
    fig.update_layout(margin=dict(l=10, r=10, t=40, b=40 + CONTROLS_PX + 24),
                      xaxis=dict(range=[0, 1.08], visible=False, fixedrange=True),
                      yaxis=dict(range=[-0.02, 1.1], visible=False, fixedrange=True),
                      meta={"t_ms": times.tolist(), "mode": "requests" if per_request else "counts", "traces": index})
    return play_controls(fig, names, label="t = ", below_px=20)


def _add_traces(fig: go.Figure, plan: _Plan, per_request: bool) -> dict[str, int]:
    """The animated traces, empty: {name: index}. Per request: one per state (those that occur);
    counts: routed within the frame, transfers within it, requests held (a marker per replica).
    Then, in both, the count beside each replica and the line above the picture."""
    index: dict[str, int] = {}
    if per_request:
        shown = [st for st in STATES if not ((st[0] in ("prefill", "transfer") and not plan.pd.any()) or (
            st[0] == "rejected" and not (plan.routed & (plan.first < 0)).any()))]
        for _, label, color in shown:    # the legend: one point each, off the axes, never animated (an empty
            #                              animated trace would drop out of the legend frame by frame)
            fig.add_trace(go.Scatter(x=[-1], y=[-1], mode="markers", name=label, hoverinfo="skip",
                                     marker=dict(size=9, color=color)))
        for state, label, color in shown:
            index[state] = len(fig.data)
            fig.add_trace(go.Scatter(x=[], y=[], mode="markers", name=label, hovertemplate="%{text}<extra></extra>",
                                     showlegend=False,
                                     marker=dict(size=9, color=color, line=dict(width=0.5, color="white"))))
    else:
        kinds = [("routed", "requests routed within the frame", SKY)]
        if plan.pd.any():
            kinds.append(("transfer", "KV transfers within the frame", PURPLE))
        kinds.append(("held", "requests on the replica", BLUE))
        for _, label, color in kinds:      # the legend (as above)
            fig.add_trace(go.Scatter(x=[-1], y=[-1], mode="markers", name=label, hoverinfo="skip",
                                     marker=dict(size=11, color=color, opacity=0.8)))
        for state, _, color in kinds:
            index[state] = len(fig.data)
            fig.add_trace(go.Scatter(x=plan.xy[:, 0] if state == "held" else [],
                                     y=plan.xy[:, 1] if state == "held" else [],
                                     mode="markers" if state == "held" else "markers+text", textposition="top center",
                                     showlegend=False, marker=dict(color=color, opacity=0.8), hoverinfo="skip"))
    index["count"] = len(fig.data)
    fig.add_trace(go.Scatter(x=plan.xy[:, 0] + BOX_W + 0.005, y=plan.xy[:, 1] - plan.half_h, mode="text",
                             text=[""] * len(plan.xy), textposition="top right", showlegend=False, hoverinfo="skip",
                             textfont=dict(size=13)))
    index["story"] = len(fig.data)
    fig.add_trace(go.Scatter(x=[0.0], y=[1.06], mode="text", text=[""], textposition="middle right",
                             showlegend=False, hoverinfo="skip", textfont=dict(size=13), cliponaxis=False))
    return index


def _marker_frame(plan: _Plan, mk: _Markers, index: dict, t0: float, t1: float) -> list:
    """Per request: each state's markers (x, y; customdata [request row, replica]; hover text)."""
    at = mk.at(t0, t1)
    out = []
    for state in index:
        if state in at:
            rows, x, y, rep = at[state]
            out.append(go.Scatter(x=np.round(x, 4), y=np.round(y, 4),
                                  customdata=np.stack([rows, rep], axis=1) if len(rows) else [],
                                  text=[f"{plan.ids[r]} · replica {q}" for r, q in zip(rows.tolist(), rep.tolist())]))
    return out


def _tallest(roles: list[str]) -> int:
    return max(roles.count(r) for r in set(roles))


def _count_frame(plan: _Plan, index: dict, t0: float, t1: float) -> list:
    """Counts mode: requests routed within (t0, t1] at their path's middle (one marker per
    replica, sized by the count) and KV transfers under way within it on the prefill -> decode paths."""
    out = []
    routed = plan.routed_between(t0, t1)[:-1]
    on = np.flatnonzero(routed)
    mx, my = (ROUTER_XY[0] + plan.xy[on, 0]) / 2, (ROUTER_XY[1] + plan.xy[on, 1]) / 2
    out.append(go.Scatter(x=mx, y=my, text=[f"+{c}" for c in routed[on].tolist()],
                          marker=dict(size=(8 + 4 * np.sqrt(routed[on])).tolist()),
                          customdata=np.stack([on, routed[on]], axis=1) if len(on) else []))
    if "transfer" in index:
        x = plan.transfers(t0, t1)
        on = np.flatnonzero(x)
        px = float(plan.xy[[i for i, r in enumerate(plan.roles) if r == "prefill"], 0].mean())
        out.append(go.Scatter(x=(px + plan.xy[on, 0]) / 2, y=plan.xy[on, 1], text=[str(c) for c in x[on].tolist()],
                              marker=dict(size=(8 + 4 * np.sqrt(x[on])).tolist()),
                              customdata=np.stack([on, x[on]], axis=1) if len(on) else []))
    return out


def _nodes(fig: go.Figure, plan: _Plan, theme: str):
    """The router and the replicas as boxes (layout shapes) with their names; paths as thin lines."""
    fill = NODE_FILL.get(theme, NODE_FILL["light"])
    shapes, notes = [], []
    rx, ry = ROUTER_XY
    for i, ((x, y), role) in enumerate(zip(plan.xy.tolist(), plan.roles)):
        src = [(rx, ry)] if role != "decode" else [(float(plan.xy[j, 0]), float(plan.xy[j, 1]))
                                                   for j, r in enumerate(plan.roles) if r == "prefill"]
        if role == "decode" and plan.pd.sum() < plan.n:   # short prompts run whole on a decode replica
            src.append((rx, ry))
        for sx, sy in src:
            shapes.append(dict(type="line", x0=sx, y0=sy, x1=x, y1=y, layer="below",
                               line=dict(color=GRAY, width=0.6, dash="dot")))
        shapes.append(dict(type="rect", x0=x - BOX_W, x1=x + BOX_W, y0=y - plan.half_h, y1=y + plan.half_h,
                           fillcolor=fill, line=dict(color=GRAY, width=1), layer="below"))
        name = {"both": "replica", "prefill": "prefill", "decode": "decode"}[role]
        notes.append(dict(x=x, y=y + plan.half_h, yanchor="bottom", text=f"{name} {i}", showarrow=False,
                          font=dict(size=12)))
    shapes.append(dict(type="circle", x0=rx - 0.04, x1=rx + 0.04, y0=ry - 0.06, y1=ry + 0.06, fillcolor=fill,
                       line=dict(color=GRAY, width=1), layer="below"))
    notes.append(dict(x=rx, y=ry + 0.06, yanchor="bottom", text="router", showarrow=False, font=dict(size=12)))
    fig.update_layout(shapes=shapes, annotations=notes)
