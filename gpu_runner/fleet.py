"""`python -m gpu_runner fleet`: several engine processes behind one OpenAI-compatible front end
whose router is the simulator's (core.fleet.router), deciding from the replicas' real state.

    HTTP handlers (gpu_runner.server.App) -> FleetClient.submit -> Router.choose(Signals) -> Replica k
    Replica k: the engine process `serve` runs (gpu_runner.engine_process.ProcessClient), its own
               pipe and reader thread; every Outputs message it sends updates what the router knows

What the router knows (pushed, never polled): after every engine step each replica's engine
process sends its gauges (running, waiting, KV blocks used) and, for precise prefix knowledge,
the prefix cache's changes (blocks cached and evicted: their hashes); the front end counts the
requests it routed to each replica and their finishes. All of it is timestamped on arrival at the
front end, so the router's view of a replica is as old as that replica's last step end plus a
pipe hop (~0.1 ms), up to one step time (the step it is running); `--router-staleness-ms S`
makes the router read everything as of S ms before now, as the simulator does. Approximate
prefix knowledge is the router's own record (what it sent where), as in the simulator.

Disaggregated prefill/decode (`--prefill-replicas P --decode-replicas D`): a prompt of at least
`--pd-min-prompt` tokens goes to a prefill replica as a copy asking one token (ignoring EOS);
as that copy finishes, its engine copies the prompt's K and V of every layer out of its paged
cache (before the next step can reuse the blocks) and sends them as bytes (gpu_runner.messages.
KVBlob) over its pipe to the front end, which forwards them over the decode replica's pipe; the
decode engine queues the request with all but the last prompt token preloaded (the core
scheduler's `preloaded`), writes the tensors into the blocks it allocates at admission (not the
leading blocks it already holds as prefix-cache hits) and recomputes the last prompt token to
emit token 0 — vLLM's convention for disaggregated serving, and the simulator's. Bytes moved =
prompt tokens x the model's KV bytes per token (all of the prompt, even where the decode side has
a prefix cached: it is not asked first). Each handoff is a `transfer` event: t_ms when the
prefill engine began the copy, dur_ms until the decode engine had the message decoded.

Clock: every engine process is started with the front end's origin on the host's monotonic
clock (perf_counter_ns: CLOCK_MONOTONIC, one for all processes of the host), so the replicas'
times and the router's are on one clock with no offset to estimate; the uncertainty is the clock
read itself (well under a microsecond). A fleet across hosts would need an alignment (not built).

Replica failure: a replica whose engine process dies fails its in-flight requests with a
Failed naming it ("replica 1 ended (exit code -9)": a 503, or an error event closing the
stream), the router stops choosing it at once (it is no longer alive) and the rest keep
serving. A replica that holds requests and whose engine process has sent nothing for
`--replica-stall-s` (it sends something at least every BEAT_S while busy: a frozen process,
SIGSTOP, or a loop idle with work queued) is taken out of rotation the same way ("replica 1 made
no progress for 5.0 s ..."), as Envoy's outlier detection ejects a host, and comes back when it
sends again. Nothing the front end does waits on a replica: messages to it go through its own
writer thread (gpu_runner.engine_process), and stopping kills a replica that stays silent.
SIGTERM / Ctrl-C drain: no new requests (503 "draining"), /health answers 503, the
in-flight requests finish (up to `--drain-timeout-s`), then the replicas stop and the fleet
trace is written; a second signal, or the drain's timeout, stops the replicas at once (each
unfinished request streams its "abort" finish) before the HTTP server ends. Every request is
answered: a full waiting queue or a prefilled request that no decode replica takes gets a 503
naming why (docs/fleet-real.md).
"""
from __future__ import annotations

import dataclasses
import itertools
import queue
import threading
import time
from pathlib import Path

from core.engine.prefix_cache import extra_key
from core.errors import ConfigError
from core.fleet.board import Board
from core.fleet.front import decide, prompt_hashes, rejected_event, route_event, signals_of
from core.fleet.router import Router, RouterConfig
from core.fleet.spec import FIRST_TOKEN
from gpu_runner.client import EngineClient, Overloaded, ServerStopping, Stream
from gpu_runner.engine_process import REPLICA_STALL_S, ProcessClient
from gpu_runner.launch import ServeOptions
from gpu_runner.messages import Failed, KVLoaded, KVReady, Outputs, RequestOutput

