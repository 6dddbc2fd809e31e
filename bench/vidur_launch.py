"""Run Vidur 0.0.26 offline on a Vidur-style trace CSV, with an affine step time equal to ours.

Executed by the Vidur virtual environment's interpreter (never by ours; see bench/vidur/README.md):

    /opt/vidur-venv/bin/python bench/vidur_launch.py prepare --cache-dir C
    /opt/vidur-venv/bin/python bench/vidur_launch.py run --cache-dir C --trace W.csv --out-dir D \
        [--num-blocks N] [--batch-metrics]

`prepare` writes the synthetic profile (below) and lets Vidur train its predictors once and cache
their predictions in C, so that timed `run`s load them like any warmed-up Vidur installation.
`run` simulates the trace and prints `VIDUR_SIM_END_S=<simulated s>` and
`VIDUR_OUTPUT_DIR=<dir>` as its last lines; the directory
holds request_metrics.csv (and batch_metrics.csv with --batch-metrics).

Step model. Vidur predicts a batch's time as num_layers x (sum of per-layer operator times),
each operator learned (here: linear regression) from profiling CSVs that it normally downloads
from the Hugging Face hub. We write those CSVs ourselves, laid out as a Hugging Face cache under
the predictor's cache_dir, and set HF_HUB_OFFLINE=1. Per layer (L layers):
  - `add` (keyed by the batch's token count)      = base_ms / L, a constant;
  - `attn_prefill` (per prefilling request)        = prefill_ms_per_token / L x chunk size;
  - `attn_decode` (keyed by decode batch size)     = decode_ms_per_seq / L x batch size;
  - every other operator                           = 0 (the decode batching overhead is set to 0).
So a batch takes base + prefill_ms_per_token x prompt tokens + decode_ms_per_seq x decoding
sequences, like our `--step-model affine`, with one difference Vidur imposes: it looks the prefill
time up at the chunk size rounded up to a multiple of 32, so a prefill overestimates by at most
31 x prefill_ms_per_token per prefilling request (0.62 ms at 0.02 ms/token). Decode batches agree
exactly.

Shim (runtime monkeypatches for 0.0.26, site-packages untouched):
  (a) SklearnExecutionTimePredictor declares `_get_kv_parallel_communication_time` abstract and
      LinearRegressionExecutionTimePredictor does not override it, so the predictor cannot be
      instantiated; we clear the subclass's `__abstractmethods__` (the inherited method body is
      used; it is only called with KV parallelism, which is off).
  (b) `Request.restart()` (on preemption) resets the processed-token counters but not
      `_num_stage_processed_tokens`, so the restarted request's next prefill trips an assertion;
      we wrap it to reset that counter too.

Outputs Vidur still writes with the flags used here (plots, chrome trace, JSON trace, batch,
utilization, operation and token metrics off; wandb off as no project is given): config.json,
request_metrics.csv, and per request-metric CDF/histogram CSVs and the request-completion time
series CSV under plots/ (no images).
"""
import argparse
import json
import os
import sys
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"  # before huggingface_hub is imported (by vidur)

MODEL = "meta-llama/Llama-3-8B"
DEVICE = "h100"
NETWORK_DEVICE = "h100_dgx"
ORG = "serving-explorer"
MAX_TOKENS = 8192        # largest batch token count / KV length Vidur looks up (= our token budget)
MAX_BATCH = 256          # largest decode batch Vidur looks up (= our max sequences)
MAX_PREFILL_CHUNK = 4096  # largest prefill (a restarted request re-prefills prompt + output)


def dataset_names(base_ms, prefill_ms, decode_ms):
    tag = f"affine-b{base_ms:g}-p{prefill_ms:g}-d{decode_ms:g}".replace(".", "_")
    return f"{ORG}/{tag}-llama-3-8b-h100", f"{ORG}/{tag}-h100-dgx"


def _hf_cache_snapshot(cache_dir: Path, repo_id: str) -> Path:
    """The snapshot folder of `repo_id` (a dataset) in the HF cache layout under `cache_dir`."""
    repo = cache_dir / ("datasets--" + repo_id.replace("/", "--"))
    commit = "0" * 40
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True, exist_ok=True)
    return snap


