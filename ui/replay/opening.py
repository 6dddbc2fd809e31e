"""Picking and opening the trace the replay page shows: a bundled or captured file, an upload, several
files of one run merged, a trace too large to load (its overview); the run within a file of several;
one replica of a fleet. Everything else on the page reads the Replay this returns."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import streamlit as st

from core.analysis.routing import has_replicas, replica_roles
from core.lessons.scenarios import DATA as DATA_DIR
from ui import (
    UPLOAD_LIMIT_MB,
    add_aiperf_summary,
    bound,
    large_trace,
    load_trace_file,
    md,
    open_large_trace,
    parse_uploaded_run,
    parse_uploaded_trace,
    show_table,
    trace_view,
)
from ui.fleet import cached_fleet_as_one, cached_one_replica

UPLOAD = "Upload a file…"
MERGE = "Upload several files of one run (merge)…"
BIG_TRACE_REQUESTS = 150     # past this the cursor views show a subset and draw large charts once


@dataclass
class Replay:
    """The trace the page shows and how it was opened."""
    files: dict[str, Path]       # the traces to pick from (name -> path)
    choice: str                  # what was picked (a file's name, UPLOAD or MERGE)
    tr: object                   # the Trace (a large trace: its overview's skeleton)
    imp: object                  # the Imported of another tool's file, or None
    label: str
    large: bool                  # too large to load: read through its overview (ov)
    ov: object = None
    fleet_tr: object = None      # the whole fleet's trace when one replica is shown
    cursor_tr: object = None     # what the cursor's views read (a fleet: its replicas numbered apart)
    views: object = None         # a core.analysis.views.TraceView: one interface, loaded or not

    @property
    def bundled(self) -> bool:
        """A bundled example (data/): what it leaves out is explained in a caption, not a warning box
        (boxes are for the user's own files, where they are news)."""
        return self.choice in self.files and DATA_DIR in self.files[self.choice].resolve().parents

    @property
    def big(self) -> bool:
        return len(self.tr.requests) > BIG_TRACE_REQUESTS

    @property
    def aligned_at_zero(self) -> bool:
        return self.imp is not None and self.imp.aligned_at_zero

    def notice(self, text: str, icon: str, share: float = 1.0):
        """A warning box on the user's own file when it matters (`share`: the part of the run it concerns,
        boxed from 1%); a caption with the icon otherwise."""
        if self.bundled or share < 0.01:
            st.caption(f"{icon} {text}")
        else:
            st.warning(text, icon=icon)


def _merged_upload(slot: str):
    ups = st.file_uploader("Several files of one run: a client's result, the server's iteration log, its spans, "
                           "KV events, /metrics scrapes (joined on one clock: docs/imports.md)",
                           accept_multiple_files=True, key=f"{slot}_merge_upload",
                           type=["json", "gz", "jsonl", "yaml", "yml", "log", "txt"])
    if len(ups or []) == 1:
        st.info("Add at least one more file of the same run to merge.")
    if len(ups or []) >= 2:
        tr, _, err = parse_uploaded_run(ups, slot)
        if err:
            st.error(f"Could not merge: {md(err)}")
        else:
            st.session_state[f"{slot}_last"] = (tr, None, f"{len(ups)} files merged")
    last = st.session_state.get(f"{slot}_last")
    return last if last is not None else (None, None, None)


def _with_aiperf_summary(up, last, slot: str):
    """An AIPerf records file: offer its summary file, to show AIPerf's own statistics beside ours."""
    extra = st.file_uploader("Add AIPerf's summary of this run (profile_export_aiperf.json) to see its own "
                             "statistics beside ours", type=["json", "gz"], key=f"{slot}_aiperf_summary")
    if extra is None:
        return last
    tr, imp, err = add_aiperf_summary(up, extra, slot)
    if err:
        st.error(f"Could not add {md(extra.name)}: {md(err)}")
        return last
    last = (tr, imp, up.name)
    st.session_state[f"{slot}_last"] = last
    return last


def _upload(slot: str):
    up = st.file_uploader(f"serving-trace/1 (.json, .json.gz, .parquet) or another tool's file (vLLM/SGLang, "
                          f"AIPerf .jsonl, guidellm .json/.yaml, inference-perf, vLLM's log, OTLP spans, KV "
                          f"events; docs/imports.md), up to {UPLOAD_LIMIT_MB} MB",
                          type=["json", "gz", "parquet", "jsonl", "yaml", "yml", "log", "txt"],
                          key=f"{slot}_upload")
    if up is not None:
        tr, imp, err = parse_uploaded_trace(up, slot)
        if err:
            st.error(f"Could not load {md(up.name)}: {md(err)}")
        else:
            st.session_state[f"{slot}_last"] = (tr, imp, up.name)
    last = st.session_state.get(f"{slot}_last")
    if last is None:
        return None, None, None
    if up is not None and last[1] is not None and last[1].kind == "aiperf-records" and not last[1].stats:
        last = _with_aiperf_summary(up, last, slot)
    if up is None or st.session_state.get(f"{slot}_last")[2] != up.name:
        st.caption(f"Showing the last file that loaded: {md(last[2])}")
    return last


def get_trace(files: dict, choice: str, slot: str):
    """(trace, imported, label) for a choice, keeping the last good upload on errors."""
    if choice == MERGE:
        return _merged_upload(slot)
    if choice == UPLOAD:
        return _upload(slot)
    tr, imp, err = load_trace_file(files[choice])
    if err:
        st.error(f"Could not load {md(choice)}: {md(err)}")
        return None, None, None
    return tr, imp, choice


def _open_large(files: dict, choice: str) -> Replay:
    """Too large to load: opened from its overview (core/analysis/overview.py)."""
    ov, built_s, err = open_large_trace(files[choice])
    if err:
        st.error(f"Could not open {md(choice)}: {md(err)}")
        st.stop()
    rows = ov.rows()
    st.info(f"{rows['requests']:,} requests, {rows['tokens']:,} tokens, {rows['batch entries']:,} batch entries: too "
            "large to load, so this page reads the trace's overview — its summary computed out of core (DuckDB), "
            "each request's spans, the steps and KV block states, and the token and batch rows sorted by request, so "
            "a cursor move reads only the rows it draws. "
            + (f"Built on this first open in {built_s:.1f} s (`python -m core overview {md(choice)}` builds it ahead)."
               if built_s is not None else f"Overview built in {ov.doc['built']['seconds']:.1f} s, read from "
                                           f"{md(ov.folder.name)}."))
    return Replay(files, choice, ov.skeleton, None, choice, True, ov=ov)


def _pick_run(r: Replay) -> None:
    """A file of several runs (a guidellm report of several benchmarks, a vllm bench sweep): pick one."""
    labels = [run.run_label or f"run {k + 1}" for k, run in enumerate(r.imp.runs)]
    labels = [lab if labels.count(lab) == 1 else f"{lab} (#{k + 1})" for k, lab in enumerate(labels)]
    pick = st.selectbox(f"Run within this file ({len(labels)} in it)", labels, **bound("rp_run"),
                        help="each benchmark (or sweep point) of the file is its own run, with its own numbers")
    r.imp = r.imp.runs[labels.index(pick)]
    r.tr, r.label = r.imp.trace, f"{r.label} — {pick}"


def _pick_replica(r: Replay) -> None:
    """A fleet trace: the views for every replica together, or for one replica as a trace of its own."""
    whole = "the whole fleet"
    pick = st.selectbox("Replica", [whole] + [f"replica {i} ({role})" for i, role in enumerate(replica_roles(r.tr))],
                        **bound("rp_replica"), help="a fleet trace: the views below for every replica together, or for "
                                               "one replica as a trace of its own (its steps, KV blocks, requests)")
    if pick != whole:
        r.fleet_tr, r.tr = r.tr, cached_one_replica(r.tr, int(pick.split()[1]))
        r.cursor_tr = r.tr
        return
    r.cursor_tr = cached_fleet_as_one(r.tr)
    st.caption("The whole fleet: running, waiting and KV blocks are every replica's added up, and the KV grid "
               "shows each replica's pool after the one before (replica 1's blocks numbered after replica 0's); "
               "the batch at the cursor is the step of whichever replica stepped last. Pick a replica to see "
               "one engine.")


def _file_notes(imp) -> None:
    for note in imp.notes:
        st.info(md(note))
    if imp.failed:
        st.warning(f"{len(imp.failed)} failed request(s) in the file (kept, excluded from latency statistics):")
        show_table(pd.DataFrame(imp.failed), hide_index=True, key="rp_failed")


def open_replay(files: dict, choice: str) -> Replay:
    """The Replay of a choice; the page stops here when there is no trace to show."""
    if choice in files and large_trace(files[choice]):
        r = _open_large(files, choice)
    else:
        tr, imp, label = get_trace(files, choice, "rp")
        r = Replay(files, choice, tr, imp, label, False)
    if r.imp is not None and len(r.imp.runs) > 1:
        _pick_run(r)
    if r.imp is not None:
        _file_notes(r.imp)
    if r.tr is None:
        if r.imp is not None:
            st.subheader("The file's own summary")
            show_table(pd.DataFrame([r.imp.file_summary]).T.rename(columns={0: "value"}), key="rp_filesummary")
        else:
            st.info("Pick a trace or upload one.")
        st.stop()
    r.cursor_tr = r.tr
    if not r.large and has_replicas(r.tr):
        _pick_replica(r)
    r.views = r.ov if r.large else trace_view(r.cursor_tr, r.big)
    return r