CLOCK = ("one host clock: every engine process uses the front end's origin on CLOCK_MONOTONIC (perf_counter_ns), "
         "so replica and router times need no alignment; uncertainty: the clock read (< 1 us)")


class Replica(ProcessClient):
    """One engine process of the fleet: `serve`'s, telling the fleet's board what it reports."""

    def __init__(self, fleet: FleetClient, index: int, role: str, options: ServeOptions, metrics, max_waiting: int,
                 stall_s: float | None = None):
        self.fleet, self.index, self.role = fleet, index, role
        self.board = Board(fleet.router_cfg.staleness_ms, shared=True)   # told from this replica's reader thread
        # each open stream's deliveries [(t_ms, tokens)], what reached its client: kept for the requests this
        # replica fails by dying (its own trace ends at its last rewrite); dropped as a stream ends otherwise
        self.delivered: dict[str, list[tuple[float, int]]] = {}
        super().__init__(options, metrics, max_waiting, fleet.origin_ns, label=f"replica {index}", wait=False,
                         stall_s=stall_s)

    def apply(self, msg: Outputs):
        st = msg.stats
        if st is not None:     # (before the clients hear of the step: a client's next request sees it)
            now = self.now_ms()
            self.board.tell(now, "gauges", (st.running, st.waiting, st.kv_used_blocks))
            if st.cache_news:
                self.board.tell(now, "kv", st.cache_news)
        super().apply(msg)

    def _event(self, s: Stream, ev):
        if isinstance(ev, KVLoaded):          # the decode side has the KV: the transfer's end
            self.fleet.kv_loaded(self.index, ev)
            return
        if isinstance(ev, RequestOutput) and ev.token_ids and self.fleet.recording:
            self.delivered.setdefault(s.rid, []).append((ev.t_ms, len(ev.token_ids)))
        if isinstance(ev, Failed) or (isinstance(ev, RequestOutput) and ev.finish_reason is not None):
            self.delivered.pop(s.rid, None)
        super()._event(s, ev)

    def _end(self, s: Stream):
        if not s.done:
            self.board.tell(self.now_ms(), "requests", -1)
        super()._end(s)

    def fail_all(self, message: str, status: int = 503, cut: bool = True):
        """The engine process is gone, or out of rotation for a stall: its open requests fail
        (naming it: a request not yet answered gets a 503; a stream already under way is cut, as
        sglang-router cuts one whose worker died); the fleet notes when, and which requests, for
        its trace (a dead replica's own trace ends at its last rewrite)."""
        death = None
        if not self._stopping and (self.streams or self.stall is None):
            death = {"replica": self.index, "t_ms": self.now_ms(), "why": message, "failed": list(self.streams),
                     "stalled": self.stall is not None}
            self.fleet.deaths.append(death)
        super().fail_all(message, status, cut=True)
        if death is not None:    # (its streams are closed: no delivery reaches these lists any more)
            death["streamed"] = {r: self.delivered.pop(r) for r in death["failed"] if r in self.delivered}
        if self.metrics is not None:      # (its last gauges would otherwise stand forever; counters stay)
            self.metrics.gone()


class _PrefillCopy(Stream):
    """A disaggregated request's prefill on its prefill replica: what that replica says goes to
    the fleet's handoff thread, never to the client."""
    client: Stream | None = None
    src: int = -1
    decode: int = -1
    fleet: FleetClient | None = None

    def push(self, item):
        self.fleet.handoffs.put((self, item))


