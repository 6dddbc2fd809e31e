"""Caches around core's fleet (core.fleet, core.experiments.fleet, core.figures.fleet), shared by every session of
the app process: a fleet run per (workload, load multiplier, setup), its figures per trace, and
the comparisons (policies, staleness, P:D splits), each computed once for the same inputs. The
traces and figures returned are shared: never mutate them."""
import streamlit as st

from core.analysis import routing
from core.analysis.metrics import SLO
from core.experiments import fleet as fx
from core.figures import fleet as ff
from ui.cache import HASH_FUNCS

FLEET_HASH = {**HASH_FUNCS, fx.FleetSetup: repr, SLO: repr}


@st.cache_resource(show_spinner=False)
def cached_workload_file(name: str, block_tokens: int | None = None):
    """A bundled workload (data/workloads/NAME), read once per process; `block_tokens`: a Mooncake
    trace's tokens per hash block (core.workload.mooncake)."""
    from core.lessons.scenarios import DATA
    from core.workload import load_workload
    path = DATA / "workloads" / name
    return load_workload(path, block_tokens=block_tokens) if block_tokens else load_workload(path)


@st.cache_resource(show_spinner=False, max_entries=16, hash_funcs=FLEET_HASH)
def _compressed(workload, factor: float):
    return fx.compressed(workload, factor)


@st.cache_resource(show_spinner="Simulating the fleet…", max_entries=16, hash_funcs=FLEET_HASH)
def cached_fleet(workload, factor: float, setup: fx.FleetSetup):
    """(the workload as simulated: arrivals compressed by `factor`; its fleet trace)."""
    w = _compressed(workload, factor)
    return w, fx.run_fleet(w, setup, created="(app)")


def _animation(trace, theme: str):
    from core.figures.fleet_animate import fleet_animation
    return fleet_animation(trace, theme)


_VIEWS = {"animation": _animation, "lanes": ff.fleet_lanes, "signals": ff.replica_signals,
          "hits": ff.replica_hits_figure, "transfers": ff.transfers_figure, "numbers": routing.fleet_numbers,
          "routes": routing.request_replicas}


@st.cache_resource(show_spinner=False, max_entries=64, hash_funcs=FLEET_HASH)
def _fleet_view(what: str, trace, args: tuple):
    return trace, _VIEWS[what](trace, *args)


def fleet_view(what: str, trace, *args):
    """A view of a fleet trace ("animation", "lanes", "signals", "hits", "transfers", "numbers",
    "routes"), once per
    trace and arguments (the trace is keyed by identity: it comes out of a cache and outlives the entry)."""
    return _fleet_view(what, trace, args)[1]


def cached_policy_rows(workload, factor: float, setup: fx.FleetSetup) -> list[dict]:
    """Every policy on the setup: the same rows whatever the sidebar's policy (keyed without it, so
    choosing another policy does not simulate all seven again); keyed by the policies registered now
    (a module that registers one later gets its row)."""
    import dataclasses
    return _policy_rows(workload, factor, dataclasses.replace(setup, policy=ff.POLICIES[0]), tuple(ff.POLICIES))


@st.cache_resource(show_spinner="Simulating every router policy…", max_entries=16, hash_funcs=FLEET_HASH)
def _policy_rows(workload, factor: float, setup: fx.FleetSetup, policies: tuple) -> list[dict]:
    return fx.compare_policies(_compressed(workload, factor), setup, policies)


def cached_staleness_rows(workload, factor: float, setup: fx.FleetSetup, staleness: tuple,
                          policies: tuple) -> list[dict]:
    """The staleness grid for `policies`: keyed without the sidebar's policy and staleness (it sets both)."""
    import dataclasses
    return _staleness_rows(workload, factor, dataclasses.replace(setup, policy=ff.POLICIES[0], staleness_ms=0.0),
                           staleness, policies)


@st.cache_resource(show_spinner="Simulating each policy at each staleness…", max_entries=16, hash_funcs=FLEET_HASH)
def _staleness_rows(workload, factor: float, setup: fx.FleetSetup, staleness: tuple,
                    policies: tuple) -> list[dict]:
    return fx.staleness_sweep(_compressed(workload, factor), setup, staleness, policies)


