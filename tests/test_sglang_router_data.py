"""The bundled sglang-router runs (data/imports/sglang_router, made by bench/sglang_router.sh; see
its SOURCE.md): facts read from the files themselves, each computed here from more than one of
them. Three witnesses per run: guidellm's benchmarks.json (the client: every request's prompt and
start time), the router's debug log (the worker it sent each request to, in its own order) and
the replicas' own traces r0/r1 (what each replica served), with the fleet trace that
`python -m core fleet-merge` made of r0 and r1. A client request is matched to a replica by its
prompt: the model is byte-level, so a trace's prompt_ids are the prompt's bytes, and guidellm
makes every prompt unique. In the third run (request_ids) every request also carries its own
X-Request-Id, and the id itself links the client, the router's log and the replica's trace."""
import gzip
import json
import re

import pytest

from tests.conftest import ROOT

DATA = ROOT / "data" / "imports" / "sglang_router"
RUNS = ("round_robin", "cache_aware")   # guidellm runs; request_ids: the X-Request-Id run
N = 48              # requests per run (the script's N)
STREAMS = 4         # guidellm's concurrent streams
PREFIX_BYTES = 96   # cache_aware: the shared prefix (tokens = bytes)

pytest.importorskip("core.fleet.merge", reason="`python -m core fleet-merge` is not on this branch yet")


def client(run: str) -> list[dict]:
    """guidellm's successful requests in the order it started them: prompt, start (epoch s)."""
    bench = json.loads((DATA / run / "benchmarks.json").read_text())["benchmarks"]
    assert len(bench) == 1
    reqs = bench[0]["requests"]
    assert not reqs["errored"] and not reqs["incomplete"]
    rows = [{"prompt": json.loads(r["request_args"])["body"]["prompt"],
             "start_s": r["info"]["timings"]["request_start"]} for r in reqs["successful"]]
    return sorted(rows, key=lambda r: r["start_s"])


def replica_prompts(run: str, k: int) -> list[str]:
    trace = json.loads(gzip.decompress((DATA / run / f"r{k}.json.gz").read_bytes()))
    return [bytes(r["prompt_ids"]).decode() for r in trace["requests"]]


def replica_port(run: str, k: int) -> str:
    """The port replica k listened on, from its own startup line."""
    return re.search(r"on http://127\.0\.0\.1:(\d+)", (DATA / run / f"r{k}.log").read_text()).group(1)


def router_sends(run: str) -> list[tuple[str, int]]:
    """(router request id, replica) for each request, in the order the router logged sending it."""
    port_to_k = {replica_port(run, k): k for k in (0, 1)}
    sends = re.findall(r'request_id="([^"]+)"[^\n]*Sending request url=http://127\.0\.0\.1:(\d+)',
                       (DATA / run / "router.log").read_text())
    return [(rid, port_to_k[port]) for rid, port in sends]


def served_by(run: str) -> dict[str, int]:
    """prompt -> the replica whose own trace holds it (each prompt in exactly one)."""
    where: dict[str, int] = {}
    for k in (0, 1):
        for p in replica_prompts(run, k):
            assert p not in where, f"{run}: a prompt is in more than one replica trace"
            where[p] = k
    return where


def fleet(run: str):
    from core.trace import load_trace
    return load_trace(DATA / run / "fleet.json.gz")


@pytest.mark.parametrize("run", RUNS)
def test_every_client_request_is_in_exactly_one_replica_trace(run):
    rows, where = client(run), served_by(run)
    assert len(rows) == N and len({r["prompt"] for r in rows}) == N
    assert sorted(where) == sorted(r["prompt"] for r in rows)


@pytest.mark.parametrize("run", RUNS)
def test_router_log_replica_traces_and_fleet_trace_agree_on_counts(run):
    sends = router_sends(run)
    assert len(sends) == N and len({rid for rid, _ in sends}) == N     # one send per request: no retries
    by_router = [sum(k == j for _, k in sends) for j in (0, 1)]
    by_traces = [len(replica_prompts(run, k)) for k in (0, 1)]
    t = fleet(run)
    fin = t.finishes
    by_fleet = [int((fin["replica"] == k).sum()) for k in (0, 1)]
    assert by_router == by_traces == by_fleet and sum(by_fleet) == N
    assert (fin["reason"] == "length").all() and len(fin) == N
    # the fleet trace's request k is the replica trace's: same prompt on the same replica
    where = served_by(run)
    replica_of_row = dict(zip(fin["req"], fin["replica"]))
    for i, extra in enumerate(t.request_extra):
        assert where[bytes(extra["prompt_ids"]).decode()] == replica_of_row[i]


