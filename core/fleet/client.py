"""A benchmark client's file joined onto a measured fleet's trace (`fleet-merge ... --client FILE`).

The fleet trace (core.fleet.merge) knows each request as its replica saw it: the engine's request
id, arrival and tokens, and which replica holds it. The client knows what it sent and received.
The join decides each client request's engine request, hence its replica:

- **by id**: the id the client sent (X-Request-Id; a router such as sglang-router passes it on, and
  vLLM builds its request id from it: `cmpl-<id>-0`, `chatcmpl-<id>`, with a random suffix in some
  versions; a replica's id the fleet merge renamed `r<k>/<id>`). A client id matches an engine id
  when the engine id, with those decorations taken off one by one, equals it; `fleet-1` never
  matches `cmpl-fleet-10-0`. When any id matches, the ids decide alone: a client request whose id
  no replica holds stays unmatched (never paired by time), and an id held by two replicas (a
  router's retry) is counted, paired with the copy that finished.
- **by time**, only when no id matches (a client that sends none, or ids the servers did not keep):
  in order of arrival (core.trace.imports.otlp's pairing), and the report counts the ambiguous
  pairs: neighbours in that order whose sends are closer than the clocks' uncertainty. A client
  none of whose requests can be joined is refused.

The joined trace is the client's (its arrivals, tokens and finishes: what a user measured), each
token and finish on the replica its engine request ran on, each request carrying the engine's view
of it (engine_request_id, engine_arrival_ms, engine_ttft_ms, ...), with the fleet's steps, KV
events, gauges and route events moved onto the client's clock (both epoch clocks: their origins'
difference; else the band every pair allows: engine arrival after the send, engine first token
before the client's; a request on no replica's files finishes on replica -1, its extra's replica
None).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from core.errors import TraceError
from core.trace.imports import otlp
from core.trace.imports.imported import epoch_offset
from core.trace.imports.merge import move_origin
from core.trace.imports.otlp import id_forms
from core.trace.model import Trace


def pair_by_id(client: Trace, fleet: Trace) -> tuple[list[tuple[int, int]], dict]:
    """(client row, fleet row) pairs by the ids the client sent, and counts: {by_id, unmatched,
    twice (ids held by more than one fleet request)}."""
    index: dict[str, list[int]] = {}
    for j, rid in enumerate(fleet.ids):
        for form in id_forms(str(rid)):
            index.setdefault(form, []).append(j)
    done = _finished_rows(fleet)
    pairs, unmatched, twice, used = [], 0, 0, set()
    for i, cid in enumerate(client.ids):
        js = [j for j in index.get(str(cid), ()) if j not in used]
        if not js:
            unmatched += 1
            continue
        if len(js) > 1:
            twice += 1
            js.sort(key=lambda j: (j not in done, j))
        used.add(js[0])
        pairs.append((i, js[0]))
    return pairs, {"by_id": len(pairs), "unmatched": unmatched, "twice": twice}


def _finished_rows(tr: Trace) -> set[int]:
    f = tr.finishes
    if not len(f):
        return set()
    ok = ~f["reason"].isin(["error", "abort"])
    return set(f.loc[ok, "req"].tolist())


def _ambiguous(client: Trace, pairs, unc_ms: float) -> int:
    """Pairs made by time whose client send is within the uncertainty of its neighbour's in order."""
    a = np.sort(client.requests["arrival_ms"].to_numpy(dtype=float)[[i for i, _ in pairs]])
    return int((np.diff(a) <= max(unc_ms, 1e-9)).sum()) if len(a) > 1 else 0


def _offset(client: Trace, fleet: Trace, pairs) -> tuple[float, float, str]:
    """ms added to the fleet's times to put them on the client's clock, its uncertainty, how."""
    cc, fc = client.meta.get("clock") or {}, fleet.meta.get("clock") or {}
    if cc.get("kind") == "epoch" and fc.get("kind") == "epoch":
        return epoch_offset(cc, fc)
    return _bounded_offset(client, fleet, pairs)


