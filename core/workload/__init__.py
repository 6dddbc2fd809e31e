"""Requests and workloads (model.py) and the workload files people already have: our JSON
(native.py), Vidur-style CSV and LLMServingSim-style JSONL (files.py), Mooncake-format JSONL
(mooncake.py), opened by content (open.py)."""
from core.workload.model import MAX_TIME_MS, MAX_TOKENS, Request, Workload, make_workload
from core.workload.mooncake import from_mooncake_jsonl
from core.workload.native import Tokenize, request_from_dict
from core.workload.open import decode_bytes, load_workload, parse_workload

__all__ = ["MAX_TIME_MS", "MAX_TOKENS", "Request", "Tokenize", "Workload", "decode_bytes", "from_mooncake_jsonl",
           "load_workload",
           "make_workload", "parse_workload", "request_from_dict"]
