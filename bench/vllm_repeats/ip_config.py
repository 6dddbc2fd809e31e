"""The inference-perf 0.7.0 config of bench/vllm_repeats.sh's wF run (constant stages: 2/s for
8 s, then 6/s for 6 s; synthetic prompts of a fixed length), printed as YAML (JSON is YAML).

    python3 bench/vllm_repeats/ip_config.py OUT_DIR PORT TOKENIZER_DIR INPUT OUTPUT
"""
import json
import sys

out, port, tok, isl, osl = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
STAGES = [{"rate": 2, "duration": 8}, {"rate": 6, "duration": 6}]
n = sum(s["rate"] * s["duration"] for s in STAGES)
print(json.dumps({
    "api": {"type": "completion", "streaming": True},
    "server": {"type": "vllm", "model_name": "tiny", "base_url": f"http://127.0.0.1:{port}", "ignore_eos": True},
    "tokenizer": {"pretrained_model_name_or_path": tok},
    "data": {"type": "synthetic",
             "input_distribution": {"min": isl, "max": isl, "mean": isl, "std_dev": 0, "total_count": n,
                                    "type": "fixed"},
             "output_distribution": {"min": osl, "max": osl, "mean": osl, "std_dev": 0, "total_count": n,
                                     "type": "fixed"}},
    "load": {"type": "constant", "num_workers": 1, "base_seed": 1234, "stages": STAGES},
    "report": {"request_lifecycle": {"summary": True, "per_stage": True, "per_request": True,
                                     "per_request_fields": {"request": True, "response": False, "info": True,
                                                            "response_chunks": False, "computed_metrics": True}}},
    "storage": {"local_storage": {"path": out}},
}, indent=1))
