"""Speculative sampling (Leviathan et al. 2023; Chen et al. 2023) as probability mass.

A draft proposes x ~ q; the target has p. Accept x with probability min(1, p(x)/q(x)); on
rejection sample from the residual normalize(max(p - q, 0)). Accepted mass is min(p, q);
rejection mass is 1 - sum min(p, q) = sum max(p - q, 0); the residual returns exactly the
missing p - min(p, q). So the emitted token is distributed as p.
"""
from __future__ import annotations

import json
import math

import numpy as np

from core.errors import ConfigError, InputError

TOL = 1e-9


def _dist(x, name) -> np.ndarray:
    a = np.asarray(x, dtype=float)
    if a.ndim != 1 or len(a) < 1:
        raise ConfigError(f"{name}: expected a non-empty list of probabilities")
    if not np.all(np.isfinite(a)) or (a < 0).any():
        raise ConfigError(f"{name}: probabilities must be finite and >= 0")
    if abs(a.sum() - 1.0) > 1e-6:
        raise ConfigError(f"{name}: probabilities must sum to 1 (they sum to {a.sum():.6g})")
    return a


def _pair(p, q):
    p, q = _dist(p, "p"), _dist(q, "q")
    if p.shape != q.shape:
        raise ConfigError(f"p and q must have the same length ({len(p)} vs {len(q)})")
    return p, q


def _missing(v) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v)) or v == ""


def candidates(names: list, p: list, q: list, max_candidates: int = 8) -> tuple[list[str], np.ndarray, np.ndarray]:
    """An edited candidate table as (names, p, q): rows with every cell empty are dropped, an
    unnamed candidate is called "#<row>", and p and q must be distributions over 2 to
    `max_candidates` candidates. Errors name the row and column."""
    rows = [(n, x, y) for n, x, y in zip(names, p, q) if not (_missing(n) and _missing(x) and _missing(y))]
    if not 2 <= len(rows) <= max_candidates:
        raise ConfigError(f"table: expected 2 to {max_candidates} candidates, got {len(rows)}")
    out = {"p": [], "q": []}
    for i, (_, x, y) in enumerate(rows):
        for col, v in (("p", x), ("q", y)):
            if _missing(v):
                raise ConfigError(f"column {col}, row {i + 1}: every candidate needs a probability")
            try:
                out[col].append(float(v))
            except (TypeError, ValueError):
                raise ConfigError(f"column {col}, row {i + 1}: {v!r} is not a number") from None
    labels = [n if isinstance(n, str) and n else f"#{i + 1}" for i, (n, _, _) in enumerate(rows)]
    p_arr, q_arr = _pair(out["p"], out["q"])
    return labels, p_arr, q_arr


def acceptance(p, q) -> list[float]:
    """min(1, p/q) per candidate (1 where q = 0: never proposed, never rejected)."""
    p, q = _pair(p, q)
    with np.errstate(divide="ignore", invalid="ignore"):
        a = np.where(q > 0, np.minimum(1.0, p / np.where(q > 0, q, 1.0)), 1.0)
    return a.tolist()


def accepted_mass(p, q) -> list[float]:
    p, q = _pair(p, q)
    return np.minimum(p, q).tolist()


def rejection_mass(p, q) -> float:
    p, q = _pair(p, q)
    return float(max(0.0, 1.0 - np.minimum(p, q).sum()))


def residual(p, q) -> list[float]:
    """normalize(max(p - q, 0)); all zeros when p == q (then rejection never happens)."""
    p, q = _pair(p, q)
    r = np.maximum(p - q, 0.0)
    s = r.sum()
    if s <= TOL:
        return [0.0] * len(p)
    return (r / s).tolist()


def final_distribution(p, q) -> list[float]:
    """Distribution of the emitted token: accepted mass + rejection mass x residual (= p)."""
    p, q = _pair(p, q)
    return (np.minimum(p, q) + rejection_mass(p, q) * np.asarray(residual(p, q))).tolist()


def wrong_final_distribution(p, q) -> list[float]:
    """The WRONG rule: on rejection resample from p itself (not the residual)."""
    p, q = _pair(p, q)
    return (np.minimum(p, q) + rejection_mass(p, q) * p).tolist()


def wrong_rule_error(p, q) -> float:
    """Largest |wrong rule's probability - p| over the candidates."""
    p, q = _pair(p, q)
    return float(np.abs(np.asarray(wrong_final_distribution(p, q)) - p).max())


def alpha(p, q) -> float:
    """Acceptance rate of one proposal: sum min(p, q)."""
    p, q = _pair(p, q)
    return float(np.minimum(p, q).sum())