@st.cache_resource(show_spinner="Simulating each prefill:decode split…", max_entries=16, hash_funcs=FLEET_HASH)
def cached_pd_rows(workload, factor: float, setup: fx.FleetSetup, total: int, slo: SLO) -> list[dict]:
    return fx.pd_splits(_compressed(workload, factor), setup, total, slo)


def cached_lesson() -> list[dict]:
    """The routing lesson's sections (core.lessons.fleet), computed once per process (by
    prefetch_lesson's thread, usually, before the tab is opened)."""
    with st.spinner("Simulating the routing lesson's runs…"):
        return _lesson()


@st.cache_resource(show_spinner=False)
def _lesson() -> list[dict]:
    from core.lessons.fleet import lesson_sections
    return lesson_sections()


_PREFETCH: list = []


def prefetch_lesson() -> None:
    """After the Fleet page drew its first view: compute the lesson's runs in a thread of their own
    (a few seconds of one core), so that opening its tab finds them ready; once per process. A tab
    opened meanwhile waits on the same computation (Streamlit's per-entry compute lock)."""
    import threading
    if _PREFETCH:
        return
    _PREFETCH.append(threading.Thread(target=_lesson, name="fleet-lesson-prefetch", daemon=True))
    _PREFETCH[0].start()


@st.cache_resource(show_spinner=False, max_entries=16, hash_funcs=FLEET_HASH)
def _one_replica(trace, replica: int):
    from core.trace import one_replica
    return trace, one_replica(trace, replica)


@st.cache_resource(show_spinner=False, max_entries=16, hash_funcs=FLEET_HASH)
def _fleet_as_one(trace):
    from core.analysis.cursor import fleet_as_one
    return trace, fleet_as_one(trace)


def cached_fleet_as_one(trace):
    """A fleet trace's replicas as one engine's cursor views read them (core.analysis.cursor.fleet_as_one: each
    replica's blocks numbered apart, the fleet's totals in its steps), once per trace (by identity)."""
    return _fleet_as_one(trace)[1]


def cached_one_replica(trace, replica: int):
    """One replica of a fleet trace as a trace of its own (core.trace.one_replica), once per trace
    (keyed by identity, as fleet_view) and replica."""
    return _one_replica(trace, replica)[1]


@st.cache_resource(show_spinner=False, max_entries=8)
def cached_measured(path: str):
    """A bundled measured fleet trace, read once per process."""
    from core.trace import load_trace
    return load_trace(path)


@st.cache_resource(show_spinner="Pairing the fleet's repeats…", max_entries=8)
def cached_fleet_floor(path: str):
    """The repeat floor (core.fit.noise) of a bundled fleet run's repeats, or None (no repeats)."""
    from core.fit.fleet import fleet_run, repeats_beside
    from core.fit.noise import repeat_floor
    reps = repeats_beside(path)
    return repeat_floor([fleet_run(p) for p in reps]) if reps else None


@st.cache_resource(show_spinner="Simulating the measured fleet's workload…", max_entries=8)
def cached_prediction(path: str):
    """(simulated trace, report, per-request table) of core.fit.fleet.predict_fleet for a
    bundled measured fleet trace."""
    from core.fit.fleet import clients_of, predict_fleet
    return predict_fleet(cached_measured(path), clients=clients_of(path))


def uploaded_fleet(up):
    """(fleet trace, None) of an uploaded file, or (None, why not): a trace of several replicas
    (meta.fleet or a replica column), any format the Replay page opens. Kept in this session only."""
    from core.analysis.routing import has_replicas
    from ui.cache import parse_uploaded_trace
    from ui.fmt import md
    tr, imp, err = parse_uploaded_trace(up, "fl_meas")
    if err:
        return None, f"Could not load {md(up.name)}: {md(err)}"
    if tr is None and imp is not None:
        tr = imp.trace
    if tr is None or not has_replicas(tr):
        return None, (f"{md(up.name)} is not a fleet trace (no meta.fleet and no replica column): a single engine's "
                      "trace opens on the Replay page; replicas' own traces become one with `python -m core "
                      "fleet-merge`")
    return tr, None


