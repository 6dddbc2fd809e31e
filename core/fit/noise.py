"""The real engine's own repeat noise: how far two runs of the same workload on the same server
differ, request by request and run by run. It is the floor a prediction is held against: no model
of a run can be expected to come closer to it than another repeat of it does.

Repeats are runs made with the same prompts, output lengths and send times (`vllm bench serve`
with one seed and dataset, run again). Request i of one repeat is paired with request i of the
other: by the index in its id (`cmpl-bench-<run>-<i>-0`), else by arrival order; every pair must
have the same prompt length (else they are not repeats, and the runs are refused).

Defined once here, used by `python -m core fidelity --repeats`, bench/vllm_repeats.py and the
calibration page:

- **per-request floor** of a metric (TTFT, E2E): for each ordered pair of repeats (a, b), the
  median over paired requests of |a_i − b_i| / b_i — b's error had a been its prediction, the
  very formula a prediction's error uses (core.fit.calibrate.summary); the floor is the median
  of those pair medians (its range, min and max, is reported beside it);
- **run-level spread** of a metric: each repeat's median over its requests; the spread is
  max / min − 1 of those medians.

A prediction error is then read as a multiple of the floor (`times_floor`): 1.0 is as close as a
repeat came.
"""
from __future__ import annotations

import hashlib
import itertools
import re

import numpy as np
import pandas as pd

from core.errors import InputError

METRICS = ("ttft_ms", "e2e_ms")
_INDEX = re.compile(r"-(\d+)-0$")        # vllm bench serve: cmpl-bench-<run>-<i>-0


KEYS = {"index": "the index in each request's id", "prompt": "prompt (the repeats send the same prompts, each once)",
        "id": "request id (the repeats send the same ids)", "arrival": "arrival order"}


def _per_request(run, key: str | None = None) -> pd.DataFrame:
    """One run's requests: their pairing key, prompt tokens, and each metric (on the run's clock).
    `key` (KEYS): how requests are keyed; None: the index in a `vllm bench serve` id where every
    request has one, else arrival order."""
    s = _metrics(run)
    ids = s["id"].to_numpy()
    idx = [_INDEX.search(str(i)) for i in ids]
    if key is None:
        key = "index" if all(m is not None for m in idx) and len({int(m.group(1)) for m in idx}) == len(idx) \
            else "arrival"
    if key == "index":
        k = [int(m.group(1)) for m in idx]
    elif key == "prompt":
        prompts = _prompts(run)
        k = [_digest(prompts.get(i)) for i in ids]
    elif key == "id":
        k = [str(i) for i in ids]
    else:
        order = np.argsort(s["arrival_ms"].to_numpy(dtype=float), kind="stable")
        k = np.empty(len(s), dtype=np.int64)
        k[order] = np.arange(len(s))
        k = k.tolist()
    out = pd.DataFrame({"key": k, "id": ids, "prompt_tokens": s["prompt_tokens"].to_numpy(),
                        **{m: s[m].to_numpy(dtype=float) for m in METRICS}})
    out.attrs["how"] = KEYS[key]
    out.attrs["key"] = key
    return out.set_index("key")


def _metrics(run) -> pd.DataFrame:
    """id, arrival, prompt tokens, TTFT and E2E per request of the run (a fleet's too)."""
    from core.analysis.metrics import request_metrics
    m = request_metrics(run.truth)
    prompt = dict(zip(run.truth.ids, run.truth.requests["prompt_tokens"].to_numpy().tolist()))
    return pd.DataFrame({"id": m["id"].to_numpy(), "arrival_ms": m["arrival_ms"].to_numpy(dtype=float),
                         "prompt_tokens": [prompt[i] for i in m["id"]],
                         "ttft_ms": m["ttft_ms"].to_numpy(dtype=float), "e2e_ms": m["e2e_ms"].to_numpy(dtype=float)})


def _digest(ids) -> str:
    return "" if ids is None else hashlib.sha1(np.asarray(ids, dtype=np.int64).tobytes()).hexdigest()[:16]


def _prompts(run) -> dict:
    """Request id -> its prompt token ids (None where the run does not record them)."""
    return {r.id: (tuple(r.prompt_ids) if r.prompt_ids is not None else None) for r in run.truth.workload().requests}


def _by_prompt(runs) -> bool:
    """Every run records every request's prompt ids, each prompt once, and all send the same prompts."""
    sets = []
    for r in runs:
        p = list(_prompts(r).values())
        if not p or any(x is None for x in p) or len(set(p)) != len(p):
            return False
        sets.append(set(p))
    return all(x == sets[0] for x in sets[1:])


def _tables(runs) -> list[pd.DataFrame]:
    """Each run's _per_request, keyed alike: by bench index where every run has it, else by prompt
    where every run sends the same prompts (each once: a server's own ids number its arrivals, not
    the client's requests), else by request id where every run sends the same ids, else by arrival
    order."""
    tables = [_per_request(r) for r in runs]
    if all(t.attrs["key"] == "index" for t in tables):
        return tables
    if _by_prompt(runs):
        return [_per_request(r, "prompt") for r in runs]
    ids = [set(map(str, t["id"])) for t in tables]
    if all(i == ids[0] for i in ids[1:]) and len(ids[0]) == len(tables[0]):
        return [_per_request(r, "id") for r in runs]
    return [_per_request(r, "arrival") for r in runs]


