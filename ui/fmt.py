"""Display formatting: origin badges, trace details, user text made inert in markdown, numbers."""
import math
import re

import pandas as pd

from core.trace import Trace

ORIGIN_COLORS = {"given": "blue", "simulated": "orange", "measured": "green", "imported": "violet"}


_MD_SPECIAL = re.compile(r"([\\`*_\[\]<>:~$|#&])")  # links/images, HTML, emphasis, colors, emoji, math


def md(text) -> str:
    """User-supplied text (labels, file names, notes, error excerpts) made inert in
    Streamlit markdown: no links, images, HTML, emphasis, colors or emoji shortcodes."""
    return _MD_SPECIAL.sub(r"\\\1", str(text))


def origin_badge(trace: Trace) -> str:
    src = trace.meta.get("source", "?")
    extra = ""
    if src in ("measured", "imported"):
        engine = trace.meta.get("engine", {})
        name = engine.get("name", "?") if isinstance(engine, dict) else str(engine)
        parts = [str(x) for x in (trace.meta.get("device"), name, trace.meta.get("created"))
                 if x and not str(x).startswith(("not recorded", "unknown")) and x != "?"]
        extra = ", ".join(parts)
    color = ORIGIN_COLORS.get(src, "gray")
    # the origin in the badge, its details as text beside it: a badge does not wrap, and a device,
    # engine and date in one ran past a phone's width
    return f":{color}-badge[{md(src)}]" + (f" {md(extra)}" if extra else "")


def trace_details(trace: Trace, notes: bool = True) -> str:
    """Created, device, step model and (with `notes`) notes from the trace's metadata, those present."""
    meta = trace.meta
    step_model = meta.get("step_model")
    details = {"created": meta.get("created"), "device": meta.get("device"),
               "step model": step_model.get("description") if isinstance(step_model, dict) else None,
               "notes": meta.get("notes") if notes else None}
    return " · ".join(f"{k}: {md(v)}" for k, v in details.items() if v)


def fmt_ms(x) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:,.3f}".rstrip("0").rstrip(".")


def ms_metric(name: str, x) -> tuple[str, str]:
    """(label, value) of a time for st.metric: in ms ("TTFT p50 ms", "88.125"), or past 100 s in
    seconds ("TTFT p50 s", "913.2"), so that the value fits its column (a 7-digit ms value was cut)."""
    if x is not None and not (isinstance(x, float) and math.isnan(x)) and abs(x) >= 100_000:
        return f"{name} s", f"{x / 1000:,.1f}"
    return f"{name} ms", fmt_ms(x)


def count_metric(n: int) -> str:
    """A count for st.metric: exact up to 9,999,999, else in millions ("25.67 M")."""
    return f"{n:,}" if abs(n) < 10_000_000 else f"{n / 1e6:,.2f} M"


def request_table(summary: dict) -> pd.DataFrame:
    """Per-request metrics for display; a missing TPOT shows as an em dash, never 0.
    `output_tokens` in a summary is the count emitted."""
    rows = [{"request": r["id"], "arrival ms": r["arrival_ms"], "TTFT ms": r["ttft_ms"],
             "TPOT ms": "—" if r["tpot_ms"] is None else f"{r['tpot_ms']:g}",
             "E2E ms": r["e2e_ms"], "tokens": r["output_tokens"]} for r in summary["requests"]]
    return pd.DataFrame(rows)
