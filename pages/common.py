"""Helpers shared by pages: cached loads and small formatting. No math here (that is core's)."""
from pathlib import Path

import pandas as pd
import streamlit as st

from core.trace import Trace, load_trace

DATA = Path(__file__).resolve().parent.parent / "data"
ORIGIN_COLORS = {"given": "blue", "simulated": "orange", "measured": "green", "imported": "violet"}


@st.cache_resource
def chapter_traces() -> dict[str, Trace]:
    return {name: load_trace(DATA / "traces" / f"chapter31_{name}.json") for name in ("serial", "continuous")}


def origin_badge(trace: Trace) -> str:
    src = trace.meta.get("source", "?")
    extra = ""
    if src == "simulated":
        extra = f" — {trace.meta.get('step_model', {}).get('description', '')}"
    elif src in ("measured", "imported"):
        extra = f" — {trace.meta.get('device', '?')}, {trace.meta.get('engine', {}).get('name', '?')}, " \
                f"{trace.meta.get('created', '?')}"
    return f":{ORIGIN_COLORS.get(src, 'gray')}-badge[{src}]{extra}"


def request_table(summary: dict) -> pd.DataFrame:
    """Per-request metrics for display; a missing TPOT shows as an em dash, never 0."""
    rows = [{"request": r["id"], "arrival ms": r["arrival_ms"], "TTFT ms": r["ttft_ms"],
             "TPOT ms": "—" if r["tpot_ms"] is None else f"{r['tpot_ms']:g}",
             "E2E ms": r["e2e_ms"], "tokens": r["output_tokens"]} for r in summary["requests"]]
    return pd.DataFrame(rows)