def monte_carlo(p, q, draws: int, seed: int = 0, wrong: bool = False) -> dict:
    """Empirical distribution of the emitted token over `draws` seeded draws, vectorised.
    Returns counts, frequencies, acceptance rate and a 99% normal band per candidate."""
    p, q = _pair(p, q)
    if isinstance(draws, bool) or not isinstance(draws, int) or draws < 1:
        raise ConfigError(f"draws: expected a positive integer, got {draws!r}")
    rng = np.random.default_rng(seed)
    n = len(p)
    x = rng.choice(n, size=draws, p=q)
    u = rng.random(draws)
    acc = np.asarray(acceptance(p, q))[x]
    accepted = u < acc
    r = p if wrong else np.asarray(residual(p, q))
    if r.sum() > 0:
        resampled = rng.choice(n, size=draws, p=r / r.sum())
    else:
        resampled = x
    out = np.where(accepted, x, resampled)
    counts = np.bincount(out, minlength=n)
    freq = counts / draws
    target = np.asarray(final_distribution(p, q))
    half = 2.576 * np.sqrt(target * (1 - target) / draws)
    return {"counts": counts.tolist(), "freq": freq.tolist(), "accept_rate": float(accepted.mean()),
            "band_lo": (target - half).tolist(), "band_hi": (target + half).tolist(), "draws": draws}


def expected_tokens(alpha: float, gamma: int) -> float:
    """Expected tokens emitted per target verification with gamma proposals and i.i.d.
    acceptance alpha: (1 - alpha^(gamma+1)) / (1 - alpha); gamma + 1 when alpha = 1."""
    if not (0.0 <= alpha <= 1.0):
        raise ConfigError(f"alpha: expected a number in [0, 1], got {alpha!r}")
    if isinstance(gamma, bool) or not isinstance(gamma, int) or gamma < 0:
        raise ConfigError(f"gamma: expected an integer >= 0, got {gamma!r}")
    if alpha >= 1.0 - 1e-12:
        return float(gamma + 1)
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def speedup(alpha: float, gamma: int, draft_cost: float, verify_cost: float = 1.0) -> float:
    """Tokens per unit time relative to plain decoding. One plain decode step costs 1 (a
    target step). One speculative round costs gamma x draft_cost (each draft step, as a
    fraction of a target step) + verify_cost (the target verifying gamma + 1 positions,
    as a multiple of a decode step) and yields expected_tokens(alpha, gamma)."""
    if draft_cost < 0 or verify_cost <= 0:
        raise ConfigError("draft_cost must be >= 0 and verify_cost > 0")
    return expected_tokens(alpha, gamma) / (gamma * draft_cost + verify_cost)


def break_even_draft_cost(alpha: float, gamma: int, verify_cost: float = 1.0) -> float:
    """Largest draft cost (per draft step, in target steps) at which speculation still
    does not lose: gamma x c + verify = expected tokens."""
    if gamma == 0:
        return math.inf
    return max(0.0, (expected_tokens(alpha, gamma) - verify_cost) / gamma)


def acceptance_by_position(spec_events: list[dict]) -> tuple[list[int], list[float], list[int]]:
    """From a trace's `spec` events: acceptance rate at each draft position (a position is
    reached only if every earlier one was accepted). Returns (positions, rates, counts)."""
    reached: dict[int, int] = {}
    accepted: dict[int, int] = {}
    for e in spec_events:
        for i, pos in enumerate(e.get("positions") or []):
            reached[i] = reached.get(i, 0) + 1
            if pos.get("accepted"):
                accepted[i] = accepted.get(i, 0) + 1
            else:
                break
    positions = sorted(reached)
    return positions, [accepted.get(i, 0) / reached[i] for i in positions], [reached[i] for i in positions]


MAX_LINK_CANDIDATES = 32


def table_to_link(names: list[str], p: list[float], q: list[float]) -> str:
    """An edited p/q table as one compact URL parameter value (JSON rows [name, p, q])."""
    return json.dumps([[str(n), float(a), float(b)] for n, a, b in zip(names, p, q)], separators=(",", ":"))


def table_from_link(text: str) -> tuple[list[str], list[float], list[float]]:
    """The inverse of table_to_link, checked: InputError names what is wrong."""
    try:
        rows = json.loads(text)
    except ValueError:
        raise InputError("the link's p/q table: not valid JSON") from None
    if (not isinstance(rows, list) or not 1 <= len(rows) <= MAX_LINK_CANDIDATES
            or not all(isinstance(r, list) and len(r) == 3 for r in rows)):
        raise InputError(f"the link's p/q table: expected 1 to {MAX_LINK_CANDIDATES} rows [name, p, q]")
    names = [str(r[0])[:80] for r in rows]
    try:
        p = [float(r[1]) for r in rows]
        q = [float(r[2]) for r in rows]
    except (TypeError, ValueError):
        raise InputError("the link's p/q table: p and q must be numbers") from None
    return names, p, q
