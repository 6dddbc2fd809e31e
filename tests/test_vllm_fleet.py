"""Issue 52: a real vLLM fleet opened as it ran. Two vLLM 0.32 CPU servers behind sglang-router
0.3.2 (cache_aware), driven by `vllm bench serve` with X-Request-Ids, each server's own files
(data/imports/vllm_fleet, made by bench/vllm_fleet.sh): `fleet-merge` of the two replica folders
plus the client's file. Expected values come from the files themselves, read here by hand: the
router's own log (which worker each request id was sent to), vLLM's /metrics counters, the
client's own output throughput."""
from __future__ import annotations

import gzip
import json
import re

import numpy as np
import pytest

from core.__main__ import main
from core.analysis.metrics import summarize
from core.errors import TraceError
from core.fleet.client import join_client, pair_by_id
from core.fleet.merge import merge_replicas
from core.fleet.replica_files import replica_trace
from core.trace import load_trace, open_trace
from core.trace.imports.otlp import id_forms
from tests.conftest import DATA
from tests.helpers import charts, open_page

FLEET = DATA / "imports" / "vllm_fleet"
CLIENT = FLEET / "vllm_bench_fleet.json"


@pytest.fixture(scope="module")
def merged(tmp_path_factory):
    out = tmp_path_factory.mktemp("vf") / "fleet.json.gz"
    assert main(["fleet-merge", str(FLEET / "replica0"), str(FLEET / "replica1"), "--client", str(CLIENT),
                 "--out", str(out)]) == 0
    return load_trace(out)


def _port_of_replica(k: int) -> int:
    """The port replica k's server listened on, from its own log's start-up line."""
    log = gzip.decompress((FLEET / f"replica{k}" / "server.log.gz").read_bytes()).decode()
    return int(re.search(r"'port': (\d+)", log).group(1))


def _router_sent() -> dict[str, int]:
    """request id -> the port sglang-router sent it to, from the router's own debug log."""
    text = (FLEET / "router.log").read_text()
    pat = r'request_id="([^"]+)"\}: smg::observability::events: \S+ Sending request url=http://127\.0\.0\.1:(\d+)'
    return {m.group(1): int(m.group(2)) for m in re.finditer(pat, text)}


def test_each_request_is_on_the_replica_its_x_request_id_names(merged, capsys):
    sent = _router_sent()
    port = {_port_of_replica(k): k for k in (0, 1)}
    assert len(sent) == 64 and set(sent) == set(merged.ids)
    fin = dict(zip(merged.finishes["req"].tolist(), merged.finishes["replica"].tolist()))
    assert {rid: fin[i] for i, rid in enumerate(merged.ids)} == {rid: port[p] for rid, p in sent.items()}
    tok = merged.tokens.groupby("req")["replica"].agg(["min", "max"])
    assert (tok["min"] == tok["max"]).all()
    assert [fin[i] for i in tok.index] == tok["min"].tolist()
    joined = merged.meta["fleet"]["client"]
    assert (joined["by_id"], joined["by_time"], joined["unmatched"]) == (64, 0, 0)


def test_the_fleets_output_throughput_is_the_clients(merged):
    doc = json.loads(CLIENT.read_text())
    s = summarize(merged, per_request=False)["summary"]
    assert s["window_kind"] == "client"
    assert s["output_tok_per_s"] == pytest.approx(doc["output_throughput"], rel=1e-9)
    assert s["output_tokens"] == doc["total_output_tokens"]


def _counter(k: int, name: str) -> float:
    """vLLM's own counter over the capture, by hand from its /metrics pages: last less first."""
    vals = []
    with gzip.open(FLEET / f"replica{k}" / "metrics_scrapes.jsonl.gz", "rt") as f:
        for ln in f:
            text = json.loads(ln).get("text")
            if text:
                vals.append(sum(float(x.split()[-1]) for x in text.splitlines() if x.startswith(name + "{")))
    return vals[-1] - vals[0]