def write_profiles(cache_dir: Path, base_ms, prefill_ms, decode_ms):
    """Synthetic compute + network profiling datasets giving the affine step time (see docstring)."""
    import pandas as pd
    from vidur.config.model_config import BaseModelConfig

    m = BaseModelConfig.create_from_name(MODEL)
    L = m.num_layers
    compute_id, network_id = dataset_names(base_ms, prefill_ms, decode_ms)
    ops = ["attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj", "mlp_act",
           "input_layernorm", "post_attention_layernorm", "attn_rope", "add"]
    tokens = sorted(set(range(1, MAX_TOKENS + 1, 64)) | {MAX_TOKENS})
    mlp = pd.DataFrame({"num_tokens": tokens})
    for op in ops:
        mlp[f"time_stats.{op}.median"] = base_ms / L if op == "add" else 0.0
    mlp = mlp.assign(n_head=m.num_q_heads, n_kv_head=m.num_kv_heads, n_embd=m.embedding_dim,
                     n_expanded_embd=m.mlp_hidden_dim, use_gated_mlp=m.use_gated_mlp,
                     vocab_size=m.vocab_size, num_tensor_parallel_workers=1)

    kv_sizes = list(range(0, MAX_TOKENS + 1, 1024))
    rows = [dict(batch_size=1, prefill_chunk_size=c, kv_cache_size=kv,
                 **{"time_stats.attn_prefill.median": prefill_ms / L * c,
                    "time_stats.attn_decode.median": 0.0})
            for c in range(32, MAX_PREFILL_CHUNK + 1, 256) for kv in kv_sizes]
    rows += [dict(batch_size=b, prefill_chunk_size=0, kv_cache_size=kv,
                  **{"time_stats.attn_prefill.median": 0.0,
                     "time_stats.attn_decode.median": decode_ms / L * b})
             for b in range(1, MAX_BATCH + 1, 15) for kv in kv_sizes]
    attn = pd.DataFrame(rows).assign(**{"time_stats.attn_kv_cache_save.median": 0.0},
                                     n_embd=m.embedding_dim, n_q_head=m.num_q_heads,
                                     n_kv_head=m.num_kv_heads, block_size=16,
                                     num_tensor_parallel_workers=1)

    snap = _hf_cache_snapshot(cache_dir / "profiling_data" / "compute", compute_id)
    (snap / "config.json").write_text(json.dumps({"model": MODEL, "device_sku": DEVICE}))
    mlp.to_csv(snap / "mlp.csv.xz", index=False, compression="xz")
    attn.to_csv(snap / "attention.csv.xz", index=False, compression="xz")

    # Network profiles are only read with tensor or pipeline parallelism (off); present for completeness.
    snap = _hf_cache_snapshot(cache_dir / "profiling_data" / "network", network_id)
    (snap / "config.json").write_text(json.dumps({"sku": NETWORK_DEVICE}))
    net = pd.DataFrame({"size": [1024, 2048], "num_workers": 1, "devices_per_node": 1,
                        "collective": "all_reduce", "time_stats.all_reduce.median": 0.0,
                        "time_stats.send_recv.median": 0.0})
    net.to_csv(snap / "all_reduce.csv.xz", index=False, compression="xz")
    net.assign(collective="send_recv").to_csv(snap / "send_recv.csv.xz", index=False, compression="xz")


def apply_shim():
    from vidur.entities.request import Request
    from vidur.execution_time_predictor.linear_regression_execution_time_predictor import (
        LinearRegressionExecutionTimePredictor,
    )

    LinearRegressionExecutionTimePredictor.__abstractmethods__ = frozenset()  # (a)

    restart = Request.restart
    if not getattr(restart, "_serving_explorer_shim", False):
        def restart_resetting_stage_tokens(self):  # (b)
            restart(self)
            self._num_stage_processed_tokens = 0
        restart_resetting_stage_tokens._serving_explorer_shim = True
        Request.restart = restart_resetting_stage_tokens


