"""The expression layer every metric is written in once (core.analysis.definitions), and its two
evaluators: numpy over a trace in memory, SQL (DuckDB) over Parquet files larger than memory.

An expression is a small tree: columns of a relation (`Col`), values given at evaluation time
(`Param`: a window's start), literals, arithmetic, comparisons, `Where` (a value only where a
condition holds), `Clip`, `IsNull`, `In`. `Agg` reduces one relation (count, sum, mean, min,
max, all) over the rows a condition selects; `ByRequest` groups another relation's rows by
request (the per-request columns: first and last token, tokens emitted, the last finish).

Missing values are NaN in numpy and NULL in SQL, and mean the same: a comparison with a missing
value is false (SQL: coalesce(..., false)), arithmetic with one is missing, `Where` gives a
missing value where its condition fails, and an aggregate skips the rows its `where` leaves out
(write the condition; neither side drops missing values by itself).
"""
from __future__ import annotations

import operator
from abc import ABC, abstractmethod

import numpy as np

_NP_OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv,
           "<=": operator.le, "<": operator.lt, ">=": operator.ge, ">": operator.gt, "=": operator.eq}


class Expr(ABC):
    """An expression over one relation's columns (see the module docstring)."""

    @abstractmethod
    def np(self, env: dict):
        """The values, numpy (env: the relation's columns and the params)."""

    @abstractmethod
    def sql(self, params: dict, defs: dict | None = None) -> str:
        """The SQL text (defs: columns to inline by their definitions)."""

    def __add__(self, o): return Bin("+", self, lift(o))
    def __radd__(self, o): return Bin("+", lift(o), self)
    def __sub__(self, o): return Bin("-", self, lift(o))
    def __rsub__(self, o): return Bin("-", lift(o), self)
    def __mul__(self, o): return Bin("*", self, lift(o))
    def __rmul__(self, o): return Bin("*", lift(o), self)
    def __truediv__(self, o): return Bin("/", self, lift(o))
    def __rtruediv__(self, o): return Bin("/", lift(o), self)
    def __le__(self, o): return Cmp("<=", self, lift(o))
    def __lt__(self, o): return Cmp("<", self, lift(o))
    def __ge__(self, o): return Cmp(">=", self, lift(o))
    def __gt__(self, o): return Cmp(">", self, lift(o))
    def __and__(self, o): return Logic("AND", self, lift(o))
    def __or__(self, o): return Logic("OR", self, lift(o))
    def __invert__(self): return Not(self)

    def eq(self, o) -> Expr:        # (== stays identity: expressions are dict keys and set members)
        return Cmp("=", self, lift(o))

    __hash__ = object.__hash__


def lift(x) -> Expr:
    return x if isinstance(x, Expr) else Lit(x)


class Col(Expr):
    def __init__(self, name: str):
        self.name = name

    def np(self, env):
        return env[self.name]

    def sql(self, params, defs=None):
        return f"({defs[self.name]})" if defs and self.name in defs else self.name


class Param(Expr):
    """A number given when the expression is evaluated (a window's bounds, an SLO's bound)."""

    def __init__(self, name: str):
        self.name = name

    def np(self, env):
        return env[self.name]

    def sql(self, params, defs=None):
        return repr(float(params[self.name]))


class Lit(Expr):
    def __init__(self, value):
        self.value = value

    def np(self, env):
        return self.value

    def sql(self, params, defs=None):
        v = self.value
        if isinstance(v, str):
            return "'" + v.replace("'", "''") + "'"
        if isinstance(v, bool):
            return "true" if v else "false"
        return repr(v)


class Bin(Expr):
    def __init__(self, op, a, b):
        self.op, self.a, self.b = op, a, b

    def np(self, env):
        with np.errstate(all="ignore"):
            return _NP_OPS[self.op](self.a.np(env), self.b.np(env))

    def sql(self, params, defs=None):
        return f"({self.a.sql(params, defs)} {self.op} {self.b.sql(params, defs)})"


class Cmp(Bin):
    """A comparison: false where either side is missing."""

    def sql(self, params, defs=None):
        return f"coalesce({self.a.sql(params, defs)} {self.op} {self.b.sql(params, defs)}, false)"


class Logic(Expr):
    def __init__(self, op, a, b):
        self.op, self.a, self.b = op, a, b

    def np(self, env):
        return (np.logical_and if self.op == "AND" else np.logical_or)(self.a.np(env), self.b.np(env))

    def sql(self, params, defs=None):
        return f"({self.a.sql(params, defs)} {self.op} {self.b.sql(params, defs)})"


class Not(Expr):
    def __init__(self, a):
        self.a = a

    def np(self, env):
        return np.logical_not(self.a.np(env))

    def sql(self, params, defs=None):
        return f"(NOT {self.a.sql(params, defs)})"


