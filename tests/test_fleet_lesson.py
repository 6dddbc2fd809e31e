"""The routing lesson (core.lessons.fleet), its exercises (core.lessons.exercises, fleet-*) and
the fleet animation (core.figures.fleet_animate). Expected values are computed here by hand
from the workload files, the route/transfer/finish events and the link's arithmetic."""
import json
import math
import os
import re

import numpy as np
import pytest

from core.config import SchedulerConfig
from core.figures.animate import SPEEDS
from core.figures.fleet_animate import MAX_FRAMES, fleet_animation
from core.fleet.router import RouterConfig
from core.fleet.sim import FleetSpec, simulate_fleet
from core.lessons import fleet as L
from core.lessons.exercises import EXERCISES, GROUPS
from core.workload import Request, Workload

SHARED = json.loads((L.SHARED).read_text())["requests"]     # the workload file, read here by hand


@pytest.fixture(scope="module")
def sections():
    return {s["key"]: s for s in L.lesson_sections()}


def _rows(tr):
    return {rid: k for k, rid in enumerate(tr.ids)}


def _hits_by_hand(tr) -> list[int]:
    """Prefix-hit blocks per replica from the KV block ledger (one `hit` row per block found)."""
    kv = tr.kv[tr.kv["op"] == "hit"]
    return np.bincount(kv["replica"].to_numpy(), minlength=len(tr.meta["fleet"]["replicas"])).tolist()


# ---- the lesson ---------------------------------------------------------------------------------
def test_four_sections_with_their_parts(sections):
    assert list(sections) == ["wins", "skew", "stale", "drain"]
    for s in sections.values():
        assert {"title", "question", "text", "rows", "origin", "workload", "setup", "traces"} <= set(s)
        assert s["origin"].startswith("simulated") and "affine" in s["origin"]
        assert not re.search(r"\b(nan|inf)\b", s["text"], re.I)
        assert s["rows"] and s["traces"]
        for row in s["rows"]:                     # every column defined once
            assert set(row) - {"run", "policy", "signals age ms", "replica"} <= set(L.DEFINITIONS)


def test_prefix_aware_about_doubles_cache_hits_on_conversations(sections):
    s = sections["wins"]
    rr, pa = L.run("mooncake", "round-robin"), L.run("mooncake", "prefix-aware")
    h_rr, h_pa = sum(_hits_by_hand(rr)), sum(_hits_by_hand(pa))
    assert 1.5 <= h_pa / h_rr <= 3.0                                  # "roughly doubles"
    assert f"{h_rr:,}" in s["text"] and f"{h_pa:,}" in s["text"] and f"{h_pa / h_rr:.1f}x" in s["text"]
    # each block found is 16 prompt tokens not computed: prefill computed falls by exactly that
    pre = [int(t.batch.loc[t.batch["kind"] == "prefill", "tokens"].sum()) for t in (rr, pa)]
    assert pre[0] - pre[1] == 16 * (h_pa - h_rr) and f"{pre[0] - pre[1]:,} fewer" in s["text"]
    ttft = {n: (t.tokens.groupby("req")["t_ms"].min() - t.requests["arrival_ms"]).to_numpy() for n, t in
            (("rr", rr), ("pa", pa))}
    p99 = {n: float(np.percentile(v, 99)) for n, v in ttft.items()}
    assert p99["pa"] < p99["rr"]
    assert f"p99 from {p99['rr']:,.1f} to {p99['pa']:,.1f} ms" in s["text"]


def test_few_prefixes_round_robin_misses_only_the_first_of_each_tenant_per_replica(sections):
    tr = L.run("shared", "round-robin")
    routes = sorted(tr.events_of("route"), key=lambda e: e["t_ms"])
    tenant = {r["id"]: r["tenant"] for r in SHARED}
    firsts, seen = set(), set()
    for e in routes:
        key = (tenant[e["req"]], e["replica"])
        if key not in seen:
            seen.add(key)
            firsts.add(e["req"])
    hit = set(tr.kv.loc[tr.kv["op"] == "hit", "req"].tolist())
    missed = {rid for k, rid in enumerate(tr.ids) if k not in hit}
    assert missed == firsts and len(firsts) == 2 * L.REPLICAS         # 2 tenants x 4 replicas
    assert f"{len(firsts)} of {len(SHARED)} requests found nothing cached" in sections["skew"]["text"]