def vidur_argv(a, trace, out_dir, num_blocks, batch_metrics):
    compute_id, network_id = dataset_names(a.base_ms, a.prefill_ms_per_token, a.decode_ms_per_seq)
    p = "--linear_regression_execution_time_predictor_config_"
    argv = [
        "--seed", "0", "--log_level", "warning",
        "--cluster_config_num_replicas", "1",
        "--replica_config_model_name", MODEL, "--replica_config_device", DEVICE,
        "--replica_config_network_device", NETWORK_DEVICE,
        "--replica_config_num_pipeline_stages", "1", "--replica_config_tensor_parallel_size", "1",
        "--cache_config_block_size", "16", "--cache_config_num_blocks", str(num_blocks),
        "--replica_scheduler_config_type", "vllm",
        "--vllm_scheduler_config_batch_size_cap", str(a.max_seqs),
        "--vllm_scheduler_config_max_tokens_in_batch", str(a.token_budget),
        "--request_generator_config_type", "trace_replay",
        "--trace_request_generator_config_trace_file", str(trace),
        "--trace_request_generator_config_date", "1970-01-01",
        "--trace_request_generator_config_prefill_scale_factor", "1",
        "--trace_request_generator_config_decode_scale_factor", "1",
        "--trace_request_generator_config_time_scale_factor", "1",
        "--trace_request_generator_config_max_tokens", str(MAX_TOKENS),
        "--execution_time_predictor_config_type", "linear_regression",
        p + "model_profiling_dataset", compute_id, p + "network_profiling_dataset", network_id,
        p + "cache_dir", str(a.cache_dir),
        p + "prediction_max_tokens_per_request", str(MAX_TOKENS),
        p + "prediction_max_batch_size", str(MAX_BATCH),
        p + "prediction_max_prefill_chunk_size", str(MAX_PREFILL_CHUNK),
        p + "attention_decode_batching_overhead_fraction", "0",
        # One linear fit per operator (the data are exactly linear). These List[bool] flags are
        # parsed with bool(str), so any non-empty word means True; the values are harmless here.
        p + "polynomial_degree", "1", p + "polynomial_include_bias", "True",
        p + "polynomial_interaction_only", "True", p + "fit_intercept", "True",
        p + "num_training_job_threads", "1",
        "--metrics_config_output_dir", str(out_dir),
        "--no-metrics_config_store_plots", "--no-metrics_config_enable_chrome_trace",
        "--no-metrics_config_write_json_trace", "--no-metrics_config_store_utilization_metrics",
        "--no-metrics_config_store_operation_metrics",
        "--no-metrics_config_store_token_completion_metrics",
        "--metrics_config_store_request_metrics",
    ]
    argv += (["--metrics_config_store_batch_metrics", "--metrics_config_keep_individual_batch_metrics"]
             if batch_metrics else ["--no-metrics_config_store_batch_metrics"])
    return argv


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("mode", choices=["prepare", "run"])
    ap.add_argument("--cache-dir", type=Path, required=True, help="Vidur predictor cache (profiles live here)")
    ap.add_argument("--trace", type=Path, help="run: Vidur-style trace CSV")
    ap.add_argument("--out-dir", type=Path, help="run: Vidur output root (a timestamped folder is made in it)")
    ap.add_argument("--num-blocks", type=int, default=1 << 24, help="KV blocks (default: effectively unlimited)")
    ap.add_argument("--batch-metrics", action="store_true", help="also write per-batch metrics (slower)")
    ap.add_argument("--max-seqs", type=int, default=256)
    ap.add_argument("--token-budget", type=int, default=8192)
    ap.add_argument("--base-ms", type=float, default=5.0)
    ap.add_argument("--prefill-ms-per-token", type=float, default=0.02)
    ap.add_argument("--decode-ms-per-seq", type=float, default=0.05)
    a = ap.parse_args()
    a.cache_dir = a.cache_dir.resolve()
    compute_id, _ = dataset_names(a.base_ms, a.prefill_ms_per_token, a.decode_ms_per_seq)
    if not (a.cache_dir / "profiling_data" / "compute" / ("datasets--" + compute_id.replace("/", "--"))).exists():
        write_profiles(a.cache_dir, a.base_ms, a.prefill_ms_per_token, a.decode_ms_per_seq)
    apply_shim()

    from vidur.config import SimulationConfig
    from vidur.simulator import Simulator
    from vidur.utils.random import set_seeds

    if a.mode == "prepare":
        # A one-request trace: building the simulator trains and caches the predictors.
        import tempfile
        with tempfile.TemporaryDirectory() as tmp:
            trace = Path(tmp) / "one.csv"
            trace.write_text("Date,Time,PromptTokenCount,CompletionTokenCount\n1970-01-01,0,16,2\n")
            sys.argv = [sys.argv[0]] + vidur_argv(a, trace, Path(tmp) / "out", 1024, False)
            cfg = SimulationConfig.create_from_cli_args()
            set_seeds(cfg.seed)
            Simulator(cfg).run()
        print("prepared", a.cache_dir)
        return
    if not a.trace or not a.out_dir:
        ap.error("run needs --trace and --out-dir")
    sys.argv = [sys.argv[0]] + vidur_argv(a, a.trace.resolve(), a.out_dir.resolve(), a.num_blocks, a.batch_metrics)
    cfg = SimulationConfig.create_from_cli_args()
    set_seeds(cfg.seed)
    sim = Simulator(cfg)
    sim.run()
    print(f"VIDUR_SIM_END_S={sim._time!r}")  # simulated time of the last event (makespan)
    print(f"VIDUR_OUTPUT_DIR={cfg.metrics_config.output_dir}")


if __name__ == "__main__":
    main()