def _bounded_offset(client: Trace, fleet: Trace, pairs) -> tuple[float, float, str]:
    """Each pair bounds the offset from both sides: the engine received the request after the client
    sent it (offset >= send - engine arrival), and emitted its first token before the client read it
    (offset <= client first token - engine first token). The band's middle, its half width the
    uncertainty; where the pairs leave no band (clocks that drift, a pairing that is wrong), the
    median of send - arrival, its half spread the uncertainty, and the `how` says so."""
    send = client.requests["arrival_ms"].to_numpy(dtype=float)
    arr = fleet.requests["arrival_ms"].to_numpy(dtype=float)
    c_first = client.tokens.groupby("req")["t_ms"].min() if len(client.tokens) else {}
    f_first = fleet.tokens.groupby("req")["t_ms"].min() if len(fleet.tokens) else {}
    lo = max(send[i] - arr[j] for i, j in pairs)
    his = [c_first[i] - f_first[j] for i, j in pairs if i in c_first and j in f_first]
    hi = min(his) if his else None
    if hi is not None and lo <= hi:
        return ((lo + hi) / 2, (hi - lo) / 2, f"{len(pairs)} pairs bound it: each engine arrival after its send "
                f"(>= {lo:.3f} ms), each engine first token before the client's (<= {hi:.3f} ms); the middle")
    off, unc, how = otlp.offset_by_pairs(client, fleet, pairs)
    why = "no first tokens to bound it from above" if hi is None else \
        f"the pairs leave no offset that puts every arrival after its send and every first token before the client's " \
        f"({lo:.3f} > {hi:.3f} ms: clocks that drift, or pairs that are wrong)"
    return off, unc, f"{how} ({why})"


def join_client(fleet: Trace, client: Trace, name: str) -> tuple[Trace, dict]:
    """The client's trace with the fleet's engine-side record on its clock (see the module's
    docstring), and the join's report: {file, by_id, by_time, ambiguous, unmatched, twice,
    engine_only, offset_ms, uncertainty_ms, how}."""
    pairs, report = pair_by_id(client, fleet)
    by_time = 0
    if not pairs:
        pairs = otlp._in_order(client, fleet)
        by_time = len(pairs)
        report["unmatched"] = len(client.ids) - by_time
    if not pairs:
        raise TraceError(f"{name}: none of its {len(client.ids):,} requests could be joined to the fleet's "
                         f"{len(fleet.ids):,}: no id it sent is a replica's, and in order of arrival they fit no one "
                         "run of the fleet's requests (or more than one); is it this fleet's client?")
    off, unc, how = _offset(client, fleet, pairs)
    report.update(file=name, by_time=by_time, ambiguous=_ambiguous(client, pairs, 2 * unc) if by_time else 0,
                  engine_only=len(fleet.ids) - len(pairs), offset_ms=off, uncertainty_ms=unc, how=how)
    return _joined(fleet, client, pairs, off, report), report


def _joined(fleet: Trace, client: Trace, pairs, off: float, report: dict) -> Trace:
    rep_of = _replica_of(fleet)
    to_client = {j: i for i, j in pairs}
    rep = np.full(len(client.requests), -1, dtype=np.int64)
    for i, j in pairs:
        rep[i] = rep_of.get(j, -1)
    out = Trace(meta=_meta(fleet, client, report), requests=client.requests.copy(),
                tokens=_on_replicas(client.tokens, rep, unknown=0),
                finishes=_on_replicas(client.finishes, rep, unknown=-1),
                steps=_moved(fleet.steps, off), batch=_rows_renamed(fleet.batch, to_client),
                kv=_rows_renamed(_moved(fleet.kv, off), to_client), kv_events=_moved(fleet.kv_events, off),
                preempts=_rows_renamed(_moved(fleet.preempts, off), to_client),
                other=_events(fleet, client, pairs, off) + [dict(e) for e in client.other],
                request_extra=[dict(e) for e in client.request_extra] or [{} for _ in client.ids],
                extra=dict(client.extra))
    otlp.attach_spans(out, fleet, pairs, off)
    for i in range(len(client.ids)):   # (None: on no replica's files: its finish is on -1, not on any replica)
        out.request_extra[i]["replica"] = int(rep[i]) if rep[i] >= 0 else None
    moved, before = move_origin(out)
    if moved:
        report.update(origin_moved_ms=moved, events_before=before)
        out.meta["notes"] += (f" The trace's origin is {moved:.3f} ms before the client's first send, at the "
                              f"fleet's earliest event, so that {before:,} event(s) from before the run (servers "
                              "starting, samples before the first request) are kept.")
    return out


