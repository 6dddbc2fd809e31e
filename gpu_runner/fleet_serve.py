"""`python -m gpu_runner fleet`'s front end: the fleet (gpu_runner.fleet.FleetClient) behind serve's
HTTP app, /health and /metrics of the fleet with the router's own series, SIGTERM's drain, the
command's options and its main."""
from __future__ import annotations

import threading
from pathlib import Path

from core.errors import ConfigError
from gpu_runner.fleet import FleetClient
from gpu_runner.launch import ServeOptions


# ---- the front end: HTTP (serve's App), /health and /metrics of the fleet, drain on SIGTERM -------------
class _RouterCollector:
    """The router's own series, read from the fleet at each scrape."""

    def __init__(self, fc: FleetClient, model: str):
        self.fc, self.model = fc, model

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
        fc = self.fc
        up = GaugeMetricFamily("gpu_runner:replica_up", "1 while the replica's engine process runs and is in "
                               "rotation (0: ended, or out for a stall)", labels=["model_name", "replica", "role"])
        stalls = CounterMetricFamily("gpu_runner:replica_stalls", "Times the replica was taken out of rotation "
                                     "for making no progress (--replica-stall-s)", labels=["model_name", "replica"])
        routed = CounterMetricFamily("gpu_runner:router_requests", "Requests the router sent to each replica "
                                     "(disaggregated: its prefill and its decode replica each count it)",
                                     labels=["model_name", "replica"])
        for r in fc.replicas:
            up.add_metric([self.model, str(r.index), r.role], 1.0 if r.alive() else 0.0)
            routed.add_metric([self.model, str(r.index)], fc.routed[r.index])
            stalls.add_metric([self.model, str(r.index)], r.stalls)
        rej = CounterMetricFamily("gpu_runner:router_rejected", "Requests refused at the router (no replica up, "
                                  "queue limit)", labels=["model_name"])
        rej.add_metric([self.model], fc.n_rejected)
        moved = CounterMetricFamily("gpu_runner:kv_transfer_bytes", "KV bytes handed to decode replicas",
                                    labels=["model_name"])
        moved.add_metric([self.model], fc.moved_bytes)
        yield from (up, stalls, routed, rej, moved)


def fleet_app(fc: FleetClient, served: str, metrics):
    """serve's App over the fleet: /health lists the replicas, /metrics has a `replica` label."""
    import json

    from starlette.responses import Response

    from gpu_runner.server import App

    class FleetApp(App):
        async def health(self, request):
            reps = fc.health()
            ok = fc.alive() and not fc.draining     # (disaggregated: a prefill and a decode replica up)
            body = json.dumps({"serving": ok, "draining": fc.draining, "replicas": reps})
            return Response(body, 200 if ok else 503, media_type="application/json")

        async def prom(self, request):
            for r in fc.replicas:
                if r.metrics is not None and r.alive():     # (a dead replica's gauges are gone: ServerMetrics.gone)
                    r.metrics.idle(**r.load())
            return Response(metrics.render(), 200, media_type="text/plain; version=0.0.4; charset=utf-8")
    metrics.registry.register(_RouterCollector(fc, served))
    return FleetApp(fc, served, metrics)


def serve_fleet(fc: FleetClient, app, host: str, port: int, drain_timeout_s: float, ready=None) -> str | None:
    """Run the front end until a signal: the first SIGTERM / SIGINT drains (no new requests,
    in-flight ones finish, at most drain_timeout_s), a second stops at once; then the replicas
    stop. Every replica gone by itself also ends it: returns why (None after a signal)."""
    import logging
    import signal

    import uvicorn
    log = logging.getLogger("gpu_runner.fleet")

    class _Server(uvicorn.Server):
        def handle_exit(self, sig, frame):
            # (never uvicorn's own: it re-raises the signals it caught once the server stops, which
            # would end the process before the fleet trace is written)
            if fc.draining or sig not in (signal.SIGTERM, signal.SIGINT):
                print("gpu_runner fleet: stopping now (unfinished requests end 'abort')", flush=True)
                threading.Thread(target=stop_then_exit, name="stop", daemon=True).start()
                return
            fc.begin_drain()
            print(f"gpu_runner fleet: draining ({fc.in_flight()} requests in flight, up to {drain_timeout_s:g} s; "
                  "a second signal stops at once)", flush=True)

            def drain():
                if not fc.wait_drained(drain_timeout_s):
                    log.warning("drain timed out with %d requests in flight: they end 'abort'", fc.in_flight())
                stop_then_exit()
            threading.Thread(target=drain, name="drain", daemon=True).start()

    def stop_then_exit():
        """The replicas stop first (each unfinished request gets its 'abort' finish, streamed to its
        client while the HTTP server still runs), then the HTTP server ends."""
        fc.begin_drain()
        fc.stop()
        server.should_exit = True

    config = uvicorn.Config(app.app, host=host, port=port, log_level="warning", access_log=False,
                            timeout_graceful_shutdown=5, lifespan="off")
    server = _Server(config)
    # (a stall is logged by check_stalls, its requests answered 503)
    from gpu_runner.server import run_watched
    return run_watched(server, fc, "fleet-watch", "%s; the fleet exits (status 1)", tick=fc.check_stalls, ready=ready)


