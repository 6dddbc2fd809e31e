"""The fleet simulator held against a measured fleet (a `gpu_runner fleet` trace): the same
workload (the front end's arrival times, the prompts' token ids), the same router policy and
replicas, a step model per role fitted on that role's first replica (core.fit.stepfit, the code
of `python -m core fit`) — then, per request, whether the router chose the same replica and how
far the simulated TTFT and E2E are from the measured ones; with disaggregated serving, each KV
transfer's predicted duration against its measured one.

The step model is the fitted one plus the engine's time between steps while it is busy
(`step_gap_ms`): a step's measured `dur_ms` runs from its start to its tokens on the host, and
the loop's output processing, its messages and (on a shared machine) the other processes' turns
on the cores fall between steps, where the simulator's back-to-back steps have nothing.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from core.errors import ConfigError

GAP_CAP_MS = 50.0


def step_gap_ms(trace) -> float:
    """One replica's mean time between steps while busy: next start - this end after steps
    that ran more than one request (one is surely still running), gaps under GAP_CAP_MS."""
    st = trace.steps.sort_values("t_ms")
    t, d, run = st["t_ms"].to_numpy(), st["dur_ms"].to_numpy(), st["running"].to_numpy()
    gap = t[1:] - (t[:-1] + d[:-1])
    gap = gap[(run[:-1] > 1) & (gap >= 0) & (gap < GAP_CAP_MS)]
    return float(gap.mean()) if len(gap) else 0.0


def dispatch_ms(trace) -> float | None:
    """The router-to-engine hop of a measured fleet: over the requests that found their replica
    idle (its last step had ended before they arrived), the median time from the front end's
    arrival to the start of the step that first ran them; None with fewer than 5 such requests."""
    b, st = trace.batch, trace.steps
    if not len(b) or not len(st) or "replica" not in st:
        return None
    st = st.sort_values(["replica", "t_ms"])
    end = {}
    for rep, g in st.groupby("replica"):
        end[int(rep)] = (g["t_ms"].to_numpy(dtype=float), (g["t_ms"] + g["dur_ms"]).to_numpy(dtype=float))
    where = st.set_index("step")
    first = b.sort_values("step").groupby("req")["step"].first()
    arrival = trace.requests["arrival_ms"].to_numpy(dtype=float)
    hops = []
    for req, step in first.items():
        if step not in where.index:
            continue
        row = where.loc[step]
        t0, rep = float(row["t_ms"]), int(row["replica"])
        starts, ends = end[rep]
        j = int(np.searchsorted(starts, t0))          # this step's index on its replica
        a = arrival[int(req)]
        if j == 0 or ends[j - 1] <= a:
            hops.append(t0 - a)
    return float(np.median(hops)) if len(hops) >= 5 else None


BUSY_GAP_MS = 2.0   # a step this soon after the last one ended ran on a busy engine (no wake-up)
FIRST_USE_ROUNDS = 8
MIN_COVER = 10      # busy steps that must carry each feature the replica's steps carry


def fit_replica(trace, k: int, model: str = "features", gap: bool = True, wake: bool = True, scale=None):
    """(step model, fit report) fitted on replica k's steps of a fleet trace; `gap`: base_ms plus
    its step_gap_ms; `wake`: the replica's wake-up after a pause (core.fit.wake) from its own steps —
    the model fitted (robust_solve) on the steps that followed another within BUSY_GAP_MS, then
    every step's residual against the idle time before it (c + wake_ms x (1 - exp(-idle / tau)));
    where fewer than MIN_IDLE_STARTS steps followed a pause or no wake-up shows, the plain fit
    (core.fit.stepfit.fit) on every step. `scale`: per step (a Series by step number), what its
    measured duration is divided by before the model is fitted (the other replicas' contention:
    fit_fleet); the idle times and the gap stay as measured."""
    from core.fit.stepfit import fit, model_of, trace_features
    from core.fit.wake import MIN_FIRST_USES, MIN_IDLE_STARTS, first_uses, fit_curve, idle_before
    from core.trace import one_replica
    one = one_replica(trace, k)
    on = one
    if scale is not None:
        on = dataclasses.replace(one, steps=one.steps.copy())
        on.steps["dur_ms"] = on.steps["dur_ms"] / scale.reindex(on.steps["step"]).fillna(1.0).to_numpy()
    sm, report = fit(on, model)
    if wake:
        steps, X, y = trace_features(on)
        idle = idle_before(one.steps.set_index("step").loc[steps])
        # the steps that ran a batch size (tokens) for the first time: they also pay its first use
        new = first_uses(one.batch.groupby("step")["tokens"].sum().reindex(steps, fill_value=0).to_numpy())
        if new.sum() < MIN_FIRST_USES or (~new).sum() < 10:
            new = np.zeros(len(y), dtype=bool)
        paused = np.where(idle < BUSY_GAP_MS, 0.0, idle)    # (a step this soon after another: no wake-up)
        busy = paused == 0
        # (every term the steps price must be seen on enough busy steps: a decode replica's one-token
        # prefills after a KV handoff mostly follow a pause, and a term fitted on a handful of rows
        # would price them all)
        seen = (X != 0).sum(axis=0)
        covered = all((X[busy, c] != 0).sum() >= MIN_COVER for c in range(X.shape[1]) if seen[c])
        idle_starts = paused > 0
        if idle_starts.sum() >= MIN_IDLE_STARTS and busy.sum() >= 10 and covered:
            # the wake-up and the first use, fitted together on every step's residual; then the busy
            # steps again without the first uses' cost, and both again (two rounds)
            shape = 0.0
            for _ in range(FIRST_USE_ROUNDS):
                coef, quality = robust_solve(X[busy], (y - shape * new)[busy], model)
                c, w, tau, shape = fit_curve(y - X @ coef, paused, new)
            if w > 0 or shape > 0:
                sm = dataclasses.replace(model_of(model, coef), wake_ms=w, wake_tau_ms=tau, shape_ms=shape)
                report = {**report, **quality, "wake": {"wake_ms": w, "wake_tau_ms": tau, "offset_ms": c,
                                                        "idle_starts": int(idle_starts.sum())},
                          "first_use": {"shape_ms": shape, "first_uses": int(new.sum())}}
    if gap:
        g = step_gap_ms(one)
        sm = dataclasses.replace(sm, base_ms=sm.base_ms + g)
        report = {**report, "gap_ms": g}
    return sm, report


ROBUST_STEP_MS = 0.3   # soft-L1 scale of a step's residual in robust_solve


def robust_solve(X: np.ndarray, y: np.ndarray, model: str) -> tuple[np.ndarray, dict]:
    """core.fit.stepfit.solve's coefficients refitted with a soft-L1 loss (scale ROBUST_STEP_MS,
    non-negative): the typical step's cost, not the mean's. On a shared 2-core machine a few steps
    stall for the other processes' turns; least squares prices every step at the stalls' share
    (the bundled round-robin fleet: decode steps of one sequence 2.29 ms at the median, 3.0 ms as
    fitted), which a request's own decode mostly does not see. The quality report is solve's."""
    from scipy.optimize import least_squares

    from core.fit.stepfit import MODELS, solve
    from core.sim.stepmodel import FEATURES
    coef, quality = solve(X, y, model)
    cols = [FEATURES.index(f) for f in MODELS[model]]
    scale = np.linalg.norm(X[:, cols], axis=0)
    scale[scale == 0] = 1.0
    A = X[:, cols] / scale
    got = least_squares(lambda c: A @ c - y, np.maximum(coef[cols] * scale, 0.0), bounds=(0.0, np.inf),
                        loss="soft_l1", f_scale=ROBUST_STEP_MS)
    full = np.zeros(len(FEATURES))
    full[cols] = got.x / scale
    if full[0] <= 0 and full[2] <= 0 and full[4] <= 0:     # a decode-only step must take time
        full[0] = max(float(np.min(y)), 1e-6)
    return full, {**quality, "loss": f"soft-L1 at {ROBUST_STEP_MS} ms"}


def link_fit(transfers: list[dict]) -> tuple[float, float]:
    """(latency ms, GB/s) of duration = latency + bytes / bandwidth, least squares over measured
    transfers ({bytes, dur_ms}); GB/s = 1e9 bytes per second."""
    b = np.array([e["bytes"] for e in transfers], dtype=float)
    d = np.array([e["dur_ms"] for e in transfers], dtype=float)
    if len(b) < 2 or np.ptp(b) == 0:
        raise ConfigError("link fit: needs at least two transfers of different sizes")
    slope, icpt = np.polyfit(b, d, 1)
    return max(0.0, float(icpt)), (1.0 / slope / 1e6 if slope > 0 else 1e5)


def errors(pred, meas) -> dict:
    """|pred - meas| / meas over the pairs where both are known: median, p90, n."""
    pred, meas = np.asarray(pred, dtype=float), np.asarray(meas, dtype=float)
    ok = np.isfinite(pred) & np.isfinite(meas) & (meas > 0)
    if not ok.any():
        return {"median": None, "p90": None, "n": 0}
    e = np.abs(pred[ok] - meas[ok]) / meas[ok]
    return {"median": float(np.median(e)), "p90": float(np.percentile(e, 90)), "n": int(ok.sum())}


DECODE_PREFILL_NOTE = (" (a decode replica's prefill tokens are the last prompt token it recomputes for each "
                       "transferred request, so its per-prefill-token term is the cost of taking one in, its KV "
                       "written, not a prefill rate)")


def serving_replicas(trace) -> dict:
    """Request id -> the replica that emitted its tokens, by the route events: a whole request's
    replica, a disaggregated one's decode replica (its TTFT and E2E are measured there)."""
    out = {}
    for e in trace.events_of("route"):
        d = e.get("decode")
        out[e["req"]] = d if isinstance(d, int) and d >= 0 else e["replica"]
    return out