def test_without_its_load_check_prefix_aware_piles_each_tenant_on_one_replica(sections):
    tr = L.run("shared", "prefix-aware", no_balance=True)
    tenant = {r["id"]: r["tenant"] for r in SHARED}
    where: dict = {}
    for e in tr.events_of("route"):
        where.setdefault(tenant[e["req"]], set()).add(e["replica"])
    assert all(len(v) == 1 for v in where.values())                   # each tenant on one replica
    per = np.bincount([e["replica"] for e in tr.events_of("route")], minlength=L.REPLICAS)
    assert (per == 0).sum() == L.REPLICAS - len(where) == 2
    rr = L.run("shared", "round-robin")
    mean = {n: float((t.tokens.groupby("req")["t_ms"].min() - t.requests["arrival_ms"]).mean())
            for n, t in (("rr", rr), ("skew", tr))}
    assert mean["skew"] > mean["rr"]                                 # skew costs TTFT
    assert f"from {mean['rr']:,.1f} to {mean['skew']:,.1f} ms" in sections["skew"]["text"]


def test_excess_load_by_hand():
    # 2 replicas: t=0 -> r0 (both empty: 0); t=1 -> r0 (holds 1, r1 holds 0: 1); r0's request
    # finishes at 1.5; t=2 -> r1 (holds 0, the least: 0); t=3 rejected (-1: 0); t=4 -> r0 (r0 1, r1 1: 0)
    ex = L.excess_load([0, 1, 2, 3, 4], [0, 0, 1, -1, 0], [1.5], [0], 2)
    assert ex.tolist() == [0, 1, 0, 0, 0]
    assert L.longest_run([0, 0, 1, 1, 1, 0]) == 3 and L.longest_run([]) == 0 and L.longest_run([2]) == 1


def test_stale_signals_herd_least_requests(sections):
    fresh, old = L.run("mooncake", "least-requests", 0), L.run("mooncake", "least-requests", 200)
    runs = []
    for tr in (fresh, old):
        reps = [e["replica"] for e in tr.events_of("route")]
        run = best = 1
        for a, b in zip(reps, reps[1:]):
            run = run + 1 if a == b else 1
            best = max(best, run)
        runs.append(best)
    assert runs[1] > 3 * runs[0]                                      # a burst to one replica
    assert f"longest run was {runs[1]}" in sections["stale"]["text"]
    # round-robin reads no signal: the same routes at any staleness
    a, b = L.run("mooncake", "round-robin", 0), L.run("mooncake", "round-robin", 200)
    assert [e["replica"] for e in a.events_of("route")] == [e["replica"] for e in b.events_of("route")]
    lr = sections["stale"]["numbers"]["lr_p99"]
    assert lr[1] > lr[0]


def test_a_drained_replica_finishes_what_it_holds_and_gets_nothing_new(sections):
    tr = L.run("shared", "least-requests", drained=L.DRAINED)
    drain = SHARED[L.DRAIN_AT]["arrival_ms"]
    mine = [e for e in tr.events_of("route") if e["replica"] == L.DRAINED]
    assert mine and max(e["t_ms"] for e in mine) < drain                # routes stop at the drain
    fin = tr.finishes[tr.finishes["replica"] == L.DRAINED]
    held = len(mine) - int((fin["t_ms"] <= drain).sum())
    assert held > 0 and fin["t_ms"].max() > drain                      # it held some, and finished them
    assert len(fin) == len(mine)
    assert len(tr.finishes) == len(SHARED) and (tr.finishes["reason"] == "length").all()   # nothing lost
    d = sections["drain"]["numbers"]
    assert (d["held at the drain"], d["routed"], d["routed after the drain"]) == (held, len(mine), 0)
    assert f"cut off {held} requests" in sections["drain"]["text"]


# ---- the exercises --------------------------------------------------------------------------------
def _ex(key):
    return next(e for e in EXERCISES if e.key == key)


def _lcp(seqs) -> int:
    n = 0
    for col in zip(*seqs):
        if len(set(col)) > 1:
            break
        n += 1
    return n


BPT = 2 * 32 * 32 * 128 * 2          # Llama-2-7B: 2 (K, V) x 32 layers x 32 KV heads x 128 x 2 bytes = 512 KiB


def _by_hand():
    first_tenant = min(SHARED, key=lambda r: r["arrival_ms"])["tenant"]
    theirs = [r for r in SHARED if r["tenant"] == first_tenant]
    shared_blocks = _lcp([r["prompt_ids"] for r in theirs]) // 16
    assert shared_blocks * 16 <= min(r["prompt_tokens"] for r in theirs) - 1   # a hit always leaves a token
    whole = sum(r["prompt_tokens"] < 300 for r in SHARED)
    alone = 0.05 + 2048 * BPT / 25e6      # 25 GB/s = 25e6 bytes per ms
    return {"fleet-1": [9 % 4, 99 % 4],
            "fleet-2": [alone, 0.05 + 2 * 2048 * BPT / 25e6],
            "fleet-3": [(len(theirs) - 1) * shared_blocks],
            "fleet-4": [whole, len(SHARED) - whole],
            "fleet-5": [sum(i % 4 == 3 for i in range(100)), 0]}