def test_per_replica_prefix_hits_are_vllms_own_counters(merged):
    rows = summarize(merged, per_request=False)["summary"]["fleet"]["replicas"]
    for k in (0, 1):
        assert rows[k]["prefix_hit_tokens"] == _counter(k, "vllm:prefix_cache_hits_total")
        assert rows[k]["prefix_query_tokens"] == _counter(k, "vllm:prefix_cache_queries_total")
        assert rows[k]["prefix_hit_blocks"] is None      # no KV rows say which blocks hit: unknown, never 0
    assert all(rows[k]["prefix_hit_tokens"] > 0 for k in (0, 1))


def test_each_replica_keeps_its_own_kv_events_and_gauges(merged):
    for k in (0, 1):
        one, _ = replica_trace(FLEET / f"replica{k}")
        assert int((merged.kv_events["replica"] == k).sum()) == len(one.kv_events) > 0
        gauges = [e for e in merged.other if e.get("type") == "gauge" and e.get("replica") == k]
        assert len(gauges) == len(one.events_of("gauge"))


def test_a_replica_folder_refuses_the_clients_file(tmp_path, capsys):
    d = tmp_path / "r0"
    d.mkdir()
    for f in (FLEET / "replica0").iterdir():
        (d / f.name).write_bytes(f.read_bytes())
    (d / CLIENT.name).write_bytes(CLIENT.read_bytes())
    assert main(["fleet-merge", str(d), str(FLEET / "replica1"), "--out", str(tmp_path / "x.json")]) == 2
    err = capsys.readouterr().err
    assert "the whole fleet's" in err and "--client" in err and not (tmp_path / "x.json").exists()


def test_engine_ids_match_the_sent_id_only_whole():
    assert "fleet-1" in id_forms("cmpl-fleet-1-0")
    assert "fleet-1" not in id_forms("cmpl-fleet-10-0")
    assert "abc" in id_forms("r1/chatcmpl-abc-0-1a2b3c4d")
    assert "fleet-10" in id_forms("cmpl-fleet-10-0")


@pytest.fixture(scope="module")
def fleet_only():
    traces = [replica_trace(FLEET / f"replica{k}")[0] for k in (0, 1)]
    return merge_replicas(traces, names=["replica0", "replica1"])


def _client(**change):
    doc = json.loads(CLIENT.read_text())
    doc.update(change)
    return open_trace(json.dumps(doc).encode(), "client.json").trace


def test_ids_decide_a_missing_id_is_never_paired_by_time(fleet_only):
    client = _client()
    gone = 7
    keep = [j for j, rid in enumerate(fleet_only.ids) if rid != f"cmpl-fleet-{gone}-0"]
    assert len(keep) == 63
    sub = _subset(fleet_only, keep)
    pairs, counts = pair_by_id(client, sub)
    assert counts == {"by_id": 63, "unmatched": 1, "twice": 0}
    assert all(client.ids[i] != f"fleet-{gone}" for i, _ in pairs)
    assert all(sub.ids[j] == f"cmpl-{client.ids[i]}-0" for i, j in pairs)


def test_without_ids_requests_are_paired_by_time_and_the_ambiguous_ones_counted(fleet_only):
    client = _client(request_id_prefix=None)     # (no prefix recorded: ids req0.. that no server saw)
    assert client.ids[0] == "req0"
    tr, r = join_client(fleet_only, client, "client.json")
    assert (r["by_id"], r["by_time"]) == (0, 64)
    sends = np.sort(client.requests["arrival_ms"].to_numpy())
    assert r["ambiguous"] == int((np.diff(sends) <= 2 * r["uncertainty_ms"]).sum())
    assert "ambiguous" in tr.meta["notes"]


def _subset(tr, rows):
    """The trace with only request rows `rows` (their tokens and finishes), by hand."""
    from core.trace.model import Trace
    pos = {j: i for i, j in enumerate(rows)}
    def keep(df):
        df = df[df["req"].isin(rows)].copy()
        df["req"] = [pos[j] for j in df["req"]]
        return df.reset_index(drop=True)
    return Trace(meta=dict(tr.meta), requests=tr.requests.iloc[rows].reset_index(drop=True), tokens=keep(tr.tokens),
                 finishes=keep(tr.finishes), steps=tr.steps, batch=tr.batch.iloc[0:0], kv=tr.kv.iloc[0:0],
                 kv_events=tr.kv_events, preempts=tr.preempts.iloc[0:0], other=list(tr.other),
                 request_extra=[tr.request_extra[j] for j in rows], extra=dict(tr.extra))