def roles_of(trace) -> list[str]:
    reps = (trace.meta.get("fleet") or {}).get("replicas")
    if not isinstance(reps, list) or not reps:
        raise ConfigError("fleet prediction: the trace has no meta.fleet.replicas (not a fleet trace)")
    return [str(r.get("role", "both")) if isinstance(r, dict) else "both" for r in reps]


def others_busy(trace, k: int):
    """Per step of replica k (a Series by step number): how many other replicas were mid-step when
    it started (a step of theirs started before it and ended after: FleetSpec.contention's rule)."""
    import pandas as pd
    st = trace.steps
    rep = st["replica"].to_numpy()
    mine = st[rep == k]
    t = mine["t_ms"].to_numpy(dtype=float)
    n = np.zeros(len(t), dtype=np.int64)
    for j in np.unique(rep[rep != k]).tolist():
        g = st[rep == j].sort_values("t_ms")
        s0 = g["t_ms"].to_numpy(dtype=float)
        e0 = s0 + g["dur_ms"].to_numpy(dtype=float)
        i = np.searchsorted(s0, t, side="left") - 1    # (its last step started before t: mid-step if it ends after)
        n += (i >= 0) & (e0[np.maximum(i, 0)] > t)
    return pd.Series(n, index=mine["step"].to_numpy())


