"""The `serving-trace/1` schema, declared once.

Every record type lists each of its fields once: name, type, default (or required),
allowed values and a one-line meaning. Everything else is derived from these
declarations: the in-memory columns and dtypes (`COLUMNS`, model.py), the JSON encoder
and the fast decoder (jsoncodec.py), the precise validator (validate.py), the Parquet
layout (parquet.py), the JSON Schema `data/schema/serving-trace-1.json` and the field
tables in docs/trace-format.md. Adding an event field is one `Field(...)` line here plus
its producer; then regenerate the two files:

    python -m core.trace --write        # (no flag: print the JSON Schema)

Field types. Column types become one column of the record's table:
  time   milliseconds: a number in 0..MAX_TIME_MS (1e12)             float64
  int    an integer in lo..2**63-1 (or exactly the default, e.g. -1 "not recorded")   int64
  str    a string                                                 object
  str?   a string or null                                         object (None)
  enum   one of `values`                                          Categorical(values)
  req    a listed request's id; in memory its row in `requests`   int64 (-1: none)
  id     a request's own id (integers are read as strings)        object
  batch  (step events) the step's batch entries                   rows of the `batch` table
Verbatim types are kept as given (request extras, meta, spec/tiles events) and only
described to the JSON Schema: number, object, object?, objects, ints, numbers, bool,
str|object, text (a string). Every meta key and every per-request key that code reads is
declared here (tests/test_layout.py checks the code against these declarations).

Records with a table are decoded into columns (unknown fields of table events are
dropped); records without one are kept verbatim, and the loader checks only their
time, req and enum fields. Unknown event types are kept verbatim with a checked t_ms.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.workload import MAX_TIME_MS

KV_OPS = ("alloc", "free", "hit", "cache", "evict", "cow")   # KV block operations (core.engine.kv_cache)

INT_MAX = 2**63 - 1            # int fields are int64 columns
MAX_KV_BLOCKS = 1 << 22        # 4,194,304 blocks (67M tokens at 16 per block): beyond any real pool,
#                                small enough that the block views stay within memory

SCHEMA = "serving-trace/1"
SOURCES = ("given", "simulated", "measured", "imported")
TOKEN_SOURCES = ("sampled", "accepted", "recovered", "bonus")
KINDS = ("decode", "prefill")  # batch entry kinds; category order matters (code 1 = prefill)
REQUIRED = object()            # Field.default of a required field

COLUMN_TYPES = ("time", "int", "str", "str?", "enum", "req", "id")
VERBATIM_TYPES = ("number", "object", "object?", "objects", "ints", "numbers", "bool", "str|object", "text")


@dataclass(frozen=True, slots=True)
class Field:
    name: str
    type: str                 # see the module docstring
    meaning: str
    default: Any = REQUIRED   # value when absent; REQUIRED: must be present
    lo: int | None = None     # int (and ints items): smallest valid value, besides the default
    hi: int = INT_MAX         # int: largest valid value (int64 columns: at most 2**63 - 1)
    values: tuple = ()        # enum: allowed values, in Categorical order
    write: str = "always"     # "always"; "present": omitted when equal to the default;
    #                           "never": not in JSON (batch.step comes from the enclosing step)
    pq: str | None = None     # Parquet column, when not `name`

    def __post_init__(self):
        assert self.type in COLUMN_TYPES + VERBATIM_TYPES + ("batch",), self.type
        assert self.write in ("always", "present", "never"), self.write
        assert (self.type == "enum") == bool(self.values), self.name

    @property
    def required(self) -> bool:
        return self.default is REQUIRED

    @property
    def nullable(self) -> bool:
        return self.type == "str?" or (self.type == "req" and self.default is None)

    @property
    def fill(self):
        """The in-memory value of an absent field (a null request reference is -1)."""
        return -1 if self.type == "req" and self.default is None else self.default

    @property
    def column(self) -> str:
        return self.pq or self.name

    @property
    def expect(self) -> str:
        """What a valid value is, for error messages: 'expected {expect}, got ...'."""
        t = self.type
        if t == "time":
            return f"a number of ms in 0..{MAX_TIME_MS:g}"
        if t == "int":
            if self.hi != INT_MAX:
                return f"an integer in {self.lo or 0}..{self.hi:,}"
            return "an integer" if self.lo is None else f"an integer >= {self.lo}"
        if t == "enum":
            return "one of " + ", ".join(self.values)
        if t == "req":
            return "a listed request id" + (" or null" if self.nullable else "")
        if t == "id":
            return "a unique non-empty string"
        return {"str": "a string", "str?": "a string or null", "batch": "a list"}.get(t, t)


@dataclass(frozen=True)
class Record:
    type: str                 # the event's `type` (for the others: the record's name)
    table: str | None         # Trace attribute holding its rows; None: kept verbatim
    meaning: str
    fields: tuple[Field, ...]
    order: int = 4            # at equal t_ms, events are written in increasing `order`

    def __post_init__(self):
        if self.table:
            omitted = [f.write == "present" for f in self.fields if f.write != "never" and f.type in COLUMN_TYPES]
            # Optional columns are appended when present: they must come last to keep key order.
            assert omitted == sorted(omitted), f"{self.type}: 'present' fields must come last"

    def field(self, name: str) -> Field:
        return next(f for f in self.fields if f.name == name)

    @property
    def columns(self) -> tuple[Field, ...]:
        """Fields that are columns of the table, in column order."""
        return tuple(f for f in self.fields if f.type in COLUMN_TYPES) if self.table else ()

    @property
    def json_fields(self) -> tuple[Field, ...]:
        return tuple(f for f in self.fields if f.write != "never")


def _t_ms(meaning: str) -> Field:
    return Field("t_ms", "time", meaning)


def _req(meaning: str = "the request (its id)", **kw) -> Field:
    return Field("req", "req", meaning, **kw)


# ---- the declarations --------------------------------------------------------------------

REQUEST = Record("request", "requests", "one request of the workload", (
    Field("id", "id", "unique id (integers are read as strings)"),
    Field("arrival_ms", "time", "when the request arrived", pq="t_ms"),
    Field("prompt_tokens", "int", "prompt length in tokens", lo=0),
    Field("max_output_tokens", "int", "the most output tokens the request may get (max_tokens)", lo=1),
    Field("tenant", "str?", "cache salt: KV blocks are never shared across tenants", default=None, write="present"),
    Field("prompt_ids", "ints", "the prompt's token ids (prefix caching needs them)", default=None, lo=0),
    Field("abort_at_ms", "number", "the client cancels the request at this time", default=None, lo=0),
    Field("deadline_ms", "number", "it must finish within this many ms of its arrival, or is aborted (finish "
          "reason deadline)", default=None, lo=0),
    Field("priority", "number", "an integer; with scheduling_policy priority, lower runs first", default=None),
    Field("prompt", "text", "the prompt as text (gpu_runner tokenizes it)", default=None),
    Field("error", "text", "imported traces: why the request failed, as the tool recorded it", default=None),
    Field("response_id", "text", "imported traces: the server's response id (pairs the request with its span)",
          default=None),
    Field("engine_request_id", "text", "merged traces: the engine's id of this request (its span)", default=None),
    Field("engine_arrival_ms", "number", "merged traces: when the engine received it, on this trace's clock",
          default=None),
    Field("engine_ttft_ms", "number", "merged traces: TTFT measured by the engine, from its own arrival",
          default=None),
    Field("engine_e2e_ms", "number", "merged traces: E2E measured by the engine, from its own arrival", default=None),
    Field("queued_ms", "number", "when the engine core queued it (after the front end's way in: parsing, "
          "tokenising, handing it over), on this trace's clock", default=None),
    Field("engine_wait_ms", "number", "simulated traces: from reaching the engine core to the end of the step then "
          "running, where the core's loop takes new requests in (vLLM's spans count it in the front end's share)",
          default=None, lo=0),
    Field("engine_queue_ms", "number", "engine spans: time in the waiting queue", default=None, lo=0),
    Field("engine_prefill_ms", "number", "engine spans: time in prefill", default=None, lo=0),
    Field("engine_decode_ms", "number", "engine spans: time in decode", default=None, lo=0),
    Field("engine_inference_ms", "number", "engine spans: prefill + decode", default=None, lo=0),
))

TOKEN = Record("token", "tokens", "a token reached the client at t_ms", (
    _t_ms("when the token reached the client"),
    _req(),
    Field("index", "int", "its position in the request's output, 0..n-1", lo=0),
    Field("source", "enum", "how it was produced: sampled; speculative decoding: accepted (a draft token), "
          "recovered (resampled from the residual), bonus", default="sampled", values=TOKEN_SOURCES),
    Field("token_id", "int", "the token id (-1 or absent: not recorded)", default=-1, lo=0, write="present"),
    Field("replica", "int", "fleet traces: the replica it happened on (absent: 0, the only one)", default=0,
          lo=0, write="present"),
), order=2)

FINISH = Record("finish", "finishes", "the request ended", (
    _t_ms("when the request ended"),
    _req(),
    Field("reason", "str", "length, stop, abort, error, ...", default="length"),
    Field("replica", "int", "fleet traces: the replica it ended on (-1: the router, which rejected it before any "
          "replica; absent: 0)", default=0, lo=-1, write="present"),
), order=3)

BATCH = Record("batch", "batch", "one request's share of a step (an entry of the step's `batch`)", (
    Field("step", "int", "the enclosing step event's step", lo=0, write="never"),
    _req(),
    Field("kind", "enum", "prefill or decode", values=KINDS),
    Field("tokens", "int", "tokens of this request computed in the step", lo=1),
))

STEP = Record("step", "steps", "one forward pass starting at t_ms", (
    _t_ms("when the step started"),
    Field("step", "int", "step number", lo=0),
    Field("dur_ms", "time", "how long the step took", default=0.0),
    Field("batch", "batch", "the requests in the step: [{req, kind, tokens}] (the batch record)", default=()),
    Field("running", "int", "running requests (-1: not recorded)", default=-1, lo=0),
    Field("waiting", "int", "waiting requests (-1: not recorded)", default=-1, lo=0),
    Field("kv_used_blocks", "int", "KV blocks in use (-1: not recorded)", default=-1, lo=0),
    Field("kv_free_blocks", "int", "KV blocks free (-1: not recorded)", default=-1, lo=0),
    Field("prefill_reqs", "int", "engines that log counts, not requests (vLLM's iteration log): requests in "
          "prefill (its 'context requests'; -1 or absent: not recorded)", default=-1, lo=0, write="present"),
    Field("prefill_tokens", "int", "those requests' prompt tokens computed in the step (uncached only)",
          default=-1, lo=0, write="present"),
    Field("decode_reqs", "int", "requests decoding (its 'generation requests')", default=-1, lo=0,
          write="present"),
    Field("decode_tokens", "int", "tokens they generated in the step", default=-1, lo=0, write="present"),
    Field("replica", "int", "fleet traces: the replica that ran the step (absent: 0, the only one)", default=0,
          lo=0, write="present"),
), order=1)

KV = Record("kv", "kv", "a physical KV block changed", (
    _t_ms("when the block changed"),
    Field("op", "enum", "alloc, free, hit (prefix-cache reuse), cache (a full block got its hash), "
          "evict (a cached block reused for other data), cow (copy-on-write of src into block)", values=KV_OPS),
    _req("the request (null: none)", default=None),
    Field("block", "int", "physical block id", lo=0, hi=MAX_KV_BLOCKS - 1),
    Field("logical", "int", "the request's logical block index (-1: none)", default=-1),
    Field("ref", "int", "the block's reference count after the op", default=0),
    Field("hash", "str?", "prefix-cache hash of a full block", default=None, write="present"),
    Field("src", "int", "cow: the block copied from (-1 or absent: none)", default=-1, write="present"),
    Field("replica", "int", "fleet traces: the replica whose pool holds the block (absent: 0, the only one)",
          default=0, lo=0, write="present"),
), order=0)

KV_EVENT_OPS = ("stored", "removed", "cleared")

KV_EVENT = Record("kv_event", "kv_events", "the engine's prefix cache changed, as it published it (vLLM's KV "
                  "events): one row per block; no request ids, no physical block ids", (
    _t_ms("when the engine published the event batch"),
    Field("op", "enum", "stored (a full block entered the prefix cache), removed (it left it), cleared "
          "(every block left at once; no hash)", values=KV_EVENT_OPS, pq="kv_event_op"),
    Field("hash", "str?", "the block's content hash: an unsigned 64-bit integer as a decimal string (it "
          "exceeds 2**53, so JSON numbers would lose digits)", default=None),
    Field("parent", "str?", "stored: the hash of the block before it in its prefix chain (null: the chain's "
          "first block)", default=None),
    Field("tokens", "int", "stored: tokens in the block (0: not recorded)", default=0, lo=0),
    Field("seq", "int", "the publisher's batch sequence number (-1: not recorded)", default=-1, lo=0),
    Field("medium", "str?", "where the block lives as the engine names it (e.g. GPU)", default=None,
          write="present"),
    Field("replica", "int", "fleet traces: the replica whose engine published it (absent: 0, the only one)",
          default=0, lo=0, write="present"),
), order=0)

PREEMPT = Record("preempt", "preempts", "a running request lost its KV blocks (to be recomputed)", (
    _t_ms("when the request was preempted"),
    _req(),
    Field("reason", "str", "why, e.g. kv_full", default="kv_full"),
    Field("freed_blocks", "int", "KV blocks it released", default=0, lo=0),
    Field("replica", "int", "fleet traces: the replica that preempted it (absent: 0, the only one)", default=0,
          lo=0, write="present"),
), order=0)

SPEC = Record("spec", None, "one speculative verification of a request's draft tokens", (
    _t_ms("when the step's tokens were on the host"),
    _req(default=None),
    Field("step", "int", "step number", default=None, lo=0),
    Field("proposed", "ints", "the draft token ids", default=None),
    Field("positions", "objects", "per draft token: {p, q, u, accepted} (target and draft probability, "
          "uniform draw, verdict)", default=None),
    Field("accepted", "int", "draft tokens accepted", default=None, lo=0),
    Field("bonus", "bool", "all accepted, so the target's next token came free", default=None),
))

TILES = Record("tiles", None, "running softmax max/sum per query row after one KV tile (FlashAttention)", (
    _t_ms("when the step started"),
    _req(default=None),
    Field("step", "int", "step number", default=None, lo=0),
    Field("layer", "int", "layer", default=None, lo=0),
    Field("head", "int", "attention head", default=None, lo=0),
    Field("q_tile", "int", "query tile", default=None, lo=0),
    Field("kv_tile", "int", "KV tile", default=None, lo=0),
    Field("q_start", "int", "first query position of the tile", default=None, lo=0),
    Field("kv_start", "int", "first KV position of the tile", default=None, lo=0),
    Field("m", "numbers", "running max per query row", default=None),
    Field("l", "numbers", "running sum per query row", default=None),
))

ROUTE = Record("route", None, "fleet traces: the router chose a replica for a request (one per request)", (
    _t_ms("when the router decided (the request's arrival)"),
    _req(),
    Field("replica", "int", "the chosen replica (disaggregated: the prefill replica; -1: rejected at the router)",
          default=None, lo=-1),
    Field("decode", "int", "disaggregated serving: the decode replica chosen for it", default=None, lo=0),
    Field("stage", "str", "whole (one replica runs it all), prefill (disaggregated) or rejected", default=None),
    Field("policy", "str", "the router's policy", default=None),
    Field("reason", "text", "why this replica, in words", default=None),
    Field("scores", "object", "per candidate replica (its index as a string): the policy's score, higher wins "
          "(absent where the policy does not score)", default=None),
    Field("signals", "object", "per candidate replica: what the router saw ({requests, running, waiting, kv_usage, "
          "prefix_blocks, cached_blocks, as_of_ms})", default=None),
    Field("prompt_blocks", "int", "the prompt's full blocks (what a prefix match is out of)", default=None, lo=0),
))

TRANSFER = Record("transfer", None, "fleet traces: a request's KV cache moved from a prefill to a decode replica", (
    _t_ms("when the transfer started (the prefill's end)"),
    _req(),
    Field("src", "int", "the prefill replica", default=None, lo=0),
    Field("dst", "int", "the decode replica", default=None, lo=0),
    Field("bytes", "int", "bytes moved (the blocks the decode replica did not already hold)", default=None, lo=0),
    Field("blocks", "int", "KV blocks moved", default=None, lo=0),
    Field("dur_ms", "number", "how long it took (latency + bytes / bandwidth alone; longer when shared)",
          default=None, lo=0),
))

TIER = Record("tier", None, "a KV copy between the GPU pool and the CPU tier under the prefix cache, or CPU "
              "blocks evicted (core.kvtier.tier)", (
    _t_ms("when the copy started (eviction: when the store that needed room was offered)"),
    Field("op", "str", "store (GPU blocks copied to the CPU tier), load (CPU blocks copied back before a request's "
          "prefill) or evict (CPU blocks dropped for a store)", default=None),
    _req("the request (null: an eviction)", default=None),
    Field("blocks", "int", "KV blocks copied or evicted", default=None, lo=0),
    Field("bytes", "int", "bytes copied (blocks x the engine's kv_block_bytes; 0: an eviction)", default=None, lo=0),
    Field("dur_ms", "number", "how long the copy took (its end is t_ms + dur_ms; simulated: latency + bytes / "
          "bandwidth, one copy at a time in each direction)", default=None, lo=0),
    Field("offered_ms", "number", "when the copy was decided: a store, at the end of the step that scheduled the "
          "blocks' last tokens; a load, at the request's admission (a copy waits for those before it)",
          default=None),
    Field("first", "bool", "load: made on the request's first admission (its CPU-tier hits)", default=None),
    Field("chunks", "ints", "the CPU tier's chunk ids", default=None),
    Field("gpu_blocks", "ints", "the GPU blocks read (store) or written (load)", default=None),
    Field("hashes", "objects", "the blocks' prefix-cache hashes (as the kv table's hash)", default=None),
    Field("replica", "int", "fleet traces: the replica whose tier it was (absent: 0, the only one)", default=0,
          lo=0, write="present"),
))

GAUGE = Record("gauge", None, "the server's own load, sampled by a capture client from its /metrics (engines "
               "whose steps we cannot see)", (
    _t_ms("when the sample was read"),
    Field("running", "number", "requests running (vllm:num_requests_running)", default=None, lo=0),
    Field("waiting", "number", "requests waiting (vllm:num_requests_waiting)", default=None, lo=0),
    Field("kv_usage", "number", "KV-cache usage, 0..1 (vllm:kv_cache_usage_perc)", default=None, lo=0),
    Field("preemptions", "number", "preemptions so far (vllm:num_preemptions_total)", default=None, lo=0),
    Field("prefix_cache_queries", "number", "prefix-cache queries so far, tokens", default=None, lo=0),
    Field("prefix_cache_hits", "number", "prefix-cache hits so far, tokens", default=None, lo=0),
    Field("offload_store_bytes", "number", "bytes stored to a CPU offloading tier so far "
          "(vllm:kv_offload_store_bytes_total)", default=None, lo=0),
    Field("offload_load_bytes", "number", "bytes loaded back from it so far (vllm:kv_offload_load_bytes_total)",
          default=None, lo=0),
    Field("offload_store_s", "number", "seconds those stores took (vllm:kv_offload_store_time_total)", default=None,
          lo=0),
    Field("offload_load_s", "number", "seconds those loads took (vllm:kv_offload_load_time_total)", default=None,
          lo=0),
    Field("offload_cpu_usage", "number", "CPU offloading cache usage, 0..1 (vllm:kv_offload_cpu_cache_usage_perc)",
          default=None, lo=0),
    Field("external_prefix_cache_queries", "number", "prompt tokens looked up past the GPU hit in an external "
          "(CPU tier) cache so far", default=None, lo=0),
    Field("external_prefix_cache_hits", "number", "of those, tokens found there so far", default=None, lo=0),
    Field("replica", "int", "fleet traces: the replica whose server it was read from (absent: 0, the only one)",
          default=0, lo=0, write="present"),
))

META = Record("meta", None, "where the trace comes from", (
    Field("source", "enum", "how the times were obtained", values=SOURCES),
    Field("label", "str", "a short name for the trace", default=None),
    Field("created", "str", "ISO-8601 time the trace was made", default=None),
    Field("device", "str|object", "where it ran", default=None),
    Field("engine", "object", "engine / scheduler configuration", default=None),
    Field("model", "object", "the model", default=None),
    Field("draft", "object?", "speculative decoding: the draft model", default=None),
    Field("step_model", "object", "simulated traces: the step-time model", default=None),
    Field("front_end", "object", "simulated traces: the front end's way in and out (core.sim.frontend: in_ms, "
          "in_ms_per_prompt_token, out_ms, out_ms_per_output_token); arrivals and tokens are on its clock",
          default=None),
    Field("clock_note", "str", "which clock each time is on, where a trace holds more than one place", default=None),
    Field("workload", "str", "the workload's name", default=None),
    Field("stats", "object", "what the scheduler did (steps, preemptions, KV block ops)", default=None),
    Field("versions", "object", "software versions", default=None),
    Field("notes", "str", "free text", default=None),
    Field("clock", "object", "what t_ms 0 is: {kind: epoch | perf_counter | wall-clock, t0_s: that instant "
          "on that clock in seconds, resolution_ms, how; a monotonic clock (gpu_runner serve): boot_id, the "
          "host's boot whose clock it is, and epoch_t0_s, the same instant on the epoch clock} (imported, "
          "observed and served traces; merge and fleet-merge align by it)",
          default=None),
    Field("provenance", "object", "imported traces: where and how each quantity was measured "
          "({quantity: text}, e.g. ttft_ms: 'client: AIPerf time_to_first_token')", default=None),
    Field("load", "object", "where the run sits on a load axis: {kind: open | closed, rate (req/s) | concurrency}",
          default=None),
    Field("startup", "object", "measured runs: cold start ({model_load_ms, first_step_ms}) and, where set, how the "
          "engine's process allocates (malloc)", default=None),
    Field("client_ids", "object", "a client's file: its request ids are the ones it sent as X-Request-Id "
          "({sent: true, how}), the ids a fleet's join (fleet-merge --client) matches to the replicas' requests",
          default=None),
    Field("client_window", "object", "a benchmark client's own throughput window on the trace's clock, "
          "{start_ms, end_ms, how} (a client's file joined with a fleet's: e.g. vllm bench serve's duration from its "
          "first send); output throughput is taken over it unless a window is given", default=None),
    Field("merged_from", "objects", "merged traces: one row per file ({file, role, clock, offset_ms, "
          "uncertainty_ms, how, matched, dropped, added, left_out})", default=None),
    Field("failures", "objects", "captures: the requests that failed ({index, id, error})", default=None),
    Field("odd", "objects", "captures: what the server did that was odd (more tokens than asked)", default=None),
    Field("kv_blocks_drawn", "int", "a fleet seen as one engine (core.analysis.cursor.fleet_as_one): the KV blocks "
          "its views draw, its replicas' drawn blocks side by side", default=None, lo=0),
    Field("fleet", "object", "fleet traces: {replicas: [{replica, role, engine, step_model, kv_blocks, drain_ms, "
          "stats}], router: {policy, staleness_ms, seed, prefix, params, queue_limit}, link: {gbps, latency_ms, "
          "kv_bytes_per_token, model}, pd_min_prompt, first_token, contention (a simulated fleet whose replicas "
          "share a host's cores: each step 1 + contention x the others mid-step at its start times its price), "
          "alignment (measured replicas merged: [{replica, file, offset_ms, uncertainty_ms, how}], how each "
          "replica's time 0 was placed on the fleet's clock)}",
          default=None),
))

EVENTS = (TOKEN, FINISH, STEP, KV, KV_EVENT, PREEMPT, SPEC, TILES, GAUGE, ROUTE, TRANSFER, TIER)   # tables: this order
TABLE_EVENTS = tuple(r for r in EVENTS if r.table)
VERBATIM_EVENTS = {r.type: r for r in EVENTS if not r.table}
TABLES = (REQUEST, TOKEN, FINISH, STEP, BATCH, KV, KV_EVENT, PREEMPT)  # in-memory tables (and Parquet rtypes)


def dtype(f: Field):
    if f.type == "enum":
        import pandas as pd
        return pd.CategoricalDtype(list(f.values))
    return {"time": "float64", "int": "int64", "req": "int64"}.get(f.type, "object")


REQUEST_FIELDS = tuple(f.name for f in REQUEST.columns)
_COLS = {"TOKEN_COLS": "tokens", "FINISH_COLS": "finishes", "STEP_COLS": "steps", "BATCH_COLS": "batch",
         "KV_COLS": "kv", "KV_EVENT_COLS": "kv_events", "PREEMPT_COLS": "preempts"}


def __getattr__(name: str):
    # COLUMNS (table -> column -> pandas dtype) and the *_COLS tables are built on first use:
    # enum dtypes need pandas, which the streaming writer never imports.
    if name == "COLUMNS":
        value = {r.table: {f.name: dtype(f) for f in r.columns} for r in TABLES}
    elif name in _COLS:
        value = __getattr__("COLUMNS")[_COLS[name]]
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


# ---- JSON Schema -------------------------------------------------------------------------

def _json_type(f: Field) -> dict:
    t = f.type
    if t == "time":
        return {"$ref": "#/$defs/time"}
    if t == "int":
        lo = min(f.lo, f.default) if f.lo is not None and isinstance(f.default, int) else f.lo
        return {"type": "integer", "maximum": f.hi} | ({"minimum": lo} if lo is not None else {})
    if t == "number":
        return {"type": "number"} | ({"minimum": f.lo} if f.lo is not None else {})
    if t == "enum":
        return {"enum": list(f.values)}
    if t == "req":
        return {"anyOf": [{"$ref": "#/$defs/req"}, {"type": "null"}]} if f.nullable else {"$ref": "#/$defs/req"}
    if t == "ints":
        return {"type": "array", "items": {"type": "integer"} | ({"minimum": f.lo} if f.lo is not None else {})}
    if t == "batch":
        return {"type": "array", "items": _object(BATCH)}
    return {"id": {"type": ["string", "integer"]}, "str": {"type": "string"}, "text": {"type": "string"},
            "str?": {"type": ["string", "null"]},
            "object": {"type": "object"}, "object?": {"type": ["object", "null"]},
            "objects": {"type": "array", "items": {"type": "object"}},
            "numbers": {"type": "array", "items": {"type": "number"}}, "bool": {"type": "boolean"},
            "str|object": {"type": ["string", "object"]}}[t]


def _object(r: Record, skip=()) -> dict:
    props = {f.name: _json_type(f) | {"description": f.meaning} for f in r.json_fields if f.name not in skip}
    required = [f.name for f in r.json_fields if f.required and f.name not in skip]
    return {"type": "object"} | ({"required": required} if required else {}) | {"properties": props}


def json_schema() -> dict:
    events = []
    for r in EVENTS:
        then = _object(r, skip=("t_ms",))
        then.pop("type")
        events.append({"if": {"properties": {"type": {"const": r.type}}}, "then": then})
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "serving-trace-1.json",
        "title": SCHEMA,
        "description": "A serving run: requests and timestamped events on one clock (milliseconds). Only "
                       "requests plus token and finish events are required; the other event types enable more "
                       "views. Unknown fields are allowed and kept. Cross-event rules (tokens not before arrival, "
                       "token indices 0..n-1 per request with non-decreasing times, at most max_output_tokens "
                       "tokens, one finish per request not before its last token, events only for listed "
                       "requests) are checked by core.trace, not expressible here. Generated by "
                       "`python -m core.trace` from core/trace/schema.py.",
        "type": "object",
        "required": ["schema", "meta", "requests", "events"],
        "properties": {
            "schema": {"const": SCHEMA},
            "meta": _object(META),
            "requests": {"type": "array", "items": _object(REQUEST)},
            "events": {"type": "array", "items": {
                "type": "object", "required": ["t_ms", "type"],
                "properties": {"t_ms": {"$ref": "#/$defs/time"}, "type": {"type": "string"}},
                "allOf": events}},
        },
        "$defs": {"time": {"type": "number", "minimum": 0, "maximum": MAX_TIME_MS},
                  "req": {"type": ["string", "integer"]}},
    }


def _layout(x, indent: int = 0, width: int = 110) -> str:
    """JSON with one space of indent per level; anything that fits in `width` on one line."""
    one = json.dumps(x, ensure_ascii=False)
    if indent + len(one) <= width or not isinstance(x, (dict, list)) or not x:
        return one
    pad = " " * (indent + 1)
    if isinstance(x, dict):
        items = [f"{pad}{json.dumps(k)}: {_layout(v, indent + 1, width)}" for k, v in x.items()]
        return "{\n" + ",\n".join(items) + "\n" + " " * indent + "}"
    return "[\n" + ",\n".join(pad + _layout(v, indent + 1, width) for v in x) + "\n" + " " * indent + "]"


def json_schema_text() -> str:
    return _layout(json_schema()) + "\n"


# ---- docs/trace-format.md field tables ---------------------------------------------------

DOC_BEGIN = "<!-- fields: generated by `python -m core.trace --write`; do not edit by hand -->"
DOC_END = "<!-- end of generated fields -->"


def _doc_type(f: Field) -> str:
    if f.type == "enum":
        return " \\| ".join(f"`{v}`" for v in f.values)
    if f.type == "req":
        return "request id" + (" or null" if f.nullable else "")
    if f.type == "int" and f.hi != INT_MAX:
        return f"integer {f.lo or 0}..{f.hi:,}"
    if f.type == "int" and f.lo is not None:
        return f"integer ≥ {f.lo}"
    return {"time": "ms ≥ 0", "int": "integer", "number": "number" + (" ≥ 0" if f.lo == 0 else ""),
            "str?": "string or null", "str": "string", "text": "string", "id": "string",
            "batch": "list", "ints": "list of integers", "numbers": "list of numbers", "objects": "list of objects",
            "object?": "object or null", "str|object": "string or object"}.get(f.type, f.type)


def _doc_default(f: Field) -> str:
    if f.required:
        return "**required**"
    if f.default is None or f.default == ():
        return ""
    return f"`{json.dumps(f.default)}`"


def doc_tables() -> str:
    out = [DOC_BEGIN, ""]
    for r in (META, REQUEST, *EVENTS, BATCH):
        head = f"`{r.type}` event" if r in EVENTS else f"`{r.type}`"
        where = f"in memory: `Trace.{r.table}`" if r.table else "kept verbatim"
        out += [f"**{head}**: {r.meaning} ({where}).", "",
                "| field | type | default | meaning |", "|---|---|---|---|"]
        out += [f"| `{f.name}` | {_doc_type(f)} | {_doc_default(f)} | {f.meaning} |"
                for f in r.json_fields]
        out.append("")
    out.append(DOC_END)
    return "\n".join(out)


ROOT = Path(__file__).resolve().parents[2]
SCHEMA_FILE = ROOT / "data" / "schema" / "serving-trace-1.json"
DOC_FILE = ROOT / "docs" / "trace-format.md"


def docs_with_tables(text: str) -> str:
    """docs/trace-format.md with the generated part between the markers replaced."""
    start, end = text.index(DOC_BEGIN), text.index(DOC_END) + len(DOC_END)
    return text[:start] + doc_tables() + text[end:]