def test_the_bundled_fleet_trace_is_what_fleet_merge_makes(merged):
    bundled = load_trace(FLEET / "fleet.json.gz")
    assert bundled.ids == merged.ids
    assert bundled.finishes["replica"].tolist() == merged.finishes["replica"].tolist()
    assert len(bundled.steps) == len(merged.steps) and len(bundled.kv_events) == len(merged.kv_events)


def test_the_fleet_page_opens_the_real_vllm_fleet():
    at = open_page("fleet", {"fl_tab": "Measured", "fl_measured": "vllm_fleet/fleet.json.gz"})
    assert not at.exception
    assert at.selectbox(key="fl_measured").value.startswith("vLLM 0.32 CPU x2")
    figs = {(f["layout"].get("title") or {}).get("text", ""): f for f in charts(at)}
    over_time = next(f for t, f in figs.items() if t.startswith("Each replica over time"))
    names = {d.get("name") for d in over_time["data"]}
    assert {"r0", "r1"} <= names            # each replica's running, waiting, KV from its own /metrics


def test_the_replay_page_opens_the_real_vllm_fleet():
    label = "vLLM 0.32 (CPU) x2 behind sglang-router: a fleet from its servers' own files + vllm bench serve"
    at = open_page("replay", {"tr": label})
    assert not at.exception
    reps = at.selectbox(key="rp_replica")
    assert any(o.startswith("replica 1") for o in reps.options)
    at = reps.set_value(next(o for o in reps.options if o.startswith("replica 1"))).run()
    assert not at.exception


def test_merge_of_the_client_with_a_fleet_trace_joins_by_id(tmp_path, capsys, fleet_only):
    """Issue 52 item 2: `merge bench.json fleet.json.gz` paired by time and put every request on one
    replica; a fleet's trace now goes through the same join as fleet-merge --client."""
    from core.trace import save_trace
    f = tmp_path / "fleet_only.json.gz"
    save_trace(fleet_only, f)
    out = tmp_path / "joined.json.gz"
    assert main(["merge", str(CLIENT), str(f), "--out", str(out)]) == 0
    assert "64 by the ids it sent" in capsys.readouterr().out
    tr = load_trace(out)
    sent = _router_sent()
    port = {_port_of_replica(k): k for k in (0, 1)}
    fin = dict(zip(tr.finishes["req"].tolist(), tr.finishes["replica"].tolist()))
    assert {rid: fin[i] for i, rid in enumerate(tr.ids)} == {rid: port[p] for rid, p in sent.items()}


def test_one_replicas_share_merges_with_the_fleets_client_file(tmp_path, capsys):
    """Issue 52 item 2: the client's 64 requests with one replica's 16 spans were refused ("cannot
    pair"); the ids the client sent pair that replica's 16, the other 48 stay the client's alone."""
    out = tmp_path / "r1.json.gz"
    assert main(["merge", str(CLIENT), str(FLEET / "replica1" / "spans.otlp.jsonl"),
                 str(FLEET / "replica1" / "server.log.gz"), "--out", str(out)]) == 0
    assert "matched 16 of 64" in capsys.readouterr().out
    tr = load_trace(out)
    mine = {rid for rid, p in _router_sent().items() if p == _port_of_replica(1)}
    viewed = {rid for rid, ex in zip(tr.ids, tr.request_extra) if "engine_request_id" in ex}
    assert viewed == mine


def test_each_replicas_steps_and_gauges_are_drawn_apart():
    """Issue 52 item 4: both servers' iteration logs and /metrics samples were drawn as one engine's
    (one gauge line zigzagging between two servers)."""
    from core.figures.batch import gauges_figure
    from core.figures.engine import counted_steps_figure
    tr = load_trace(FLEET / "fleet.json.gz")
    steps = counted_steps_figure(tr.steps)
    assert steps.layout.title.text.startswith("Each replica's steps")
    for k in (0, 1):
        mine = tr.steps[tr.steps["replica"] == k]
        drawn = [d for d in steps.data if d.name.startswith(f"r{k} ")]
        assert sum(len(d.x) for d in drawn) == len(mine)
    g = gauges_figure(tr.events_of("gauge"))
    for k in (0, 1):
        run = next(d for d in g.data if d.name == f"running (server r{k})")
        want = [e["running"] for e in tr.events_of("gauge") if e.get("replica") == k and "running" in e]
        assert list(run.y) == want