def _check_port(host: str, port: int):
    import socket
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
    except OSError as e:
        raise ConfigError(f"--port {port}: cannot listen on {host}:{port} ({e.strerror or e})") from None


def replica_trace_dir(trace_out) -> Path:
    """TRACE_OUT.replicas/, emptied of an earlier run's replica traces: this run merges only what
    its own replicas write (a replica that serves nothing writes none)."""
    d = Path(str(trace_out) + ".replicas")
    try:
        d.mkdir(parents=True, exist_ok=True)
        for f in d.iterdir():
            if f.is_file() and f.name.startswith(("replica-", ".partial-")) and ".json" in f.name:
                f.unlink()
    except OSError as e:
        raise ConfigError(f"--trace-out {trace_out}: cannot prepare the replicas' trace directory {d} "
                          f"({e.strerror or e})") from None
    return d


def roles_of(a) -> list[str]:
    if a.prefill_replicas or a.decode_replicas:
        if not (a.prefill_replicas and a.decode_replicas):
            raise ConfigError("--prefill-replicas and --decode-replicas go together (disaggregated serving)")
        if a.replicas:
            raise ConfigError("--replicas: give either --replicas N or --prefill-replicas P --decode-replicas D")
        return ["prefill"] * a.prefill_replicas + ["decode"] * a.decode_replicas
    return ["both"] * (a.replicas or 2)


def main_fleet(a, options: ServeOptions) -> int:
    import logging
    import sys

    from core.cli import check_writable, write_output
    from core.fleet.options import router_from_args
    from core.trace import save_trace
    from gpu_runner.server_metrics import ServerMetrics
    roles = roles_of(a)
    _check_port(a.host, a.port)     # before the replicas spend seconds loading
    if options.model.speculative and "prefill" in roles:
        raise ConfigError("--speculative: disaggregated replicas do not speculate (the draft's KV is not moved)")
    rc = router_from_args(a)
    traces = None
    if a.trace_out:
        check_writable(a.trace_out, "--trace-out")
        traces = replica_trace_dir(a.trace_out)
    served = a.served_model_name or options.model.model
    metrics = ServerMetrics(served, replicas=len(roles))
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    fc = FleetClient(options, roles, rc, metrics, a.max_waiting, a.pd_min_prompt or 0, traces, a.replica_stall_s)
    app = fleet_app(fc, served, metrics)
    info = fc.info

    def ready(_):
        shape = (f"{roles.count('prefill')} prefill + {roles.count('decode')} decode replicas" if fc.pd
                 else f"{len(roles)} replicas")
        print(f"gpu_runner fleet: {served} on http://{a.host}:{a.port}: {shape}, router {rc.policy} "
              f"(staleness {rc.staleness_ms:g} ms); each {info.policy}, {info.kv_blocks} KV blocks of "
              f"{info.block_size}; Ctrl-C / SIGTERM drains", flush=True)
    died = serve_fleet(fc, app, a.host, a.port, a.drain_timeout_s, ready)
    if a.trace_out and fc.accepted:
        tr = fc.trace(a.label)
        write_output(a.trace_out, lambda p: save_trace(tr, p), "--trace-out")
        per = tr.finishes.groupby("replica").size().to_dict()
        print(f"wrote {a.trace_out}: {len(tr.requests)} requests (finished per replica: "
              + ", ".join(f"{k}: {per.get(k, 0)}" for k in range(len(roles)))
              + f"), {len(tr.steps)} steps, {len(tr.events_of('transfer'))} KV transfers; the replicas' own traces "
              f"in {traces}", flush=True)
    elif a.trace_out:
        print(f"gpu_runner fleet: no request was accepted; {a.trace_out} not written", flush=True)
    if died:
        print(f"error: {died}; exiting with status 1", file=sys.stderr, flush=True)
        return 1
    return 0