BY_HAND = _by_hand()


@pytest.mark.parametrize("key", list(BY_HAND))
def test_fleet_exercises_match_hand_computations(key):
    ex = _ex(key)
    assert len(ex.numeric) == len(BY_HAND[key])
    for n, want in zip(ex.numeric, BY_HAND[key], strict=True):
        assert n.check(want), (n.label, n.value(), want)
        assert not n.check(want + 2 * n.tolerance + 0.01)


def test_hand_numbers_are_the_stated_ones():
    assert BY_HAND["fleet-1"] == [1, 3] and BY_HAND["fleet-5"] == [25, 0]
    assert BY_HAND["fleet-2"][0] == pytest.approx(43.0, abs=0.01)           # 1 GiB over 25 GB/s
    assert BY_HAND["fleet-2"][1] == pytest.approx(85.95, abs=0.01)


def test_every_exercise_belongs_to_a_group_of_the_page():
    prefixes = [p for _, p in GROUPS]
    assert all(sum(e.key.startswith(p + "-") for p in prefixes) == 1 for e in EXERCISES)
    assert sum(e.key.startswith("fleet-") for e in EXERCISES) >= 4


# ---- the animation --------------------------------------------------------------------------------
AFFINE = L.STEP_MODEL


def _frame(fig, k):
    """{trace name: trace data} of frame k (the animated traces by their meta names)."""
    names = {i: n for n, i in fig.layout.meta["traces"].items()}
    fr = fig.frames[k]
    return {names[i]: d for i, d in zip(fr.traces, fr.data)}


def _markers(d) -> list[tuple[int, int]]:
    cd = d.customdata
    return [] if cd is None or not len(cd) else [(int(r), int(q)) for r, q in np.asarray(cd)]


def _expected_whole(tr, t0, t1):
    """Non-disaggregated: (request row, replica) of the requests routed within (t0, t1] (on
    their way) and of those on their replica at t1 (routed by then, not finished, not routed
    within the interval nor finished within it)."""
    rows = _rows(tr)
    fin = dict(zip(tr.finishes["req"].tolist(), tr.finishes["t_ms"].tolist()))
    routed, resident = set(), set()
    for e in tr.events_of("route"):
        k, t, f = rows[e["req"]], e["t_ms"], fin.get(rows[e["req"]], math.inf)
        if t0 < t <= t1:
            routed.add((k, e["replica"]))
        elif t <= t1 < f and not (t0 < f <= t1):
            resident.add((k, e["replica"]))
    return routed, resident


@pytest.mark.parametrize("frames", [20, 60, 500])
def test_frames_are_bounded_and_markers_sit_where_the_routes_sent_them(frames):
    tr = L.run("shared", "round-robin")
    fig = fleet_animation(tr, max_frames=frames)
    assert len(fig.frames) == min(frames, MAX_FRAMES) <= MAX_FRAMES
    assert len(fig.layout.sliders[0].steps) == len(fig.frames)
    assert len(fig.layout.updatemenus[0].buttons) == len(SPEEDS) + 1      # a play per speed, pause
    t = fig.layout.meta["t_ms"]
    rows = _rows(tr)
    fin = dict(zip(tr.finishes["req"].tolist(), tr.finishes["t_ms"].tolist()))
    checked = 0
    for k in range(1, len(fig.frames)):
        d = _frame(fig, k)
        routed, resident = _expected_whole(tr, t[k - 1], t[k])
        assert set(_markers(d["routed"])) == routed
        assert set(_markers(d["resident"])) == resident
        # the count beside each replica: routed there by t[k] and not finished by then
        held = np.zeros(L.REPLICAS, int)
        for e in tr.events_of("route"):
            held[e["replica"]] += e["t_ms"] <= t[k] < fin.get(rows[e["req"]], math.inf)
        assert [int(x.split()[0]) for x in d["count"].text] == held.tolist()
        checked += len(resident)
    assert checked > 0


