"""python -m gpu_runner capture|generate|serve|fleet|loadgen|observe|export-hf ...  (run with -h for each command).

Bad arguments or files exit with code 2 and one line on stderr.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from core.cli import Parser as _Parser
from core.cli import Progress, check_writable, write_output
from core.cli import positive_int as _pos_int
from core.config import SamplingParams, SchedulerConfig, add_flags, from_args
from core.trace import save_trace
from gpu_runner.launch import ModelOptions, ServeOptions, build_engine, load_model, serve_engine


def _common(p, scheduler: bool):
    from gpu_runner.options import EngineConfig
    add_flags(p, ModelOptions)
    add_flags(p, SamplingParams)
    if scheduler:
        add_flags(p, SchedulerConfig)
        add_flags(p, EngineConfig)
    else:
        add_flags(p, EngineConfig, skip=("kv_memory_mb", "record", "capture_tiles"))


def _http_flags(p, max_waiting_help: str):
    """The HTTP front end's flags (serve, fleet)."""
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback; 0.0.0.0 = every interface)")
    p.add_argument("--port", type=_pos_int, default=8000)
    p.add_argument("--served-model-name", help="the model name clients send (default: --model)")
    p.add_argument("--max-waiting", type=_pos_int, default=256, help=max_waiting_help)


def build_parser():
    ap = _Parser(prog="python -m gpu_runner", description="Serve workloads with a real model on the core scheduler.")
    sub = ap.add_subparsers(dest="cmd", required=True, parser_class=_Parser)
    c = sub.add_parser("capture", help="serve a workload and write a measured trace")
    c.add_argument("--workload", required=True, help="workload file (JSON with prompt text/ids/counts, CSV, JSONL)")
    c.add_argument("--out", required=True, help="trace to write (.json, .json.gz, .parquet)")
    c.add_argument("--label", help="trace label (meta.label)")
    _common(c, scheduler=True)
    g = sub.add_parser("generate", help="continue one prompt")
    src = g.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="prompt text")
    src.add_argument("--prompt-ids", help="comma-separated token ids")
    g.add_argument("--max-tokens", type=_pos_int, default=64)
    g.add_argument("--json", action="store_true", help='print {"ids": [...], "text": ...} for the generated tokens')
    _common(g, scheduler=False)
    v = sub.add_parser("serve", help="an OpenAI-compatible HTTP server (completions, chat, /metrics)")
    _http_flags(v, "requests waiting at most; more get 503 with Retry-After")
    v.add_argument("--trace-out", help="record a measured trace here (.json, .json.gz, .parquet), rewritten "
                   "atomically about once a second while idle (less often when a rewrite would take over 5%% "
                   "of the engine's time; every 30 s at most while requests are in flight: a rewrite stalls "
                   "them) and at shutdown")
    v.add_argument("--engine-process", action=argparse.BooleanOptionalAction, default=True,
                   help="run the engine in its own process, as vLLM does (default); --no-engine-process keeps "
                   "it in a thread of the HTTP server, which then shares the interpreter lock with it")
    _common(v, scheduler=True)
    fl = sub.add_parser("fleet", help="several engine processes behind one OpenAI-compatible front end and the "
                                      "simulator's router; disaggregated prefill/decode with the KV really moved")
    _http_flags(fl, "per replica: requests waiting at most; more get 503 with Retry-After")
    fl.add_argument("--trace-out", help="the fleet's measured trace, written at shutdown (.json, .json.gz, "
                    ".parquet); each replica's own trace is rewritten in TRACE_OUT.replicas/ as serve's --trace-out is")
    fl.add_argument("--label", help="the fleet trace's label")
    from core.fleet.options import add_real_fleet_flags
    add_real_fleet_flags(fl)
    fl.add_argument("--drain-timeout-s", type=float, default=60.0,
                    help="on SIGTERM / Ctrl-C, wait at most this long for in-flight requests (default 60)")
    from core.cli import positive_float
    from gpu_runner.engine_process import REPLICA_STALL_S
    fl.add_argument("--replica-stall-s", type=positive_float, default=REPLICA_STALL_S, metavar="S",
                    help="a replica holding requests whose engine process sent nothing for S seconds is taken out "
                    "of rotation, its requests answered 503 naming it (it sends at least every 0.5 s while busy, "
                    f"however long a step; default {REPLICA_STALL_S:g}); at shutdown a replica silent that long is "
                    "killed")
    _common(fl, scheduler=True)
    from gpu_runner.observe import add_telemetry_flags
    lg = sub.add_parser("loadgen", help="load an OpenAI-compatible server (ours, vLLM, SGLang) and write a "
                        "measured trace of what the client saw")
    lg.add_argument("--url", required=True, help="the server, e.g. http://127.0.0.1:8000")
    lg.add_argument("--workload", required=True, help="workload file (JSON with prompt text/ids/counts, CSV, JSONL)")
    lg.add_argument("--out", required=True, help="trace to write (.json, .json.gz, .parquet)")
    lg.add_argument("--rate", type=float, help="open loop: Poisson arrivals at this many requests/s "
                    "(default: the workload's own arrival times)")
    lg.add_argument("--concurrency", type=_pos_int, help="closed loop: this many requests in flight")
    lg.add_argument("--model", help="model name to send (default: the first of /v1/models)")
    lg.add_argument("--temperature", type=float, default=0.0)
    lg.add_argument("--seed", type=int, default=0, help="seed of the Poisson arrivals")
    lg.add_argument("--metrics-interval", type=float, default=0.2, help="seconds between /metrics samples")
    lg.add_argument("--request-timeout", type=float, default=600.0,
                    help="seconds from a request's send to its finish; past it the request is recorded as failed "
                         "(a server that sends headers, keep-alives or tokens but never finishes)")
    add_telemetry_flags(lg, metrics_default=False)   # the server's own side, recorded into the same trace
    o = sub.add_parser("observe", help="record what a running server emits (KV events, OTLP spans, /metrics) "
                       "without sending it load")
    add_telemetry_flags(o)
    o.add_argument("--out", required=True, help="trace to write (.json, .json.gz, .parquet), rewritten as it runs")
    o.add_argument("--duration", type=float, help="stop after this many seconds (default: at Ctrl-C / SIGTERM)")
    o.add_argument("--flush-interval", type=float, default=2.0, help="seconds between rewrites of --out")
    x = sub.add_parser("export-hf", help="write a model as a Hugging Face Llama checkpoint (for vLLM, transformers)")
    x.add_argument("--model", default="tiny", help="tiny | tiny-draft | a local HF checkpoint dir")
    x.add_argument("--out", required=True, help="directory to write config.json + model.safetensors into")
    x.add_argument("--eos-token-id", type=int, default=257, help="end-of-sequence id (byte models: 257)")
    x.add_argument("--bos-token-id", type=int, default=256, help="beginning-of-sequence id (byte models: 256)")
    return ap