def held_prediction(tr):
    """core.fit.fleet.predict_fleet of a fleet trace that is not a bundled file (an upload), once per
    trace object, in this session only (as its trace: parse_uploaded_trace; held by a weak reference,
    so a later trace never meets another's prediction); raises InputError where it cannot be predicted."""
    import weakref

    from core.fit.fleet import predict_fleet
    key = "_fleet_prediction"
    held = st.session_state.get(key)
    if held is not None and held[0]() is tr:
        return held[1]
    st.session_state.pop(key, None)
    with st.spinner("Simulating the fleet's workload…"):
        got = predict_fleet(tr)
    st.session_state[key] = (weakref.ref(tr), got)
    return got


def fleet_prediction_panel(tr, path: str | None, key: str) -> None:
    """The fleet simulator on a measured fleet's own workload beside it (core.fit.fleet.predict_fleet):
    routing agreement and per-request errors (as multiples of the repeat floor where the run has
    repeats), the step models, and each request's (measured, simulated) TTFT and E2E. `path`: a
    bundled file (shared cache), else held in this session (held_prediction)."""
    import pandas as pd

    from core.analysis.routing import replica_roles
    from core.errors import InputError
    from core.figures.fleet import fidelity_figure
    from core.fit.noise import describe as describe_floor
    from ui.fmt import md, origin_badge
    from ui.present import show_chart, show_table
    if not (tr.meta.get("fleet") or {}).get("router"):
        st.caption("This run's router was not ours (its decisions are not in the trace): no simulation beside it.")
        return
    try:
        sim, rep, table = cached_prediction(path) if path is not None else held_prediction(tr)
    except InputError as e:
        st.error(f"The fleet simulator cannot predict this run: {md(e)}")
        return
    st.markdown(f"**The fleet simulator on this run's own workload** (the front end's arrival times, the same "
                f"router, a step model fitted on each role's first replica plus its time between steps, its "
                f"wake-up after a pause and the router-to-replica hop: core/fit/fleet.py): {origin_badge(sim)}")
    row = {"routing agreement": f"{rep['routing_agreement']:.0%}" if rep["routing_agreement"] is not None else "—"}
    floor = cached_fleet_floor(path) if path is not None else None
    for k, word in (("ttft", "TTFT"), ("e2e", "E2E"), ("transfer", "KV transfer")):
        if k in rep and rep[k]["median"] is not None:
            row[f"{word} error median"] = f"{rep[k]['median']:.1%}"
            f = (floor or {}).get(f"{k}_ms", {}).get("p50")
            if f:
                row[f"{word} x floor"] = f"{rep[k]['median'] / f:.1f}x"
            row[f"{word} error p90"] = f"{rep[k]['p90']:.1%}"
    show_table(pd.DataFrame([row]), hide_index=True, key=f"{key}_err")
    if floor:
        st.caption(f"Floor (measured): {md(describe_floor(floor))}. In sample: within 1.5x the floor is issue 49's "
                   "target (docs/fidelity.md, Fleets).")
    load = rep.get("load") or {}
    st.caption("Error per request: |simulated - measured| / measured. Step models: "
               + "; ".join(f"{r}: {md(d)}" for r, d in rep["step_models"].items())
               + (f". Replicas sharing the host's cores: each step takes 1 + {rep['contention']:.2f} x (the other "
                  "replicas mid-step at its start) times its price, c measured on the fit run's steps"
                  if rep.get("contention") else "")
               + (f". Sent as a closed loop of {load['concurrency']} clients (each later request a simulated finish "
                  "plus its measured round trip)" if load.get("kind") == "closed" else ". Sent at the measured times"))
    left, right = st.columns(2)
    roles = replica_roles(tr)
    show_chart(fidelity_figure(table, "ttft_ms", roles), key=f"{key}_ttft", where=left, width="stretch")
    show_chart(fidelity_figure(table, "e2e_ms", roles), key=f"{key}_e2e", where=right, width="stretch")
