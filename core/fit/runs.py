"""One measured run, as the fidelity command reads it: what was sent, under which engine flags,
and what the engine measured per request.

A RUN is a directory of one run's files — a vLLM server's log (`--enable-logging-iteration-details`:
its steps, and its flags from the start-up line), its OTLP request spans, its KV events, a client's
result file, and the prompts sent (`dataset.jsonl`, `vllm bench serve --dataset-name custom`) —
recognised by what they hold, as `merge` recognises them; or a single trace file (ours: simulated,
measured by gpu_runner, or merged).

The truth per request is the engine's own measurement where there is one (vLLM's spans: TTFT and
E2E from its front end's arrival to the token reaching its front end: "vLLM's front end" clock),
else the trace's own requests ("the trace's" clock). The workload is the run's measured requests
(`vllm bench serve` names them cmpl-bench-<run>-<i>-0: earlier runs' requests in the same files,
a warm-up, are left out and counted), arriving when the front end received them, with their
prompt token ids where the prompts are known and tokenise one byte per token (the bundled byte
model), which prefix caching needs.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from core.config import SchedulerConfig, from_dict
from core.errors import InputError, json_from_bytes, read_input_file
from core.trace import Imported, open_trace
from core.trace.imports.sniff import role_of
from core.workload import Request, Workload

_BENCH_ID = re.compile(r"^(?P<run>.+)-(?P<i>\d+)-0$")   # vllm bench serve: cmpl-bench-<uuid>-<i>-0
MAX_FILES = 64


@dataclass
class Run:
    name: str
    path: Path
    workload: Workload            # the measured requests, arriving when the front end received them
    truth: object                 # a Trace: per request TTFT / E2E (and the engine's phases where known)
    clock: str                    # where TTFT and E2E are measured from and to
    config: SchedulerConfig | None  # the engine's flags (None: not stated by the run's files)
    steps: object | None = None   # a Trace with the engine's steps (its iteration log), or None
    kv_events: object | None = None
    notes: list[str] = field(default_factory=list)
    clients: int | None = None    # a closed loop's clients (its client's result file says so), else None

    @property
    def ids(self) -> list[str]:
        return self.workload.ids


def load_run(path: str | Path, config: SchedulerConfig | None = None) -> Run:
    """A run from a directory of its files or one trace file; `config` overrides the flags read
    from the files. InputError (naming the file and what was expected) when it cannot be one."""
    p = Path(path)
    if not p.exists():
        raise InputError(f"{p}: no such file or directory")
    if p.is_dir() and not any(p.glob("*.parquet")) and not (p / "_meta.json").exists():
        return _dir_run(p, config)
    return _trace_run(p, config)


def _trace_run(p: Path, config) -> Run:
    got = open_trace(p)
    tr = got.trace if isinstance(got, Imported) else got
    if not len(tr.requests) or not len(tr.tokens):
        raise InputError(f"{p}: no requests with tokens: a fidelity run needs each request's TTFT and E2E")
    replicas = _replicas(tr)
    if replicas > 1:    # (fitted as one engine, a fleet's batches and queues are another run's: silently wrong)
        raise InputError(f"{p}: a fleet trace ({replicas} replicas): fidelity fits and predicts one engine; give "
                         "one replica's trace, or open the fleet on the Fleet page (Measured fleets), where the "
                         "fleet simulator predicts it")
    cfg = config or _config_of(tr.meta.get("engine") or {}, str(p))
    return Run(p.stem, p, tr.workload(), tr, "the trace's (its arrivals to its tokens)", cfg,
               tr if len(tr.steps) else None, None, [])


def _replicas(tr) -> int:
    """How many replicas a trace's records name (meta.fleet's list, or its replica columns)."""
    listed = (tr.meta.get("fleet") or {}).get("replicas") if isinstance(tr.meta.get("fleet"), dict) else None
    n = len(listed) if isinstance(listed, list) else 0
    for df in (tr.steps, tr.tokens, tr.finishes):
        if "replica" in df and len(df):
            n = max(n, int(df["replica"].max()) + 1)
    return n


def _config_of(engine: dict, where: str) -> SchedulerConfig | None:
    try:
        return from_dict(SchedulerConfig, engine, where=f"{where}: meta.engine", strict=False)
    except Exception:   # (a trace from another engine: its flags are not ours)
        return None


def _dir_run(d: Path, config) -> Run:
    files = sorted(f for f in d.iterdir() if f.is_file())
    if len(files) > MAX_FILES:
        raise InputError(f"{d}: {len(files)} files; a run directory holds one run's files (at most {MAX_FILES})")
    roles, dataset, notes, unread = _read_files(files)
    if "spans" not in roles and "requests" not in roles:
        raise InputError(f"{d}: no file with per-request times (vLLM's OTLP spans, a client's result file); found "
                         + (", ".join(f.name for f in files[:8]) or "nothing")
                         + (f"; not read: {'; '.join(unread[:4])}" if unread else ""))
    notes += [f"not read: {u}" for u in unread]
    src, got = roles.get("spans") or roles["requests"]
    clock = ("vLLM's front end (its spans: its arrival to the token reaching it)" if "spans" in roles
             else f"the client's ({src.name}: its send to its receipt)")
    truth, dropped = measured_requests(_trace_of(got))
    if dropped:
        notes.append(f"{dropped} earlier requests in {src.name} (a warm-up) left out: the run is the last "
                     "`vllm bench serve` run's requests")
    steps, cfg = _steps_and_flags(roles.get("steps"), config, notes)
    kv = _trace_of(roles["kv"][1]) if "kv" in roles else None
    w = _workload(truth, dataset, notes, d.name)
    clients = _clients(roles["requests"], notes) if "requests" in roles else None
    return Run(d.name, d, w, truth, clock, cfg, steps, kv, notes, clients)


def _trace_of(got):
    """The trace of what open_trace returned (an Imported file's, or the trace itself)."""
    return got.trace if isinstance(got, Imported) else got


def _read_files(files: list[Path]) -> tuple[dict[str, tuple[Path, object]], Path | None, list[str], list[str]]:
    """(role -> (its file, what open_trace read), the prompts file or None, notes, the files not
    read with why) of a run directory's files: the first file of each role is used."""
    roles: dict[str, tuple[Path, object]] = {}
    notes, dataset, unread = [], None, []
    for f in files:
        if f.name == "dataset.jsonl":
            dataset = f
            continue
        if _not_a_record(f):
            continue
        try:
            got = open_trace(f)
        except InputError as e:
            unread.append(f"{f.name} ({str(e)[:300]})")
            continue
        role = _role(got)
        if role in roles:
            notes.append(f"{f.name}: a second {role} file, not used ({roles[role][0].name} is)")
            continue
        roles[role] = (f, got)
    return roles, dataset, notes, unread


def _not_a_record(f: Path) -> bool:
    """Raw captures beside their decoded forms, and notes: not read as the run's records."""
    return f.suffix in (".xz", ".txt", ".md") or f.name.endswith(".decoded.jsonl") or f.name == "otlp_bodies.jsonl"


def _role(got) -> str:
    """What a run's file is to it (core.trace.imports.sniff.role_of; our own traces: requests), a log
    or telemetry file as "steps" when it has steps, else "kv" (KV events only)."""
    role = role_of(got.kind) if isinstance(got, Imported) else "requests"
    tr = _trace_of(got)
    if role == "steps" or (role == "telemetry" and len(tr.kv_events)):
        role = "steps" if len(tr.steps) else "kv"
    return role


def _steps_and_flags(steps: tuple[Path, object] | None, config, notes: list) -> tuple[object | None, object]:
    """(the iteration log's trace, or None; the engine flags: `config`, else those its start-up line states)."""
    if steps is None:
        return None, config
    f, got = steps
    tr = _trace_of(got)
    if config is None:
        config = _vllm_flags(tr.meta.get("engine") or {}, f.name, notes)
    return tr, config


def _clients(requests: tuple[Path, object], notes: list) -> int | None:
    """A client's closed loop (its clients; a closed loop is predicted as one: core.fit.calibrate.predict),
    or None; a note when its file holds several runs."""
    from core.fit.stepinfer import closed_loop_clients
    f, got = requests
    # (a file of several runs, a guidellm sweep: one closed loop only when every run is that loop)
    parts = (got.runs or [got]) if isinstance(got, Imported) else [got]
    loops = {closed_loop_clients(_trace_of(x)) for x in parts}
    clients = loops.pop() if len(loops) == 1 else None
    if len(parts) > 1:
        notes.append(f"{f.name}: {len(parts)} runs of one client (a sweep): "
                     + (f"each a closed loop of {clients}" if clients else "not one closed loop; predicted "
                        "at the measured send times"))
    return clients


def server_log_flags(path) -> SchedulerConfig:
    """The flags a vLLM server log states in its start-up lines (`non-default args: ...`, anywhere in
    it), read as for a run: for runs whose own files are a log cut into runs (no start-up lines).
    InputError naming the file when it states none."""
    from core.errors import gunzip
    from core.trace.imports.vllm_log import engine_options
    raw = gunzip(read_input_file(path, "vLLM server log", InputError), str(path))
    cfg = _vllm_flags(engine_options(raw.decode("utf-8", errors="replace")), str(path), [])
    if cfg is None:
        raise InputError(f"{path}: no engine flags in it (no `non-default args:` start-up line)")
    return cfg


def _vllm_flags(engine: dict, name: str, notes: list) -> SchedulerConfig | None:
    """Our scheduler options from vLLM's start-up line (core.trace.imports.vllm_log.engine_options),
    vLLM 0.32's defaults for the rest that matter here (prefix caching on)."""
    if engine.get("name") != "vllm" or len(engine) <= 1:
        notes.append(f"{name}: no engine flags in the log (its start-up lines are missing): give them")
        return None
    d = {k: v for k, v in engine.items() if k in SchedulerConfig.__dataclass_fields__}
    if "prefix_caching" not in d:
        d["prefix_caching"] = True
        notes.append(f"{name}: prefix caching not among the non-default args: on (vLLM V1's default)")
    d.setdefault("kv_manager", "vllm-v1")
    return from_dict(SchedulerConfig, d, where=f"{name}: engine flags", strict=False)


def measured_requests(tr):
    """The trace's requests of its last `vllm bench serve` run (ids cmpl-bench-<run>-<i>-0 with
    several <run>s: the earlier ones were a warm-up), and how many were left out; all of them when
    the ids do not say."""
    ids = tr.ids
    runs = [(_BENCH_ID.match(i) or None) for i in ids]
    if not ids or any(m is None for m in runs):
        return tr, 0
    arr = tr.requests["arrival_ms"].to_numpy()
    last = {}
    for m, a in zip(runs, arr):
        last[m["run"]] = max(last.get(m["run"], -np.inf), a)
    if len(last) < 2:
        return tr, 0
    keep_run = max(last, key=last.get)
    keep = [k for k, m in enumerate(runs) if m["run"] == keep_run]
    return _subset(tr, keep), len(ids) - len(keep)


def _subset(tr, keep: list[int]):
    import copy
    out = copy.copy(tr)
    req_map = {old: new for new, old in enumerate(keep)}
    out.requests = tr.requests.iloc[keep].reset_index(drop=True)
    out.request_extra = [tr.request_extra[k] if k < len(tr.request_extra) else {} for k in keep]
    for table in ("tokens", "finishes"):
        df = getattr(tr, table)
        if len(df):
            sel = df[df["req"].isin(req_map)].copy()
            sel["req"] = sel["req"].map(req_map).astype(np.int64)
            setattr(out, table, sel.reset_index(drop=True))
    return out


DATASET_BYTES = 256 << 20      # a run's prompts file (vllm bench serve --dataset-name custom)


def _workload(truth, dataset: Path | None, notes: list, name: str) -> Workload:
    """The measured requests in arrival order, with prompt ids from the dataset when its prompts
    are one token per byte (their lengths say so)."""
    rows = []
    if dataset is not None:
        try:    # (bounded read; each line one JSON value, nesting too deep a one-line refusal)
            raw = read_input_file(dataset, "prompts (JSON lines)", InputError, DATASET_BYTES)
            rows = [json_from_bytes(ln, f"{dataset.name}: line {k + 1}") for k, ln in enumerate(raw.splitlines())
                    if ln.strip()]
        except InputError as e:
            notes.append(f"{dataset.name}: not read ({e}); prompts' token ids unknown (no prefix caching)")
            rows = []
    req = truth.requests
    prompts = {}
    for k, rid in enumerate(truth.ids):
        m = _BENCH_ID.match(rid)
        i = int(m["i"]) if m else k
        if rows and i < len(rows) and isinstance(rows[i], dict) and isinstance(rows[i].get("prompt"), str):
            ids = tuple(rows[i]["prompt"].encode())
            if len(ids) == int(req["prompt_tokens"].iloc[k]):
                prompts[rid] = ids
    if rows and len(prompts) < len(truth.ids):
        notes.append(f"{dataset.name}: {len(truth.ids) - len(prompts)} of {len(truth.ids)} prompts do not match "
                     "their token counts one byte per token: those have no token ids (no prefix-cache hits)")
    n_out = _output_tokens(truth)
    reqs = [Request(rid, float(a), int(p), max(int(n_out.get(rid, mo)), 1), prompt_ids=prompts.get(rid))
            for rid, a, p, mo in zip(truth.ids, req["arrival_ms"], req["prompt_tokens"], req["max_output_tokens"])]
    reqs.sort(key=lambda r: r.arrival_ms)
    t0 = reqs[0].arrival_ms if reqs else 0.0
    return Workload([Request(r.id, r.arrival_ms - t0, r.prompt_tokens, r.max_output_tokens, prompt_ids=r.prompt_ids)
                     for r in reqs], name=name)


def _output_tokens(truth) -> dict:
    from core.analysis.metrics import request_metrics
    m = request_metrics(truth)
    return dict(zip(m["id"], m["output_tokens"]))