def engine_config(a, **overrides):
    """EngineConfig from parsed flags: every option group from its own declaration."""
    from gpu_runner.options import EngineConfig
    sched = from_args(SchedulerConfig, a) if hasattr(a, "policy") else SchedulerConfig()
    return from_args(EngineConfig, a, scheduler=sched, sampling=from_args(SamplingParams, a), **overrides)


def cmd_capture(a) -> int:
    from core.workload import load_workload
    check_writable(a.out, "--out")  # before minutes of work, not after
    engine = build_engine(from_args(ModelOptions, a), engine_config(a))
    tok = engine.tok
    w = load_workload(a.workload, tokenize=tok.encode if tok is not None else None)
    t0 = time.perf_counter()
    tr, outputs = engine.run(w, progress=Progress())
    secs = time.perf_counter() - t0
    n_tok = sum(len(v) for v in outputs.values())
    if tr is None:
        print(f"served {len(w)} requests, {n_tok} tokens in {secs:.2f} s (recording off; nothing written)")
        return 130 if engine.interrupted else 0
    if a.label:
        tr.meta["label"] = a.label
    write_output(a.out, lambda p: save_trace(tr, p), "--out")
    if engine.interrupted:
        done = len(tr.finishes)
        print(f"interrupted: wrote the partial trace to {a.out} ({done} of {len(w)} requests finished, "
              f"{n_tok} tokens, {len(tr.steps)} steps); unfinished requests have no finish event", file=sys.stderr)
        return 130
    print(f"wrote {a.out}: {len(w)} requests, {n_tok} tokens, {len(tr.steps)} steps, {len(tr.preempts)} preemptions "
          f"in {secs:.2f} s on {tr.meta['device']}")
    return 0