@pytest.mark.parametrize("run", RUNS)
def test_fleet_clock_follows_the_clients_request_starts(run):
    """fleet-merge's --offsets-ms put both replicas on guidellm's clock (median alignment): every
    arrival is within 50 ms of its client start, and arrival order is nearly client order."""
    rows = client(run)
    start_ms = {r["prompt"]: (r["start_s"] - rows[0]["start_s"]) * 1e3 for r in rows}
    t = fleet(run)
    arrival = t.requests["arrival_ms"].tolist()
    gaps = [arrival[i] - start_ms[bytes(x["prompt_ids"]).decode()] for i, x in enumerate(t.request_extra)]
    assert max(abs(g) for g in gaps) < 50.0


def test_round_robin_alternates_at_the_router_and_splits_evenly():
    sends = router_sends("round_robin")
    order = [k for _, k in sends]
    assert all(a != b for a, b in zip(order, order[1:]))          # 0,1,0,1,... in the router's own order
    counts = [order.count(0), order.count(1)]
    assert abs(counts[0] - counts[1]) <= 1 and counts == [24, 24]
    # in the client's start order too, once the first STREAMS requests (started together) are sent
    where = served_by("round_robin")
    client_order = [where[r["prompt"]] for r in client("round_robin")]
    later = client_order[STREAMS:]
    assert all(a != b for a, b in zip(later, later[1:]))
    assert sorted(client_order[:STREAMS]) == [0, 0, 1, 1]
    # unique prompts: no prefix-cache hits on either replica
    assert (fleet("round_robin").kv["op"] != "hit").all()


def test_cache_aware_keeps_each_shared_prefix_on_one_replica():
    where = served_by("cache_aware")
    groups: dict[str, set[int]] = {}
    for r in client("cache_aware"):
        groups.setdefault(r["prompt"][:PREFIX_BYTES], set()).add(where[r["prompt"]])
    assert len(groups) == 4                                         # guidellm's prefix_count
    assert all(len(replicas) == 1 for replicas in groups.values())  # each prefix stuck to one replica
    assert set().union(*groups.values()) == {0, 1}                  # and both replicas were used
    # so both replicas' prefix caches hit (blocks of 16 tokens: the 96-byte prefix is 6 blocks)
    kv = fleet("cache_aware").kv
    hits = kv[kv["op"] == "hit"].groupby("replica").size().to_dict()
    assert set(hits) == {0, 1} and all(h > 0 and h % 6 == 0 for h in hits.values())


def test_the_router_registered_both_workers_as_the_model_our_server_names():
    for run in RUNS:
        workers = json.loads((DATA / run / "router_workers.json").read_text())["workers"]
        assert sorted(w["url"] for w in workers) == [f"http://127.0.0.1:{replica_port(run, k)}" for k in (0, 1)]
        assert all(w["model_id"] == "tiny" and w["is_healthy"] for w in workers)
        models = json.loads((DATA / run / "router_models.json").read_text())
        assert [m["id"] for m in models["data"]] == ["tiny"]
    # before /server_info: the router named the model "unknown" and guidellm, which took that name
    # from the router's /v1/models, had both requests refused
    before = DATA / "before_fix"
    assert [m["id"] for m in json.loads((before / "router_v1_models.json").read_text())["data"]] == ["unknown"]
    reqs = json.loads((before / "benchmarks.json").read_text())["benchmarks"][0]["requests"]
    assert not reqs["successful"] and len(reqs["errored"]) == 2
    assert all("404" in r["info"]["error"] for r in reqs["errored"])


def test_x_request_id_is_the_same_id_at_the_client_the_router_and_the_replica():
    """request_ids: each request carried its own X-Request-Id; the router logged it as its
    request id and forwarded it, the replica took it as the trace id (and answered cmpl-<id>)."""
    rows = [json.loads(line) for line in (DATA / "request_ids" / "client_requests.jsonl").read_text().splitlines()]
    sent = [r["x_request_id"] for r in rows]
    assert len(sent) == 8 == len(set(sent)) and all(r["status"] == 200 for r in rows)
    assert all(r["response_id"] == f"cmpl-{r['x_request_id']}" == f"cmpl-{r['response_x_request_id']}" for r in rows)
    sends = router_sends("request_ids")
    assert [rid for rid, _ in sends] == sent                    # the router's ids are the client's, in order
    for k in (0, 1):
        trace = json.loads(gzip.decompress((DATA / "request_ids" / f"r{k}.json.gz").read_bytes()))
        assert [r["id"] for r in trace["requests"]] == [rid for rid, j in sends if j == k]
    t = fleet("request_ids")                                     # unique ids: fleet-merge keeps them
    assert sorted(t.ids) == sorted(sent)
    replica_of = dict(zip(t.finishes["req"], t.finishes["replica"]))
    assert [replica_of[t.ids.index(rid)] for rid in sent] == [0, 1] * 4