class IsNull(Expr):
    """Missing: NaN (a number) or None (a text), NULL in SQL."""

    def __init__(self, a, text: bool = False):
        self.a, self.text = a, text

    def np(self, env):
        v = self.a.np(env)
        if self.text:
            import pandas as pd
            return np.asarray(pd.isna(np.asarray(v, dtype=object)), dtype=bool)
        return np.isnan(np.asarray(v, dtype=float))

    def sql(self, params, defs=None):
        x = self.a.sql(params, defs)
        return f"({x} IS NULL)" if self.text else f"({x} IS NULL OR isnan({x}))"


class In(Expr):
    """A text among `values` (false where missing)."""

    def __init__(self, a, values: tuple):
        self.a, self.values = a, tuple(values)

    def np(self, env):
        v = np.asarray(self.a.np(env), dtype=object)
        if len(v) < 4096:       # a few values: compared one by one (cheaper than building a hash table)
            out = np.zeros(len(v), dtype=bool)
            for x in self.values:
                out |= v == x
            return out
        import pandas as pd  # (a hash table: numpy's isin sorts object arrays, ~10x slower)
        return pd.Series(v, dtype=object, copy=False).isin(self.values).to_numpy()

    def sql(self, params, defs=None):
        vals = ", ".join(Lit(x).sql(params) for x in self.values)
        return f"coalesce({self.a.sql(params, defs)} IN ({vals}), false)"


class OfRequest(Expr):
    """`a`, an expression over the request relation's columns, for each row of a relation joined to
    its request (token_request): numpy evaluates it once per request and takes each row's; SQL reads
    the joined columns."""

    def __init__(self, a):
        self.a = a

    def np(self, env):
        return np.asarray(self.a.np(env["__request__"]))[env["req"]]

    def sql(self, params, defs=None):
        return self.a.sql(params, defs)


class Where(Expr):
    """`then` where `cond` holds, missing elsewhere."""

    def __init__(self, cond, then):
        self.cond, self.then = cond, lift(then)

    def np(self, env):
        with np.errstate(all="ignore"):
            return np.where(self.cond.np(env), self.then.np(env), np.nan)

    def sql(self, params, defs=None):
        return f"(CASE WHEN {self.cond.sql(params, defs)} THEN {self.then.sql(params, defs)} END)"


class If(Expr):
    """`a` where `cond` holds, `b` elsewhere."""

    def __init__(self, cond, a, b):
        self.cond, self.a, self.b = cond, lift(a), lift(b)

    def np(self, env):
        return np.where(self.cond.np(env), self.a.np(env), self.b.np(env))

    def sql(self, params, defs=None):
        return (f"(CASE WHEN {self.cond.sql(params, defs)} THEN {self.a.sql(params, defs)} "
                f"ELSE {self.b.sql(params, defs)} END)")


class Clip(Expr):
    """x limited to [lo, hi] (either may be None: no limit that side)."""

    def __init__(self, a, lo=None, hi=None):
        self.a = a
        self.lo, self.hi = (None if lo is None else lift(lo)), (None if hi is None else lift(hi))

    def np(self, env):
        return np.clip(self.a.np(env), None if self.lo is None else self.lo.np(env),
                       None if self.hi is None else self.hi.np(env))

    def sql(self, params, defs=None):
        x = self.a.sql(params, defs)
        if self.lo is not None:
            x = f"greatest({x}, {self.lo.sql(params, defs)})"
        if self.hi is not None:
            x = f"least({x}, {self.hi.sql(params, defs)})"
        return x


class Least(Expr):
    def __init__(self, a, b):
        self.a, self.b = lift(a), lift(b)

    def np(self, env):
        return np.minimum(self.a.np(env), self.b.np(env))

    def sql(self, params, defs=None):
        return f"least({self.a.sql(params, defs)}, {self.b.sql(params, defs)})"


class Greatest(Least):
    def np(self, env):
        return np.maximum(self.a.np(env), self.b.np(env))

    def sql(self, params, defs=None):
        return f"greatest({self.a.sql(params, defs)}, {self.b.sql(params, defs)})"


# ---- reductions -------------------------------------------------------------------------------

_SQL_AGG = {"count": "count", "sum": "sum", "fsum": "fsum", "mean": "avg", "min": "min", "max": "max",
            "all": "bool_and", "any": "bool_or"}


