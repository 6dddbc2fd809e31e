"""Step models as data: fit one to a trace's step events, save and load it, and say when a
simulation leaves the range the model was fitted on.

A fit regresses each step's measured duration on its features (core.sim.stepmodel.FEATURES:
a constant, prefill tokens, decoding sequences, attended positions of prefill and of decode
entries, prefill pieces) by non-negative least squares (scipy.optimize.nnls): every
coefficient is a cost, never a saving. "affine" uses the first three features, "features"
all six. A step's entries come from the trace's batch events; an entry's start position (the
tokens already in its request's cache) is the tokens its request computed in earlier steps
since its last preemption, plus the tokens of the prefix-cache blocks it hit (kv "hit"
events x the block size in meta.engine).

A model file is JSON: {"format": "serving-explorer/step-model/1", "step_model": {...options},
"fit": {"trace", "model", "steps", "r2", "residual_ms", "relative_error", "range"}}; `range`
holds each feature's [min, max] over the fitted steps, which `outside_range` checks.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from core.analysis.definitions import STEP_FEATURES
from core.config import from_dict
from core.errors import ConfigError
from core.sim.stepmodel import FEATURE_COEFFICIENTS, FEATURES, StepModel
from core.trace.model import counted_steps_of

FORMAT = "serving-explorer/step-model/1"
MODELS = {"affine": FEATURES[:3], "features": FEATURES}
MIN_STEPS = 8


def entry_start_positions(trace) -> np.ndarray:
    """Per batch row (in the table's order): the tokens already in its request's cache when the
    step began (see the module docstring)."""
    b, st = trace.batch, trace.steps
    n = len(b)
    if not n:
        return np.zeros(0, dtype=np.int64)
    step_t = dict(zip(st["step"].tolist(), st["t_ms"].tolist()))
    req, step, tok = b["req"].to_numpy(), b["step"].to_numpy(), b["tokens"].to_numpy().astype(np.int64)
    t = np.array([step_t.get(int(s), np.nan) for s in step], dtype=float)
    # stay = preemptions of the request at or before the step's start
    stay = np.zeros(n, dtype=np.int64)
    pre = trace.preempts
    pre_of: dict[int, np.ndarray] = {}
    for r, g in pre.groupby("req")["t_ms"] if len(pre) else ():
        pre_of[int(r)] = np.sort(g.to_numpy(dtype=float))
        rows = np.flatnonzero(req == r)
        stay[rows] = np.searchsorted(pre_of[int(r)], t[rows], side="right")
    # tokens computed earlier in the same stay: exclusive cumulative sum in step order
    order = np.lexsort((step, stay, req))
    r_o, s_o, k_o = req[order], stay[order], tok[order]
    first = np.ones(n, dtype=bool)
    first[1:] = (r_o[1:] != r_o[:-1]) | (s_o[1:] != s_o[:-1])
    csum = np.cumsum(k_o) - k_o
    group_start = np.maximum.accumulate(np.where(first, np.arange(n), 0))
    before = csum - csum[group_start]
    out = np.empty(n, dtype=np.int64)
    out[order] = before
    # plus the prefix-cache hits of that stay
    kv = trace.kv
    if len(kv):
        hits = kv[kv["op"] == "hit"]
        if len(hits):
            engine = trace.meta.get("engine") or {}
            bs = int(engine.get("block_size") or 16)
            h_req, h_t = hits["req"].to_numpy(), hits["t_ms"].to_numpy(dtype=float)
            h_stay = np.array([np.searchsorted(pre_of.get(int(r), np.empty(0)), x, side="right")
                               for r, x in zip(h_req, h_t)], dtype=np.int64)
            counts: dict[tuple[int, int], int] = {}
            for key in zip(h_req.tolist(), h_stay.tolist()):
                counts[key] = counts.get(key, 0) + 1
            out += np.array([counts.get((int(r), int(s)), 0) * bs for r, s in zip(req, stay)], dtype=np.int64)
    return out


def counted_steps(trace) -> bool:
    """Steps that carry counts instead of batch entries (an engine's iteration log): prefill
    tokens, prefill and decode requests are known, attended positions are not."""
    return counted_steps_of(trace.steps, bool(len(trace.batch)))



def counted_features(trace) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """trace_features of counted steps: 1, prefill tokens, decoding requests, -, -, prefill
    requests (positions unknown: 0). Steps that did no work are left out."""
    return counted_features_of(trace.steps)


def counted_features_of(st) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """counted_features from the step table alone."""
    X = np.zeros((len(st), len(FEATURES)))
    X[:, 0] = 1.0
    X[:, 1] = st["prefill_tokens"].to_numpy(dtype=float)
    X[:, 2] = st["decode_reqs"].to_numpy(dtype=float)
    X[:, 5] = st["prefill_reqs"].to_numpy(dtype=float)
    has = (X[:, 1] + X[:, 2]) > 0
    return st["step"].to_numpy()[has], X[has], st["dur_ms"].to_numpy(dtype=float)[has]


def trace_features(trace) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(step numbers, features [steps x FEATURES], durations ms) of the trace's steps that
    have batch events (or counts: counted_steps)."""
    st, b = trace.steps, trace.batch
    if counted_steps(trace):
        return counted_features(trace)
    if not len(st) or not len(b):
        return np.zeros(0, dtype=np.int64), np.zeros((0, len(FEATURES))), np.zeros(0)
    entries = {"tokens": b["tokens"].to_numpy(), "start": entry_start_positions(trace).astype(float),
               "kind": np.asarray(b["kind"], dtype=object)}
    steps = st["step"].to_numpy()
    index = {int(s): i for i, s in enumerate(steps)}
    row = np.array([index.get(int(s), -1) for s in b["step"].to_numpy()])
    keep = row >= 0
    S = len(steps)
    X = np.zeros((S, len(FEATURES)))
    X[:, 0] = 1.0
    for col, name in enumerate(FEATURES[1:], 1):    # each feature defined once: definitions.STEP_FEATURES
        w = np.asarray(STEP_FEATURES[name].np(entries), dtype=float)
        X[:, col] = np.bincount(row[keep], weights=w[keep], minlength=S)
    has = np.bincount(row[keep], minlength=S) > 0
    return steps[has], X[has], st["dur_ms"].to_numpy(dtype=float)[has]


def fit(trace, model: str = "features", until_ms: float | None = None) -> tuple[StepModel, dict]:
    """A step model fitted to the trace's step durations (`until_ms`: only the steps that
    start before it) and its fit report."""
    if model not in MODELS:
        raise ConfigError(f"model: expected one of {', '.join(MODELS)}, got {model!r}")
    if model == "features" and counted_steps(trace):
        raise ConfigError("fit: the trace's steps carry counts, not batch entries (an engine's iteration log): the "
                          "attended positions the 'features' model needs are unknown; fit --model affine")
    steps, X, y = trace_features(trace)
    if until_ms is not None:
        keep = step_starts(trace, steps) < until_ms
        steps, X, y = steps[keep], X[keep], y[keep]
    if len(y) < MIN_STEPS:
        raise ConfigError(f"fit: the trace needs step events with batch composition (at least {MIN_STEPS} steps, "
                          f"has {len(y)})")
    full, quality = solve(X, y, model)
    return model_of(model, full), {"trace": trace.label, "model": model, **quality}


def solve(X: np.ndarray, y: np.ndarray, model: str) -> tuple[np.ndarray, dict]:
    """Coefficients (over FEATURES) fitted by non-negative least squares to steps' features X
    and durations y, and the fit's quality: steps, R^2, |residual| and relative error
    percentiles, the fitted range of each feature."""
    full = nnls_coefficients(X, y, model)
    if full[0] <= 0 and full[2] <= 0 and full[4] <= 0:     # a decode-only step must take time
        full[0] = max(float(np.min(y)), 1e-6)
    res = y - X @ full
    ss_tot = float(((y - y.mean()) ** 2).sum())
    rel = np.abs(res) / np.maximum(y, 1e-9)
    return full, {"steps": int(len(y)), "identifiability": identifiability(X, y, model, full),
                  "r2": 1.0 - float((res ** 2).sum()) / ss_tot if ss_tot > 0 else None,
                  "residual_ms": {f"p{q}": float(np.percentile(np.abs(res), q)) for q in (50, 90, 99)},
                  "relative_error": {f"p{q}": float(np.percentile(rel, q)) for q in (50, 90)},
                  "range": feature_range(X)}


def nnls_coefficients(X: np.ndarray, y: np.ndarray, model: str) -> np.ndarray:
    """Non-negative least squares of y on the model's columns of X (columns scaled to unit
    norm for the solver): a full coefficient vector over FEATURES, zero where the model has none."""
    from scipy.optimize import nnls
    cols = [FEATURES.index(f) for f in MODELS[model]]
    A = X[:, cols]
    scale = np.linalg.norm(A, axis=0)
    scale[scale == 0] = 1.0
    coef, _ = nnls(A / scale, y)
    coef = coef / scale
    coef[coef < 1e-9] = 0.0     # solver round-off (4.955e-17 ms per sequence), not a cost: none
    full = np.zeros(len(FEATURES))
    full[cols] = coef
    return full


def identifiability(X: np.ndarray, y: np.ndarray, model: str, coef: np.ndarray) -> dict:
    """What the data could and could not say about each of the model's terms, for a fit
    `coef` (over FEATURES) of y on X: "unseen": terms whose feature is zero in every row (no
    step had any: the fit sets them to 0, the data says nothing); "inseparable": terms whose
    columns are linearly dependent (e.g. every step decodes the same number of sequences, so
    the base cost and the per-sequence cost trade off freely: only their sum at that batch is
    known); "held_at_zero": {term: the unconstrained least-squares value} for terms the
    non-negativity bound set to 0 that unconstrained least squares would make negative (the
    data shows no such cost, within its noise)."""
    cols = [FEATURES.index(f) for f in MODELS[model]]
    A = X[:, cols]
    scale = np.linalg.norm(A, axis=0)
    seen = scale > 0
    names = [FEATURE_COEFFICIENTS[c] for c in cols]
    out = {"unseen": [n for n, ok in zip(names, seen) if not ok], "inseparable": [], "held_at_zero": {}}
    if not seen.any() or len(y) < 2:
        return out
    As = A[:, seen] / scale[seen]
    u, sv, vt = np.linalg.svd(As, full_matrices=False)
    seen_names = [n for n, ok in zip(names, seen) if ok]
    weak = sv < 1e-8 * sv[0]
    for v in vt[weak]:
        out["inseparable"] += [n for n, x in zip(seen_names, v) if abs(x) > 0.1 and n not in out["inseparable"]]
    if not weak.any():
        free = np.linalg.lstsq(As, y, rcond=None)[0] / scale[seen]
        for n, c, ok in zip(seen_names, free, [coef[FEATURE_COEFFICIENTS.index(n)] == 0 for n in seen_names]):
            if ok and c < 0:
                out["held_at_zero"][n] = float(c)
    return out


def describe_identifiability(d: dict, what: str = "steps") -> list[str]:
    """One sentence per finding of identifiability(), for a page or the CLI."""
    word = {"base_ms": "the base cost per step", "prefill_ms_per_token": "the cost per prefill token",
            "decode_ms_per_seq": "the cost per decoding sequence", "prefill_ms_per_kpos": "the cost per attended "
            "prefill position", "decode_ms_per_kpos": "the cost per attended decode position",
            "prefill_ms_per_chunk": "the cost per prefill piece"}
    out = []
    if d.get("unseen"):
        names = ", ".join(word.get(n, n).removeprefix("the cost per ") for n in d["unseen"])
        out.append(f"No {what} had any of {names}: the fit sets that cost to 0 and a prediction that has some "
                   "extrapolates.")
    if d.get("inseparable"):
        out.append(f"The {what} cannot separate {' from '.join(word.get(n, n) for n in d['inseparable'])} (they "
                   "vary together in every row): the split between them is arbitrary and predictions at other "
                   "batches are not determined by this run; fit several runs of different loads together.")
    for n, v in (d.get("held_at_zero") or {}).items():
        out.append(f"{word.get(n, n).capitalize()} is held at 0: unconstrained least squares gives {v:.3g} ms "
                   f"(the {what} show no such cost within their noise).")
    return out


def model_of(model: str, coef: np.ndarray) -> StepModel:
    """The StepModel ("affine" or "features") with these coefficients (over FEATURES)."""
    values = dict(zip(FEATURE_COEFFICIENTS, (float(c) for c in coef)))
    if model == "features":
        return StepModel("features", **values)
    return StepModel("affine", base_ms=values["base_ms"], prefill_ms_per_token=values["prefill_ms_per_token"],
                     decode_ms_per_seq=values["decode_ms_per_seq"])


def step_starts(trace, steps: np.ndarray) -> np.ndarray:
    """Start time (ms) of each of these steps."""
    return trace.steps.set_index("step")["t_ms"].reindex(steps).to_numpy(dtype=float)


def feature_range(X: np.ndarray) -> dict:
    """{feature: [min, max]} over the steps' feature rows (trace_features), the constant left out."""
    return {f: [float(X[:, i].min()), float(X[:, i].max())] for i, f in enumerate(FEATURES) if i}


def outside_range(trace, report: dict) -> dict | None:
    """How a (simulated) trace's steps compare with the range a model was fitted on: None when
    every step is inside it, else {"steps": outside, "of": all, "features": {name: [seen min,
    seen max, fitted min, fitted max]}} for each feature out of range."""
    rng = report.get("range") or {}
    _, X, _ = trace_features(trace)
    if not len(X) or not rng:
        return None
    bad = _out_of_range(X, rng, report.get("model"))
    if not bad.any():
        return None
    feats = {f: [float(X[:, i].min()), float(X[:, i].max()), *rng[f]] for i, f in enumerate(FEATURES)
             if bad[:, i].any()}
    return {"steps": int(bad.any(axis=1).sum()), "of": int(len(X)), "features": feats}


def _out_of_range(X: np.ndarray, rng: dict, model: str | None = None) -> np.ndarray:
    """[steps x FEATURES]: where a step's feature lies outside the fitted [min, max] (only the
    features the `model` uses: an affine model does not read attended positions)."""
    bad = np.zeros(X.shape, dtype=bool)
    used = MODELS.get(model, FEATURES)
    for i, f in enumerate(FEATURES):
        if f in rng and f in used:
            lo, hi = rng[f]
            bad[:, i] = (X[:, i] < lo - 1e-9) | (X[:, i] > hi + 1e-9)
    return bad


def outside_steps(trace, report: dict) -> pd.DataFrame:
    """The trace's steps outside the fitted range: step, start ms, and each feature's value,
    with the features out of range named per step."""
    rng = report.get("range") or {}
    steps, X, _ = trace_features(trace)
    if not len(X) or not rng:
        return pd.DataFrame()
    bad = _out_of_range(X, rng, report.get("model"))
    rows = bad.any(axis=1)
    out = pd.DataFrame({"step": steps[rows], "t_ms": step_starts(trace, steps[rows])})
    for i, f in enumerate(FEATURES):
        if i:
            out[f] = X[rows, i]
    out["outside"] = [", ".join(f for i, f in enumerate(FEATURES) if b[i]) for b in bad[rows]]
    return out


def describe_outside(o: dict) -> str:
    worst = ", ".join(f"{f} {a:g}–{b:g} (fitted {lo:g}–{hi:g})" for f, (a, b, lo, hi) in o["features"].items())
    return f"{o['steps']:,} of {o['of']:,} steps are outside the range the step model was fitted on: {worst}"


def save(path, sm: StepModel, report: dict) -> None:
    doc = {"format": FORMAT, "step_model": sm.to_dict(), "fit": report}
    Path(path).write_text(json.dumps(doc, indent=1, allow_nan=False) + "\n")


def load(path) -> tuple[StepModel, dict]:
    """(step model, fit report or {}) from a model file; ConfigError names what is wrong."""
    try:
        doc = json.loads(Path(path).read_text())
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the step model file ({e.strerror})") from None
    except ValueError:
        raise ConfigError(f"{path}: not a JSON step model file") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("step_model"), dict):
        raise ConfigError(f"{path}: expected a step model file ({{\"format\": \"{FORMAT}\", \"step_model\": ...}})")
    opts = {k: v for k, v in doc["step_model"].items() if k != "description"}
    sm = from_dict(StepModel, opts, f"{path}: step_model")
    fit_report = doc.get("fit") if isinstance(doc.get("fit"), dict) else {}
    return sm, fit_report