MIN_CONTENTION_STEPS = 20   # busy-engine steps each with and without another replica mid-step


def contention(trace, k: int, sm) -> float | None:
    """How much slower replica k's steps ran while other replicas were mid-step (replicas sharing
    a host's cores): c in duration = price x (1 + c x others mid-step), from the ratio of the
    medians of duration / price (the model's batch terms, no wake-up) over the steps that followed
    another within BUSY_GAP_MS and ran no batch size for the first time, with and without others
    mid-step (per other replica); None with fewer than MIN_CONTENTION_STEPS of either."""
    from core.fit.stepfit import trace_features
    from core.fit.wake import first_uses, idle_before
    from core.trace import one_replica
    one = one_replica(trace, k)
    steps, X, y = trace_features(one)
    busy = others_busy(trace, k).reindex(steps).fillna(0).to_numpy()
    idle = idle_before(one.steps.set_index("step").loc[steps])
    new = first_uses(one.batch.groupby("step")["tokens"].sum().reindex(steps, fill_value=0).to_numpy())
    price = X @ sm.coefficients()
    ok = (idle < BUSY_GAP_MS) & (price > 0) & ~new
    lone, shared = ok & (busy == 0), ok & (busy > 0)
    if lone.sum() < MIN_CONTENTION_STEPS or shared.sum() < MIN_CONTENTION_STEPS:
        return None
    r = y / np.where(price > 0, price, 1.0)
    return max(0.0, float(np.median(r[shared]) / np.median(r[lone]) - 1.0) / float(busy[shared].mean()))