def test_pd_markers_move_from_prefill_to_decode_during_their_transfer():
    tr = L.pd_run()
    fig = fleet_animation(tr, max_frames=200)
    t = fig.layout.meta["t_ms"]
    rows = _rows(tr)
    routes = {rows[e["req"]]: e for e in tr.events_of("route")}
    xfers = {rows[e["req"]]: e for e in tr.events_of("transfer")}
    seen = 0
    for k in range(1, len(fig.frames)):
        d = _frame(fig, k)
        for row, rep in _markers(d["transfer"]):
            x = xfers[row]
            assert rep == x["dst"] == routes[row]["decode"]
            assert x["t_ms"] <= t[k] and x["t_ms"] + x["dur_ms"] > t[k - 1]
            seen += 1
        for row, rep in _markers(d["prefill"]):
            assert routes[row]["stage"] == "prefill" and rep == routes[row]["replica"]
            assert row not in xfers or xfers[row]["t_ms"] > t[k]
        for row, rep in _markers(d["resident"]):
            e = routes[row]
            if e["stage"] == "whole":                    # short prompt: whole on a decode replica
                assert rep == e["replica"] and tr.meta["fleet"]["replicas"][rep]["role"] == "decode"
            else:
                assert rep == e["decode"] and xfers[row]["t_ms"] + xfers[row]["dur_ms"] <= t[k]
        for row, rep in _markers(d["routed"]):
            assert rep == routes[row]["replica"] and t[k - 1] < routes[row]["t_ms"] <= t[k]
    assert seen > 0
    # the legend names the prefill/decode states; the picture has a prefill and three decode boxes
    names = [a.text for a in fig.layout.annotations]
    assert sum(n.startswith("prefill") for n in names) == 1 and sum(n.startswith("decode") for n in names) == 3


def test_one_replica_and_a_single_engine_trace():
    reqs = [Request(f"r{i}", 10.0 * i, 32, 4) for i in range(12)]
    w = Workload(reqs, name="w")
    tr = simulate_fleet(w, FleetSpec.uniform(1, SchedulerConfig(), AFFINE))
    fig = fleet_animation(tr, max_frames=30)
    assert len(fig.frames) == 30
    reps = {q for k in range(len(fig.frames)) for d in _frame(fig, k).values()
            if d.customdata is not None and np.ndim(d.customdata) == 2 for _, q in _markers(d)}
    assert reps == {0}
    from core.sim.simulate import simulate
    one = simulate(w, SchedulerConfig(), AFFINE)
    assert len(fleet_animation(one, max_frames=10).frames) == 10


def _big(n):
    w = Workload([Request(f"r{i}", 2.0 * i, 64, 8) for i in range(n)], name=f"{n} requests")
    return simulate_fleet(w, FleetSpec.uniform(4, SchedulerConfig(), AFFINE, router=RouterConfig("least-requests")))


JSON_BOUND = 600_000      # bytes: a 2,000-request fleet's animation (counts mode) measured ~183 kB


def test_two_thousand_requests_show_counts_and_stay_small():
    tr = _big(2000)
    fig = fleet_animation(tr)
    assert fig.layout.meta["mode"] == "counts" and len(fig.frames) <= MAX_FRAMES
    size = len(fig.to_json())
    assert size < JSON_BOUND, size
    # the figure does not grow with requests: half as many take about as much
    assert size < 1.25 * len(fleet_animation(_big(1000)).to_json())
    # the counts at a frame are the requests routed to each replica by then and not finished
    t = fig.layout.meta["t_ms"]
    rows = _rows(tr)
    fin = dict(zip(tr.finishes["req"].tolist(), tr.finishes["t_ms"].tolist()))
    for k in (1, len(t) // 3, len(t) // 2):
        held = np.zeros(4, int)
        routed = np.zeros(4, int)
        for e in tr.events_of("route"):
            r = rows[e["req"]]
            held[e["replica"]] += e["t_ms"] <= t[k] < fin[r]
            routed[e["replica"]] += t[k - 1] < e["t_ms"] <= t[k]
        d = _frame(fig, k)
        assert [int(x.split()[0]) for x in d["count"].text] == held.tolist()
        assert {int(r): int(c) for r, c in _markers(d["routed"])} == {r: int(c) for r, c in enumerate(routed) if c}


@pytest.mark.skipif(os.environ.get("FLEET_ANIMATION_PNG") is None, reason="writes PNGs to look at")
def test_write_pngs(tmp_path):     # pragma: no cover - a manual look: FLEET_ANIMATION_PNG=dir pytest -k png
    import plotly.graph_objects as go
    for name, tr in (("pd", L.pd_run()), ("rr", L.run("shared", "round-robin"))):
        fig = fleet_animation(tr)
        f = go.Figure(fig)
        for i, d in zip(fig.frames[30].traces, fig.frames[30].data):
            f.data[i].update(d)
        f.frames = []
        f.write_image(os.path.join(os.environ["FLEET_ANIMATION_PNG"], f"{name}.png"))


def test_the_drain_section_names_its_router_and_tables_put_the_cited_latencies_first():
    """Issue 48 item 11: the drain section did not say its router was least-requests (exercise 5
    uses round-robin: another answer), and the TTFT p99 the texts cite sat past the right edge."""
    from core.lessons.fleet import section_drain, section_skew
    d = section_drain()
    assert "least-requests router" in d["text"] and "round-robin" in d["text"]
    row = section_skew()["rows"][0]
    assert list(row)[:5] == ["run", "TTFT mean ms", "TTFT median ms", "TTFT p99 ms", "E2E p99 ms"]