class Agg:
    """One number from a relation: `fn` (count, sum, mean, min, max, all, any) of `x` over the rows
    where `where` holds (all rows without it). Empty: count 0, sum 0, the others missing (None).
    `fsum`: a float sum, compensated in SQL (so it does not depend on how threads split it)."""

    def __init__(self, fn: str, x: Expr | None = None, where: Expr | None = None):
        assert fn in _SQL_AGG, fn
        self.fn, self.x, self.where = fn, x, where

    def np(self, env: dict, n: int):
        mask = None if self.where is None else np.asarray(self.where.np(env), dtype=bool)
        if self.fn == "count":
            return n if mask is None else int(np.count_nonzero(mask))
        v = np.asarray(self.x.np(env))
        if v.ndim == 0:
            v = np.full(n, v)
        if mask is not None:
            v = v[mask]
        if self.fn in ("sum", "fsum"):
            s = v.sum()
            return int(s) if v.dtype.kind in "iub" else float(s)
        if not len(v):
            return None
        if self.fn == "mean":
            return float(v.mean())
        if self.fn in ("all", "any"):
            return bool(v.all() if self.fn == "all" else v.any())
        x = v.min() if self.fn == "min" else v.max()
        return int(x) if v.dtype.kind in "iu" else float(x)

    def sql(self, params: dict, defs=None) -> str:
        arg = "*" if self.fn == "count" else self.x.sql(params, defs)
        f = f" FILTER (WHERE {self.where.sql(params, defs)})" if self.where is not None else ""
        out = f"{_SQL_AGG[self.fn]}({arg}){f}"
        return f"coalesce({out}, 0)" if self.fn in ("sum", "fsum") else out


class ByRequest:
    """One value per request from the rows of relation `rel` (token, finish) with that request:
    min / max of a column, the count of rows, or the column's value in the last row (trace order).
    Missing for a request without rows (count: 0)."""

    def __init__(self, fn: str, rel: str, col: str | None = None):
        assert fn in ("min", "max", "count", "last"), fn
        self.fn, self.rel, self.col = fn, rel, col

    def per_request(self, req: np.ndarray, values, n: int, count: np.ndarray | None = None):
        """numpy: the per-request column from a relation's `req` and `values` arrays (`count`: the
        relation's rows per request, when the caller has them)."""
        if count is None:
            count = np.bincount(req, minlength=n).astype(np.int64) if len(req) else np.zeros(n, dtype=np.int64)
        if self.fn == "count":
            return count
        if self.fn == "last":
            kind = getattr(values, "dtype", np.dtype(object)).kind
            out = np.full(n, np.nan) if kind == "f" else np.full(n, None, dtype=object)
            out[req] = values           # the last row of a request wins
            return out
        out = np.full(n, np.inf if self.fn == "min" else -np.inf)
        (np.minimum if self.fn == "min" else np.maximum).at(out, req, values)
        out[count == 0] = np.nan
        return out

    def sql_agg(self) -> str:
        """SQL over the relation's rows grouped by req (rowkey: trace order)."""
        if self.fn == "count":
            return "count(*)"
        if self.fn == "last":
            return f"arg_max({self.col}, rowkey)"
        return f"{self.fn}({self.col})"


def request_columns_np(defs: dict, base: dict, rows: dict, n: int, given: dict | None = None) -> dict:
    """numpy: the request relation's columns: `base` (the requests' own columns), then each of
    `defs` in order (ByRequest from `rows[rel]` = {"req", column...}; expressions over the columns
    before them). `given`: columns computed elsewhere (taken as they are)."""
    env = dict(base)
    counts: dict[str, np.ndarray] = {}
    for name, e in defs.items():
        if given and name in given:
            env[name] = given[name]
        elif isinstance(e, ByRequest):
            r = rows[e.rel]
            if e.rel not in counts:
                counts[e.rel] = ByRequest("count", e.rel).per_request(r["req"], None, n)
            env[name] = e.per_request(r["req"], None if e.col is None else r[e.col], n, counts[e.rel])
        else:
            env[name] = e.np(env)
    return env


def request_columns_sql(defs: dict, base: str, rels: dict) -> str:
    """SQL: SELECT of the request relation: `base` (a table with i and the requests' own columns)
    joined to each relation's per-request aggregates, then the expressions (inlined in order)."""
    groups: dict[str, list[tuple[str, ByRequest]]] = {}
    for name, e in defs.items():
        if isinstance(e, ByRequest):
            groups.setdefault(e.rel, []).append((name, e))
    joins, inline = [], {}
    for k, (rel, cols) in enumerate(groups.items()):
        sel = ", ".join(f"{e.sql_agg()} AS {name}" for name, e in cols)
        joins.append(f"LEFT JOIN (SELECT req AS i, {sel} FROM {rels[rel]} GROUP BY req) g{k} USING (i)")
        for name, e in cols:
            inline[name] = f"coalesce(g{k}.{name}, 0)" if e.fn == "count" else f"g{k}.{name}"
    cols = []
    for name, e in defs.items():
        if not isinstance(e, ByRequest):
            inline[name] = e.sql({}, inline)
        cols.append(f"{inline[name]} AS {name}")
    return f"SELECT b.*, {', '.join(cols)} FROM {base} b " + " ".join(joins)