def fit_fleet(trace, model: str = "features", gap: bool = True, shared: bool = True) -> dict:
    """Role -> (step model, fit report), each fitted on that role's first replica of a fleet trace.
    `shared`: with several replicas, their contention for the host's cores (`contention`) is
    measured on that replica's steps and the model fitted on the durations without it (two rounds);
    the report's `contention` is c (0: not measurable), which predict_fleet gives the simulator."""
    roles = roles_of(trace)
    hop = dispatch_ms(trace)
    out = {}
    for role in dict.fromkeys(roles):
        k = roles.index(role)
        sm, report = fit_replica(trace, k, model, gap)
        c = 0.0
        if shared and len(roles) > 1:
            busy = others_busy(trace, k)
            for _ in range(2):
                got = contention(trace, k, sm)
                if not got:
                    break
                c = got
                sm, report = fit_replica(trace, k, model, gap, scale=1.0 + c * busy)
        out[role] = (sm, {**report, "dispatch_ms": hop, "contention": c})
    return out


def fleet_run(path):
    """A measured fleet trace as a core.fit.runs.Run (its requests' TTFT and E2E on the fleet front
    end's clock): what core.fit.noise needs to hold repeats of one fleet workload against each other."""
    from pathlib import Path

    from core.fit.runs import Run
    from core.trace import load_trace
    p = Path(path)
    tr = load_trace(p)
    roles_of(tr)
    name = p.name[:-len(".json.gz")] if p.name.endswith(".json.gz") else p.stem
    return Run(name, p, tr.workload(), tr, "the fleet front end's (its arrival to the token leaving it)", None)


# The bundled fleet repeats' clients (data/imports/fleet_repeats/MADE.md): a fleet trace does not
# record its client, and a closed loop must be predicted as one
REPEAT_CLIENTS = {"closed": 16}


def clients_of(path) -> int | None:
    """A bundled fleet repeat's closed-loop clients (`<config>_r<N>.json.gz`, REPEAT_CLIENTS), else None."""
    import re
    from pathlib import Path
    m = re.fullmatch(r"(?P<config>.+)_r\d+\.json\.gz", Path(path).name)
    return REPEAT_CLIENTS.get(m["config"]) if m and Path(path).parent.name == "fleet_repeats" else None


def repeats_beside(path) -> list:
    """The repeats of a fleet run saved as `<config>_r<N>.json.gz` (bench/fleet_repeats.py): every
    file of that config in its folder, in round order (the run itself among them); [] otherwise."""
    import re
    from pathlib import Path
    p = Path(path)
    m = re.fullmatch(r"(?P<config>.+)_r\d+\.json\.gz", p.name)
    if not m:
        return []
    got = sorted(p.parent.glob(f"{m['config']}_r*.json.gz"),
                 key=lambda q: int(re.search(r"_r(\d+)\.json\.gz$", q.name).group(1)))
    return got if len(got) >= 2 else []