def test_a_request_on_no_replicas_files_is_on_no_replica(fleet_only):
    """A client request whose id no replica holds finishes on -1 (no replica's), never counted on
    replica 0; a client none of whose requests can be joined is refused."""
    gone = "cmpl-fleet-7-0"
    keep = [j for j, rid in enumerate(fleet_only.ids) if rid != gone]
    tr, r = join_client(_subset(fleet_only, keep), _client(), "client.json")
    assert (r["by_id"], r["unmatched"]) == (63, 1)
    i = tr.ids.index("fleet-7")
    assert tr.finishes.loc[tr.finishes["req"] == i, "replica"].tolist() == [-1]
    assert tr.request_extra[i]["replica"] is None
    rows = summarize(tr, per_request=False)["summary"]["fleet"]["replicas"]
    full = summarize(join_client(fleet_only, _client(), "c")[0], per_request=False)["summary"]["fleet"]["replicas"]
    assert sum(x["requests"] for x in rows) == 63 and sum(x["requests"] for x in full) == 64
    with pytest.raises(TraceError, match="none of its 64 requests could be joined"):
        join_client(_subset(fleet_only, keep[:10]), _client(request_id_prefix=None), "client.json")


def test_the_client_clock_is_placed_inside_the_band_every_pair_allows(merged):
    """Each engine arrival after its client send, each engine first token before the client's."""
    r = merged.meta["fleet"]["client"]
    assert r["uncertainty_ms"] < 5 and "pairs bound it" in r["how"]
    send = merged.requests["arrival_ms"].to_numpy()
    first = merged.tokens.groupby("req")["t_ms"].min()
    for i, ex in enumerate(merged.request_extra):
        assert ex["engine_arrival_ms"] >= send[i] - 1e-6
        assert ex["engine_arrival_ms"] + ex["engine_ttft_ms"] <= first[i] + 1e-6


def test_a_folder_with_our_own_replica_trace_is_a_replica(tmp_path):
    """A folder holding a gpu_runner serve trace (measured: it has requests, but it is a replica's own,
    not a client's file) is that replica."""
    src = DATA / "imports" / "sglang_router" / "cache_aware" / "r0.json.gz"
    (tmp_path / "r0").mkdir()
    (tmp_path / "r0" / "r0.json.gz").write_bytes(src.read_bytes())
    (tmp_path / "r0" / "notes.txt").write_text("how this replica was started\n")
    tr, how = replica_trace(tmp_path / "r0")
    assert tr.ids == load_trace(src).ids and how == "its own trace"


def test_compare_takes_both_sides_over_their_drain_windows(capsys):
    """A joined fleet records its client's own window; compare still sets drain beside drain."""
    assert main(["compare", str(FLEET / "fleet.json.gz"),
                 str(DATA / "imports" / "sglang_router" / "cache_aware" / "fleet.json.gz")]) == 0
    assert "drain window (ms)" in capsys.readouterr().out


def test_a_fleets_cached_blocks_count_each_replicas_cache_apart():
    """The same block hash on two replicas is two cached blocks; a clear empties its own replica's."""
    import pandas as pd

    from core.analysis.kv_events import cached_blocks
    rows = pd.DataFrame({"t_ms": [0.0, 1.0, 2.0, 3.0, 4.0, 5.0],
                         "op": ["stored", "stored", "stored", "cleared", "removed", "stored"],
                         "hash": ["a", "a", "b", None, "b", "c"], "replica": [0, 1, 0, 1, 0, 1]})
    _, n = cached_blocks(rows)
    assert n.tolist() == [1, 2, 3, 2, 1, 2]     # by hand: {0a} {0a,1a} {0a,1a,0b} {0a,0b} {0a} {0a,1c}