class FleetClient(EngineClient):
    """The front end's engine: N replicas and a router (gpu_runner.client.EngineClient, so the HTTP
    layer is `serve`'s). `roles[k]`: both | prefill | decode."""

    def __init__(self, options: ServeOptions, roles: list[str], router: RouterConfig, metrics=None,
                 max_waiting: int = 256, pd_min_prompt: int = 0, replica_traces: Path | None = None,
                 stall_s: float | None = REPLICA_STALL_S):
        super().__init__(None, max_waiting)
        self.roles = list(roles)
        self.router_cfg = router
        self.recording = replica_traces is not None     # routes, requests, transfers kept for the trace
        self.pd = "prefill" in roles
        self.pd_min_prompt = pd_min_prompt
        self.metrics = metrics
        self.replica_traces = replica_traces
        precise = router.prefix_mode == "precise"
        opts = []
        for k in range(len(roles)):
            trace = str(replica_traces / f"replica-{k}.json.gz") if replica_traces is not None else None
            opts.append(dataclasses.replace(options, trace_out=trace, publish_cache=precise))
        # started from this thread (the parent-death signal follows the forking thread), loaded in parallel
        self.stall_s = stall_s
        self.replicas = [Replica(self, k, roles[k], opts[k], metrics.of(k) if metrics else None, max_waiting,
                                 stall_s) for k in range(len(roles))]
        errors: list[str] = []

        def start(k):
            try:
                self.replicas[k].wait_ready()
            except ConfigError as e:
                errors.append(str(e))
            except Exception as e:      # (an engine that never says why: still one line)
                errors.append(f"replica {k} could not start: {type(e).__name__}: {e}")
        threads = [threading.Thread(target=start, args=(k,)) for k in range(len(roles))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            for r in self.replicas:
                r.stop(10)
            raise ConfigError(errors[0])
        self.info = self.replicas[0].info
        self.router = Router(router, len(roles), [r.info.kv_blocks for r in self.replicas])
        self.block_size = self.info.block_size
        self.extra = extra_key(self.info.model, None)
        self._rid = itertools.count()
        self.routes: list[dict] = []
        self.transfers: dict[str, dict] = {}
        self.accepted: list[tuple] = []            # (rid, arrival_ms, prompt tokens, max tokens): the trace's requests
        self.rejected: list[tuple] = []            # (rid, t_ms, reason): refused at the router
        self.n_rejected = 0
        self.prefills: dict[str, _PrefillCopy] = {}   # disaggregated requests still in their prefill or handoff
        self.routed = [0] * len(roles)
        self.handoffs: queue.Queue = queue.Queue()
        self.draining = False
        self.deaths: list[dict] = []               # replicas that died: when, why, the requests they failed
        self.handoff_failures: list[tuple] = []    # (rid, t_ms, prefill replica, why): prefilled, never decoded
        self.moved_bytes = 0                       # KV bytes handed to decode replicas
        self._stopped = False
        self._handoff = threading.Thread(target=self._handoff_loop, name="pd-handoff", daemon=True)

    # ---- the EngineClient interface -------------------------------------------------------------
    def _send(self, msg):      # (never called: requests go to a replica)
        raise NotImplementedError

    def start(self):
        for r in self.replicas:
            r.start()
        self._handoff.start()

    def alive(self) -> bool:
        """Some request can still be served: a replica up (disaggregated: a decode replica, and a
        prefill replica unless short prompts run whole on the decode side)."""
        up = {r.role for r in self.replicas if r.alive()}
        if not self.pd:
            return bool(up)
        return "decode" in up and ("prefill" in up or self.pd_min_prompt > 0)

    def failure(self) -> str | None:
        """Why the fleet can serve nothing ever again (None while it can, or may once a replica out
        of rotation for a stall sends again)."""
        if self._stopping or self.alive():
            return None
        up = {r.role for r in self.replicas if r.running()}
        if up and (not self.pd or ("decode" in up and ("prefill" in up or self.pd_min_prompt > 0))):
            return None
        return "no replica can serve: " + "; ".join(r.failure() or f"replica {r.index} stopped"
                                                    for r in self.replicas if not r.alive())

    def check_stalls(self) -> list[str]:
        """Take out of rotation each replica that holds requests and has sent nothing for the
        stall timeout (ProcessClient.check_stall): its requests get a 503 naming it and why."""
        return [why for r in self.replicas if (why := r.check_stall())]

    def load(self) -> dict:
        loads = [r.load() for r in self.replicas]
        return {"running": sum(x["running"] for x in loads), "waiting": sum(x["waiting"] for x in loads),
                "kv_usage": sum(x["kv_usage"] for x in loads) / len(loads)}

    def served(self) -> dict | None:
        got = [r.served() for r in self.replicas]
        if any(g is None for g in got):
            return None
        return {"requests": len(self.accepted), "steps": sum(g["steps"] for g in got)}

    def health(self) -> list[dict]:
        return [{"replica": r.index, "role": r.role, "up": r.alive(), "pid": r.proc.pid,
                 "stalled": r.stall is not None, "why": None if r.alive() else r.failure()} for r in self.replicas]

    # ---- routing --------------------------------------------------------------------------------
    def _hashes(self, ids: list[int]) -> list:
        return prompt_hashes(ids, self.block_size, self.extra)

    def _choose(self, role: str, ids: list[int], hashes, now: float, exclude=()):
        cands = [r for r in self.replicas if r.role == role and r.alive() and r.index not in exclude]
        if not cands:
            downs = [r.failure() or f"replica {r.index} stopped" for r in self.replicas if r.role == role]
            return None, [], f"no {role if role != 'both' else ''} replica is up".replace("  ", " ") + (
                f" ({'; '.join(downs)})" if downs else "")
        sigs = [signals_of(self.router, r.index, r.board, r.info.kv_blocks, hashes, now) for r in cands]
        d, why = decide(self.router, sigs, len(ids) // self.block_size, lambda _: hashes)
        return d, sigs, why

    def submit(self, s: Stream, kv=None, kv_out: bool = False) -> None:
        with self._lock:
            if self._stopping and not self.draining:
                raise ServerStopping("the server is shutting down")
            s.rid = s.rid or f"req-{next(self._rid)}"     # (an X-Request-Id the server took, or ours)
            now = self.now_ms()
            s.arrival_ms = now
            if self.draining:       # refused, and in the trace as a rejection (finish reason rejected)
                self._reject(s, now, "the fleet is draining: it admits no new requests")
                raise ServerStopping("the fleet is draining: it admits no new requests")
            split = self.pd and len(s.prompt_ids) >= self.pd_min_prompt
            role = "prefill" if split else ("decode" if self.pd else "both")
            hashes = self._hashes(s.prompt_ids) if self.router_cfg.prefix_mode else []
            d, dd, sigs = self._place(s, role, split, hashes, now)
            # (as the simulator records it: at most RECORDED_SIGNALS replicas, the chosen first)
            ev = route_event(now, s.rid, self.router_cfg.policy, d, sigs, len(s.prompt_ids) // self.block_size,
                             dd if split else None)
            self.routed[d.replica] += 1
            if split:                # (the decode replica holds it too)
                self.routed[dd.replica] += 1
            if self.recording:
                self.routes.append(ev)
                self.accepted.append((s.rid, s.arrival_ms, len(s.prompt_ids), s.max_tokens))

    def _place(self, s: Stream, role: str, split: bool, hashes: list, now: float):
        """Choose a replica (split: and a decode replica) and send the request there: (decision,
        decode decision or None, signals). A replica that stopped between the choice and the send is
        left out and the choice made again; no replica, or a full queue, rejects the request."""
        tried: set[int] = set()
        while True:
            d, sigs, why = self._choose(role, s.prompt_ids, hashes, now, tried)
            dd = None
            if d is not None and split:
                dd, dsigs, why = self._choose("decode", s.prompt_ids, hashes, now)
                sigs = sigs + dsigs
            if d is None or (split and dd is None):
                self._reject(s, now, why)
                raise ServerStopping(why)
            if self._send(s, d.replica, dd, split, now, tried):
                return d, dd, sigs

    def _send(self, s: Stream, replica: int, dd, split: bool, now: float, tried: set[int]) -> bool:
        """Send the request to its chosen replica: False when it stopped meanwhile (added to `tried`)."""
        rep = self.replicas[replica]
        try:
            if split:
                self._prefill(s, rep, dd.replica, now)
            else:
                rep.board.tell(now, "requests", 1)
                rep.submit(s)
            return True
        except ServerStopping:       # it died between the check and the send: choose again
            if not split:
                rep.board.tell(now, "requests", -1)
            tried.add(replica)
            return False
        except Overloaded as e:     # its waiting queue is full: 503, and a rejection in the trace
            if not split:
                rep.board.tell(now, "requests", -1)
            why = f"replica {replica}: {e}"
            self._reject(s, now, why)
            e.args = (why,)        # (the replica's own limit, named)
            raise

    def _reject(self, s: Stream, now: float, why: str):
        """A request refused before any replica took it (no replica, a queue limit, a full queue):
        counted, and in the trace a route to -1 with the reason and a `rejected` finish."""
        self.n_rejected += 1
        if self.recording:
            self.rejected.append((s.rid, now, why))
            self.routes.append(rejected_event(now, s.rid, self.router_cfg.policy, why))
            self.accepted.append((s.rid, now, len(s.prompt_ids), s.max_tokens))

    def _prefill(self, s: Stream, rep: Replica, decode: int, now: float):
        copy = _PrefillCopy(s.rid, list(s.prompt_ids), 1, s.sampling, (), None)
        copy.client, copy.src, copy.decode, copy.fleet = s, rep.index, decode, self
        rep.board.tell(now, "requests", 1)
        self.replicas[decode].board.tell(now, "requests", 1)     # it will hold this request
        self.prefills[s.rid] = copy
        try:
            rep.submit(copy, kv_out=True)
        except (ServerStopping, Overloaded):
            self.prefills.pop(s.rid, None)
            rep.board.tell(now, "requests", -1)
            self.replicas[decode].board.tell(now, "requests", -1)
            raise

    def cancel(self, s: Stream, reason: str = "abort") -> None:
        copy = self.prefills.get(s.rid)
        if copy is not None:        # still in its prefill: cancel that (its abort ends the client's stream)
            for r in self.replicas:
                if copy.rid in r.streams:
                    r.cancel(copy, reason)
            return
        for r in self.replicas:
            if s.rid in r.streams:
                r.cancel(s, reason)

    # ---- disaggregated handoff (its own thread: replicas' readers never wait on each other) --------
    def _handoff_loop(self):
        while True:
            item = self.handoffs.get()
            if item is None:
                return
            copy, ev = item
            try:
                self._handoff_one(copy, ev)
            except Exception as e:    # one request's handoff must not end the fleet's
                self._fail(copy, f"disaggregated handoff failed: {type(e).__name__}: {e}", 500)

    def _fail(self, copy: _PrefillCopy, message: str, status: int):
        """A disaggregated request that will not reach a decode replica: its client gets `message`."""
        if self.prefills.pop(copy.rid, None) is None:
            return
        now = self.now_ms()
        self.replicas[copy.decode].board.tell(now, "requests", -1)
        if self.recording:
            self.handoff_failures.append((copy.rid, now, copy.src, message))
        copy.client.done = True
        copy.client.push(Failed(copy.rid, message, status))

    def _handoff_one(self, copy: _PrefillCopy, ev):
        if isinstance(ev, Failed):
            self._fail(copy, f"prefill: {ev.message}", ev.status)
        elif isinstance(ev, RequestOutput) and ev.finish_reason is not None and ev.finish_reason != "length":
            if ev.finish_reason == "abort" and self.prefills.pop(copy.rid, None) is not None:
                self.replicas[copy.decode].board.tell(self.now_ms(), "requests", -1)
                if self.recording:
                    self.handoff_failures.append((copy.rid, ev.t_ms, copy.src, "abort"))
                copy.client.done = True
                copy.client.push(RequestOutput(copy.rid, [], "", ev.t_ms, "abort", ev.detail))
            else:
                self._fail(copy, f"prefill ended {ev.finish_reason}" + (f": {ev.detail}" if ev.detail else ""), 500)
        elif isinstance(ev, KVReady):
            self._to_decode(copy, ev)

    def _to_decode(self, copy: _PrefillCopy, ev: KVReady):
        """Hand the prefilled request to its decode replica (another one if it died meanwhile).
        The request stays in `prefills` until a decode replica has it, so whatever fails on the
        way (a full decode queue, no decode replica left, an error) answers its client."""
        if self.prefills.get(copy.rid) is not copy:
            return
        blob = ev.kv
        tried: set[int] = set()
        while True:
            dst = self.replicas[copy.decode]
            if not dst.alive() or dst.index in tried:   # its decode replica died meanwhile: another one
                tried.add(dst.index)
                with self._lock:
                    d, _, why = self._choose("decode", copy.prompt_ids, [], self.now_ms(), tried)
                if d is None:
                    self._fail(copy, f"no decode replica for the prefilled request: {why}", 503)
                    return
                now = self.now_ms()
                dst.board.tell(now, "requests", -1)
                copy.decode = d.replica
                self.replicas[d.replica].board.tell(now, "requests", 1)
                continue
            xfer = {"type": "transfer", "t_ms": blob.t_start_ms, "req": copy.rid, "src": copy.src,
                    "dst": dst.index, "bytes": blob.nbytes, "blocks": -(-blob.tokens // self.block_size),
                    "dur_ms": None, "tokens": blob.tokens, "copy_ms": blob.t_sent_ms - blob.t_start_ms}
            self.transfers[copy.rid] = xfer
            try:
                dst.submit(copy.client, kv=blob)
            except ServerStopping:
                self.transfers.pop(copy.rid, None)
                tried.add(dst.index)
                continue
            except Overloaded as e:
                self.transfers.pop(copy.rid, None)
                self._fail(copy, f"decode replica {dst.index}: {e}", 503)
                return
            self.prefills.pop(copy.rid, None)
            self.moved_bytes += blob.nbytes
            return

    def kv_loaded(self, replica: int, ev: KVLoaded):
        t = self.transfers.get(ev.rid) if self.recording else self.transfers.pop(ev.rid, None)
        if t is not None:
            t["dur_ms"] = max(0.0, ev.t_recv_ms - t["t_ms"])
            t["written_ms"] = ev.t_written_ms
            t["bytes_written"] = ev.bytes

    # ---- draining and stopping -----------------------------------------------------------------
    def begin_drain(self):
        with self._lock:
            self.draining = True

    def in_flight(self) -> int:
        """Clients' requests not yet answered: on a replica, or in their prefill or handoff."""
        return sum(1 for r in self.replicas if r.alive() for st in list(r.streams.values())
                   if not isinstance(st, _PrefillCopy)) + len(self.prefills)

    def wait_drained(self, timeout_s: float, poll_s: float = 0.05) -> bool:
        """Until nothing is in flight (True) or `timeout_s` passed (False)."""
        end = time.monotonic() + timeout_s
        while self.in_flight():
            if time.monotonic() > end:
                return False
            time.sleep(poll_s)
        return True

    def stop(self, timeout_s: float = 30.0):
        """Stop every replica (their unfinished requests end "abort"), once."""
        with self._lock:
            self._stopping = True
            if self._stopped:
                return
            self._stopped = True
        threads = [threading.Thread(target=r.stop, args=(timeout_s,)) for r in self.replicas]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.handoffs.put(None)
        for copy in list(self.prefills.values()):
            self._fail(copy, "the server stopped", 503)

    # ---- the fleet's trace ----------------------------------------------------------------------
    def trace(self, label: str | None = None):
        """The fleet trace: the replicas' own traces (written as they stopped) merged on the front
        end's clock with its request table, routes and transfers (core.fleet.merge)."""
        from core.fleet.merge import merge_replicas
        from core.trace.model import frame
        from core.trace.schema import REQUEST
        rid, arr, p_tok, m_tok = (list(c) for c in zip(*self.accepted)) if self.accepted else ([], [], [], [])
        requests = frame(REQUEST, {"id": rid, "arrival_ms": arr, "prompt_tokens": p_tok, "max_output_tokens": m_tok})
        fleet = {"router": self.router_cfg.to_dict(), "clock": CLOCK}
        if self.pd:
            fleet |= {"pd_min_prompt": self.pd_min_prompt, "first_token": FIRST_TOKEN,
                      "link": {"kind": "pipes through the front end (loopback IPC)", "gbps": None,
                               "latency_ms": None, "kv_bytes_per_token": self.kv_bytes_per_token(), "model":
                               self.info.model}}
        other = self.routes + list(self.transfers.values())
        tr = merge_replicas(self._replica_traces(), roles=self.roles, requests=requests, other=other, fleet=fleet,
                            label=label or self._label(), one_clock=CLOCK)
        tr.meta["source"] = "measured"
        self._add_front_end_finishes(tr, {r: i for i, r in enumerate(rid)})
        self._add_streamed_tokens(tr, {r: i for i, r in enumerate(rid)})
        if self.rejected:
            tr.meta.setdefault("stats", {})["rejected"] = len(self.rejected)
        if self.deaths:
            notes = [tr.meta["notes"]] if isinstance(tr.meta.get("notes"), str) and tr.meta["notes"] else []
            tr.meta["notes"] = "; ".join(notes + [_death_note(d) for d in self.deaths])
        return tr

    def _replica_traces(self) -> list:
        """Each replica's own trace (one that served nothing wrote none: an empty one, its meta as another's)."""
        from core.trace import load_trace
        from core.trace.model import Trace, empty
        from core.trace.schema import REQUEST
        traces = []
        for k in range(len(self.replicas)):
            p = self.replica_traces / f"replica-{k}.json.gz" if self.replica_traces is not None else None
            if p is not None and p.exists():
                traces.append(load_trace(p))
            else:      # a replica that served nothing writes no trace
                traces.append(Trace(meta={}, requests=empty(REQUEST)))
        base = next((t for t in traces if t.meta), None)
        if base is not None:
            traces = [t if t.meta else Trace(meta=dict(base.meta), requests=empty(REQUEST)) for t in traces]
        return traces

    def _add_front_end_finishes(self, tr, row: dict) -> None:
        """Finishes only the front end saw: rejected at the router (replica -1), failed by a dying replica."""
        import pandas as pd

        from core.trace.model import frame
        from core.trace.schema import FINISH
        ended = set(tr.finishes["req"].tolist())
        add = [(t, row[r], "rejected", -1) for r, t, _ in self.rejected]
        add += [(t, row[r], "abort" if why == "abort" else "error", src) for r, t, src, why in self.handoff_failures
                if r in row and row[r] not in ended]
        ended |= {a[1] for a in add}
        add += [(d["t_ms"], row[r], "error", d["replica"]) for d in self.deaths for r in dict.fromkeys(d["failed"])
                if r in row and row[r] not in ended]
        if add:
            t, req, reason, rep = (list(c) for c in zip(*add))
            fin = frame(FINISH, {"t_ms": t, "req": req, "reason": reason, "replica": rep})
            tr.finishes = pd.concat([tr.finishes, fin], ignore_index=True).sort_values("t_ms", kind="stable") \
                .reset_index(drop=True)

    def _add_streamed_tokens(self, tr, row: dict) -> None:
        """A request a dying replica failed keeps the tokens that reached its client, as the front end
        delivered them (the replica's own trace ends at its last rewrite, before some of them)."""
        import numpy as np
        import pandas as pd

        from core.trace.model import frame
        from core.trace.schema import TOKEN
        got = {row[r]: (d["replica"], parts) for d in self.deaths for r, parts in (d.get("streamed") or {}).items()
               if r in row}
        if not got:
            return
        t, req, index, rep = [], [], [], []
        for j, (k, parts) in got.items():
            n = sum(c for _, c in parts)
            t += [ms for ms, c in parts for _ in range(c)]
            req += [j] * n
            index += list(range(n))
            rep += [k] * n
        add = frame(TOKEN, {"t_ms": t, "req": req, "index": index, "replica": rep})
        keep = tr.tokens[~np.isin(tr.tokens["req"].to_numpy(), list(got))]
        tr.tokens = pd.concat([keep, add], ignore_index=True).sort_values("t_ms", kind="stable").reset_index(drop=True)

    def kv_bytes_per_token(self) -> int | None:
        done = [t for t in self.transfers.values() if t.get("tokens")]
        return done[0]["bytes"] // done[0]["tokens"] if done else None

    def _label(self) -> str:
        if self.pd:
            shape = f"{self.roles.count('prefill')}P:{self.roles.count('decode')}D"
        else:
            shape = f"{len(self.roles)} replicas"
        return f"{shape}, {self.router_cfg.policy} (measured, gpu_runner fleet)"


def _death_note(d: dict) -> str:
    """A replica taken out of rotation (stalled) or dead, in the trace's notes."""
    if d.get("stalled"):
        return (f"replica {d['replica']} was taken out of rotation at {d['t_ms']:.1f} ms ({d['why']}): the "
                f"{len(d['failed'])} requests it held end 'error' there, as the front end saw them")
    return (f"replica {d['replica']} died at {d['t_ms']:.1f} ms ({d['why']}): its events after its trace's "
            f"last rewrite (about once a second) are missing, except the tokens the front end delivered to the "
            f"clients of the {len(d['failed'])} requests it failed, which "
            "end 'error' there, as the front end saw them")