def repeat_floor(runs) -> dict:
    """The repeat noise of two or more repeats of one workload (core.fit.runs.Run each): per
    metric the per-request floor (median, min, max over ordered pairs, and each pair's value), the
    p90 likewise, and the run-level medians and their spread; `paired` requests and how they were
    paired. InputError when fewer than two runs or when they are not repeats of one workload."""
    _check_separate(runs)
    tables = _tables(runs)
    keys = _paired_keys(runs, tables)
    out = {"runs": [r.name for r in runs], "paired": len(keys),
           "unpaired": sum(len(t) for t in tables) - len(keys) * len(tables), "paired_by": tables[0].attrs["how"],
           "key": tables[0].attrs["key"],
           "clock": runs[0].clock,
           "prompts": {str(k): int(v) for k, v in zip(keys, tables[0].loc[keys, "prompt_tokens"].to_numpy())}}
    for m in METRICS:
        out[m] = _metric_floor(runs, [t.loc[keys, m].to_numpy(dtype=float) for t in tables])
    return out


def _check_separate(runs) -> None:
    """InputError unless two or more runs, none given twice."""
    if len(runs) < 2:
        raise InputError(f"repeats: {len(runs)} run given; the repeat floor needs at least two runs of one workload")
    where = [str(r.path.resolve()) for r in runs]
    twice = sorted({w for w in where if where.count(w) > 1})
    if twice:
        raise InputError(f"repeats: {twice[0]} given twice; the floor needs separate runs of one workload")


def _paired_keys(runs, tables: list[pd.DataFrame]) -> list:
    """The keys of the requests every run sent, sorted; InputError when fewer than 3, or when a
    paired request's prompt length differs between the runs (not repeats)."""
    common = set(tables[0].index)
    for t in tables[1:]:
        common &= set(t.index)
    if len(common) < 3:
        raise InputError(f"repeats: {', '.join(r.name for r in runs)} share {len(common)} requests; repeats of one "
                         "workload send the same requests (same dataset, seed and count)")
    keys = sorted(common)
    for r, t in zip(runs[1:], tables[1:]):
        a, b = tables[0].loc[keys, "prompt_tokens"].to_numpy(), t.loc[keys, "prompt_tokens"].to_numpy()
        bad = np.flatnonzero(a != b)
        if len(bad):
            k = keys[int(bad[0])]
            raise InputError(f"repeats: {r.name} is not a repeat of {runs[0].name}: its request {k} has "
                             f"{int(b[bad[0]])} prompt tokens, {runs[0].name}'s {int(a[bad[0]])} "
                             f"({len(bad)} of {len(keys)} requests differ)")
    return keys


def _metric_floor(runs, vals: list[np.ndarray]) -> dict:
    """One metric's floor from each run's paired values: per ordered pair and over the pairs, and
    the run-level medians and their spread."""
    pairs, p50s, p90s = [], [], []
    for i, j in itertools.permutations(range(len(runs)), 2):
        a, b = vals[i], vals[j]
        ok = np.isfinite(a) & np.isfinite(b) & (b > 0)
        e = np.abs(a[ok] - b[ok]) / b[ok]
        if not len(e):
            continue
        p50s.append(float(np.median(e)))
        p90s.append(float(np.percentile(e, 90)))
        pairs.append({"as_prediction": runs[i].name, "of": runs[j].name, "p50": p50s[-1], "p90": p90s[-1]})
    medians = [float(np.nanmedian(v)) for v in vals]
    return {"p50": float(np.median(p50s)) if p50s else None,
            "p50_min": min(p50s) if p50s else None, "p50_max": max(p50s) if p50s else None,
            "p90": float(np.median(p90s)) if p90s else None, "pairs": pairs,
            "run_medians": medians,
            "run_spread": (max(medians) / min(medians) - 1.0) if medians and min(medians) > 0 else None}


def request_floor(run, others) -> dict:
    """Per request of `run`: the median over `others` (its repeats) of |theirs - its| / its, TTFT
    and E2E: how far a repeat came from this very request, the per-request floor beside its
    prediction error. {id: {metric: ratio}} for the requests paired in every repeat."""
    mine, *tables = _tables([run, *others])
    out = {}
    for key in mine.index:
        if not all(key in t.index for t in tables):
            continue
        row = {}
        for m in METRICS:
            x = float(mine.loc[key, m])
            d = [abs(float(t.loc[key, m]) - x) / x for t in tables if x > 0 and np.isfinite(t.loc[key, m])]
            row[m] = float(np.median(d)) if d else None
        out[mine.loc[key, "id"]] = row
    return out


def same_workload(run, floor: dict) -> bool:
    """Whether `run` sends the workload the floor's repeats sent: the same requests (by the floor's
    pairing) with the same prompt lengths."""
    t = _per_request(run, floor.get("key"))
    have = {str(k): int(v) for k, v in t["prompt_tokens"].items()}
    want = floor.get("prompts") or {}
    return bool(want) and len(have) == len(want) and all(have.get(str(k)) == v for k, v in want.items())


def times_floor(error: float | None, floor: dict | None, metric: str) -> float | None:
    """A per-request median error as a multiple of the repeat floor's (None where either is unknown)."""
    f = (floor or {}).get(metric, {}).get("p50")
    if error is None or not f:
        return None
    return float(error) / f


def describe(floor: dict) -> str:
    """The floor in one line (the CLI's and the page's words)."""
    t, e = floor["ttft_ms"], floor["e2e_ms"]
    return (f"repeat floor of {floor['runs'][0]} over {len(floor['runs'])} repeats ({floor['paired']} requests "
            f"paired by {floor['paired_by']}): per-request median |difference| TTFT {_pct(t['p50'])} "
            f"({_pct(t['p50_min'])}–{_pct(t['p50_max'])}), E2E {_pct(e['p50'])} ({_pct(e['p50_min'])}–"
            f"{_pct(e['p50_max'])}); run medians spread TTFT {_pct(t['run_spread'])}, E2E {_pct(e['run_spread'])}")


def _pct(x) -> str:
    return "-" if x is None else f"{x:.1%}"