def measured_spec(trace, fits: dict, link: tuple[float, float] | None = None):
    """(the FleetSpec a measured fleet trace ran as, with each role's fitted step model; the link used):
    its replicas' roles and engine options, its router, the fits' dispatch hop and contention, and
    (disaggregated) the KV link (`link`, or fitted on its own transfers) and bytes per token."""
    from core.config import SchedulerConfig, from_dict
    from core.fleet.sim import FleetSpec, ReplicaSpec
    roles = roles_of(trace)
    names = {f.name for f in dataclasses.fields(SchedulerConfig)}
    eng = {k: v for k, v in (trace.meta.get("engine") or {}).items() if k in names}
    cfg = from_dict(SchedulerConfig, eng, "meta.engine", strict=False)
    missing = [r for r in dict.fromkeys(roles) if r not in fits]
    if missing:
        raise ConfigError(f"fleet prediction: no step model for the {', '.join(missing)} role(s) of this fleet "
                          f"(fitted: {', '.join(fits) or 'none'})")
    router = _router_of(trace)
    kw, link = _link_options(trace, roles, link)
    hop = next((f[1].get("dispatch_ms") for f in fits.values() if f[1].get("dispatch_ms") is not None), None)
    shared = max((f[1].get("contention") or 0.0 for f in fits.values()), default=0.0)
    spec = FleetSpec([ReplicaSpec(cfg, fits[r][0], r) for r in roles], router=router, dispatch_ms=hop or 0.0,
                     contention=shared if len(roles) > 1 else 0.0, **kw)
    return spec, link


def _router_of(trace):
    """The RouterConfig a measured fleet trace's meta.fleet.router states (round-robin by default)."""
    from core.config import from_dict
    from core.fleet.router import RouterConfig
    rc = (trace.meta.get("fleet") or {}).get("router") or {}
    return from_dict(RouterConfig, {k: v for k, v in rc.items() if v is not None}, "meta.fleet.router", strict=False)