def cmd_generate(a) -> int:
    from core.errors import ConfigError
    from core.workload import Request, Workload
    from core.workload.files import parse_token_ids
    ids = parse_token_ids(a.prompt_ids, "--prompt-ids") if a.prompt_ids is not None else None
    engine = build_engine(from_args(ModelOptions, a), engine_config(a, record=False))
    model, tok = engine.model, engine.tok
    if a.prompt is not None:
        if tok is None:
            raise ConfigError(f"--prompt: the model at {a.model} has no tokenizer.json; use --prompt-ids")
        ids = tok.encode(a.prompt)
        if not ids:
            raise ConfigError("--prompt: empty prompt")
    else:
        bad = [i for i in ids if i >= model.cfg.vocab_size]
        if bad:
            raise ConfigError(f"--prompt-ids: id {bad[0]} is outside the vocabulary (size {model.cfg.vocab_size})")
    w = Workload([Request("prompt", 0.0, len(ids), a.max_tokens, prompt_ids=tuple(ids))], name="generate")
    _, out = engine.run(w)
    gen = out["prompt"]
    text = tok.decode(gen) if tok is not None else None
    if a.json:
        print(json.dumps({"ids": gen, "text": text}))
    else:
        print(text if text is not None else " ".join(map(str, gen)))
    return 0


def cmd_export_hf(a) -> int:
    from pathlib import Path

    from core.errors import InputError
    from gpu_runner.hf import export_hf
    model, _, _, name = load_model(a.model, "cpu", "float32")
    out = Path(a.out)
    if out.exists() and (out / "config.json").exists():
        raise InputError(f"--out {out}: already holds a checkpoint (config.json); choose an empty directory")
    write_output(out, lambda p: export_hf(model, p, eos_token_id=a.eos_token_id, bos_token_id=a.bos_token_id),
                 "--out")
    print(f"wrote {out}: {name} as a Llama checkpoint ({model.num_params():,} parameters, eos {a.eos_token_id})")
    return 0


def serve_options(a) -> ServeOptions:
    return ServeOptions(from_args(ModelOptions, a), engine_config(a), a.trace_out)


def cmd_serve(a) -> int:
    import logging

    from gpu_runner.server import App, serve
    from gpu_runner.server_metrics import ServerMetrics
    if a.trace_out:
        check_writable(a.trace_out, "--trace-out")
    served = a.served_model_name or a.model
    metrics = ServerMetrics(served)
    options = serve_options(a)
    if a.engine_process:
        from gpu_runner.engine_process import ProcessClient
        from gpu_runner.launch import pin
        se = ProcessClient(options, metrics, a.max_waiting)   # (its engine process pins itself to --cores)
        pin(options.model.cores, rest=True)                  # the HTTP server on the other cores
    else:
        from gpu_runner.client import InProcessClient
        se = InProcessClient(serve_engine(options), metrics, a.max_waiting,
                             Path(a.trace_out) if a.trace_out else None)
    app = App(se, served, metrics)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    where = "its own process" if a.engine_process else "a thread of the server"
    info = se.info

    def ready(_):
        print(f"gpu_runner serve: {served} on http://{a.host}:{a.port} ({info.policy}, {info.kv_blocks} KV blocks "
              f"of {info.block_size}, max_seqs {info.max_seqs}; engine in {where}); Ctrl-C stops", flush=True)
    died = serve(se, app, a.host, a.port, ready)
    done = se.served()
    if a.trace_out and done and done["requests"]:
        print(f"wrote {a.trace_out}: {done['requests']} requests, {done['steps']} steps", flush=True)
    if died:
        print(f"error: the engine stopped ({died}); exiting with status 1", file=sys.stderr, flush=True)
        return 1
    return 0


def cmd_fleet(a) -> int:
    import dataclasses
    import os

    from core.errors import InputError
    from gpu_runner.fleet_serve import main_fleet, roles_of
    options = serve_options(a)
    if options.model.cores is not None:
        raise InputError("--cores pins one engine (serve, capture); a fleet's replicas share the host's cores")
    if options.model.threads is None:     # replicas share the cores: torch would give each all of them
        n = len(roles_of(a))
        options = dataclasses.replace(options, model=dataclasses.replace(
            options.model, threads=max(1, (os.cpu_count() or 1) // n)))
    return main_fleet(a, dataclasses.replace(options, trace_out=None))


def cmd_observe(a) -> int:
    from gpu_runner.observe import main_observe
    return main_observe(a)


def cmd_loadgen(a) -> int:
    from gpu_runner.loadgen import main_loadgen
    return main_loadgen(a)


def main(argv=None) -> int:
    from core.cli import fail, run
    from core.errors import ConfigError
    from core.fleet.router import load_policies, router_modules
    try:
        load_policies(router_modules(sys.argv[1:] if argv is None else argv))
    except ConfigError as e:
        return fail(str(e))
    return run(build_parser(), {"capture": cmd_capture, "generate": cmd_generate, "export-hf": cmd_export_hf,
                                "serve": cmd_serve, "loadgen": cmd_loadgen, "observe": cmd_observe,
                                "fleet": cmd_fleet}, argv)


if __name__ == "__main__":
    sys.exit(main())