def _events(fleet: Trace, client: Trace, pairs, off: float) -> list[dict]:
    """The fleet's own events (gauges, route and transfer records) on the client's clock, a
    request's named by the client's id (those of requests the client did not send: dropped)."""
    fids, cids = fleet.ids, client.ids
    name = {fids[j]: cids[i] for i, j in pairs}
    out = []
    for e in fleet.other:
        e = dict(e)
        if isinstance(e.get("req"), str):
            if e["req"] not in name:
                continue
            e["req"] = name[e["req"]]
        if isinstance(e.get("t_ms"), (int, float)):
            e["t_ms"] += off
        out.append(e)
    return out


def _replica_of(fleet: Trace) -> dict[int, int]:
    """fleet request row -> the replica that served it: where it finished, else where its tokens
    came from."""
    out: dict[int, int] = {}
    for df in (fleet.tokens, fleet.finishes):
        if len(df) and "replica" in df:
            ok = df["req"].to_numpy() >= 0
            out.update(zip(df["req"].to_numpy()[ok].tolist(), df["replica"].to_numpy()[ok].tolist()))
    return {int(k): int(v) for k, v in out.items() if v >= 0}


def _on_replicas(df: pd.DataFrame, rep: np.ndarray, unknown: int) -> pd.DataFrame:
    """A client table (tokens, finishes) with each row on its request's replica; a request found on
    no replica's files on `unknown` (finishes: -1, no replica's; tokens, which name one: 0, and the
    request's extra says replica None)."""
    df = df.copy()
    if len(df):
        r = rep[df["req"].to_numpy()]
        df["replica"] = np.where(r >= 0, r, unknown)
    return df


def _moved(df: pd.DataFrame, off: float) -> pd.DataFrame:
    df = df.copy()
    if len(df) and "t_ms" in df:
        df["t_ms"] = df["t_ms"] + off
    return df


def _rows_renamed(df: pd.DataFrame, to_client: dict[int, int]) -> pd.DataFrame:
    """A fleet table's request rows as the client's (rows of requests the client did not send: dropped)."""
    if not len(df) or "req" not in df:
        return df.copy()
    r = df["req"].to_numpy()
    new = np.array([to_client.get(int(x), -2) if x >= 0 else -1 for x in r], dtype=np.int64)
    keep = new != -2
    out = df[keep].copy()
    out["req"] = new[keep]
    return out.reset_index(drop=True)


def _meta(fleet: Trace, client: Trace, report: dict) -> dict:
    """The client's meta, with the fleet's engine, stats and fleet parts, both sides' provenance (a
    key the client has already: the fleet's as "engine <key>") and the fleet's notes after its own."""
    meta = dict(client.meta)
    for key in ("engine", "model", "stats", "versions", "kv_blocks_drawn"):
        if fleet.meta.get(key) is not None:
            meta[key] = fleet.meta[key]
    prov = dict(client.meta.get("provenance") or {})
    for key, v in (fleet.meta.get("provenance") or {}).items():
        prov.setdefault(key if key not in prov else f"engine {key}", v)
    meta["provenance"] = prov
    meta["fleet"] = {**(fleet.meta.get("fleet") or {}), "client": report}
    meta["label"] = f"{client.label} + {fleet.label}"
    by = (f"{report['by_id']} by the ids the client sent" if report["by_id"] else
          f"{report['by_time']} by time in order of arrival ({report['ambiguous']} ambiguous: sends closer than the "
          "clocks' uncertainty)")
    meta["notes"] = " ".join(x for x in (str(client.meta.get("notes") or ""), str(fleet.meta.get("notes") or ""), (
        f"Joined with the fleet's trace: {len(client.ids)} client requests, {by}; {report['unmatched']} not found on "
        f"any replica; {report['engine_only']} engine requests the client did not send (not in this trace, their "
        f"steps are); the fleet's times moved {report['offset_ms']:+.3f} ms ± {report['uncertainty_ms']:.3f} ms "
        f"({report['how']}).")) if x)
    return meta