def _link_options(trace, roles: list[str], link: tuple[float, float] | None) -> tuple[dict, tuple | None]:
    """(FleetSpec's KV-link options, the link used) of a disaggregated fleet (a prefill role): `link`
    or fitted on the trace's measured transfers; ({}, None) for one that is not."""
    if "prefill" not in roles:
        return {}, None
    measured = [e for e in trace.events_of("transfer") if e.get("dur_ms") is not None]
    link = link if link is not None else link_fit(measured)
    per_token = {e["bytes"] // e["tokens"] for e in measured if e.get("tokens")}
    kw = dict(link_latency_ms=link[0], link_gbps=link[1],
              kv_bytes_per_token=per_token.pop() if len(per_token) == 1 else None,
              model=(trace.meta.get("model") or {}).get("name"),
              pd_min_prompt=(trace.meta.get("fleet") or {}).get("pd_min_prompt", 0))
    return kw, link


def closed_loop_of(trace, mm, clients: int | None) -> dict:
    """simulate_fleet's closed-loop arguments for a measured run sent by `clients` clients (default:
    the trace's meta.load): the first sends as measured, each later one a simulated finish plus that
    replacement's measured round trip (core.fit.predict.round_trips_ms); {} for an open loop."""
    from core.fit.predict import round_trips_ms
    from core.fit.stepinfer import closed_loop_clients
    clients = clients or closed_loop_clients(trace)
    if not clients:
        return {}
    ok = np.isfinite(np.asarray(mm["e2e_ms"], dtype=float))
    trips = round_trips_ms(np.asarray(mm["arrival_ms"], dtype=float)[ok], np.asarray(mm["e2e_ms"], dtype=float)[ok],
                           clients)
    return {"concurrency": clients, "delay_ms": trips if len(trips) else 0.0}


def request_table(trace, sim, mm):
    """Per measured request: its replica and TTFT / E2E, measured and simulated."""
    import pandas as pd

    from core.analysis.metrics import request_metrics
    meas_r, sim_r = serving_replicas(trace), serving_replicas(sim)
    sm = request_metrics(sim)
    at = {rid: i for i, rid in enumerate(sm["id"])}
    idx = np.array([at[r] for r in mm["id"]], dtype=np.int64)
    return pd.DataFrame({"id": list(mm["id"]), "replica": [meas_r.get(r) for r in mm["id"]],
                         "replica_sim": [sim_r.get(r) for r in mm["id"]],
                         "ttft_ms": np.asarray(mm["ttft_ms"], dtype=float),
                         "ttft_ms_sim": np.asarray(sm["ttft_ms"], dtype=float)[idx],
                         "e2e_ms": np.asarray(mm["e2e_ms"], dtype=float),
                         "e2e_ms_sim": np.asarray(sm["e2e_ms"], dtype=float)[idx]})


def predict_fleet(trace, model: str = "features", gap: bool = True, link: tuple[float, float] | None = None,
                  held_out: set | None = None, fits: dict | None = None, clients: int | None = None):
    """(simulated trace, report, per-request table) for a measured fleet trace. `link`: (latency
    ms, GB/s) of a disaggregated fleet's KV link (default: fitted on the trace's own transfers);
    `held_out`: only these requests' transfers are scored (the others fitted the link); `fits`:
    role -> (step model, report) fitted elsewhere (fit_fleet on another run: a held-out
    prediction), default fitted on this trace (in sample). `clients`: the run was sent by a closed
    loop of that many clients (a fleet trace does not record its client; default: the trace's
    meta.load, else its send times): it is predicted as that loop (closed_loop_of) — replaying a
    closed loop's send times would hand a simulation slower than the run more requests than the
    loop keeps in flight."""
    from core.analysis.metrics import request_metrics
    from core.fleet.sim import simulate_fleet
    fits = fits if fits is not None else fit_fleet(trace, model, gap)
    spec, link = measured_spec(trace, fits, link)
    mm = request_metrics(trace)
    sim = simulate_fleet(trace.workload(), spec, **closed_loop_of(trace, mm, clients))
    table = request_table(trace, sim, mm)
    # the router agreed when it chose the same replicas: whole (or prefill) and decode
    pairs = {e["req"]: (e["replica"], e.get("decode", -1)) for e in sim.events_of("route")}
    same = [pairs.get(e["req"]) == (e["replica"], e.get("decode", -1)) for e in trace.events_of("route")]
    report = {"routing_agreement": float(np.mean(same)) if same else None,
              "ttft": errors(table["ttft_ms_sim"], table["ttft_ms"]),
              "e2e": errors(table["e2e_ms_sim"], table["e2e_ms"]),
              "step_models": {r: f[0].describe() + (DECODE_PREFILL_NOTE if r == "decode" else "")
                              for r, f in fits.items()},
              "gap_ms": {r: f[1].get("gap_ms") for r, f in fits.items()}, "dispatch_ms": spec.dispatch_ms or None,
              "contention": spec.contention, "router": spec.router.to_dict(),
              "load": sim.meta.get("load") or {"kind": "open", "sends": "as measured"}}
    if link is not None:
        pt = {e["req"]: e["dur_ms"] for e in sim.events_of("transfer")}
        mt = {e["req"]: e["dur_ms"] for e in trace.events_of("transfer") if e.get("dur_ms") is not None}
        keys = [k for k in mt if k in pt and (held_out is None or k in held_out)]
        report["transfer"] = errors([pt[k] for k in keys], [mt[k] for k in keys])
        report["link"] = {"latency_ms": link[0], "gbps": link[1]}
    return sim, report, table
