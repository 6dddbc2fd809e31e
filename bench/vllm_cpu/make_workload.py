"""Write the benchmark workload twice, with the same prompts:

  workload.json   our JSON workload: {"requests": [{"id", "arrival_ms", "prompt_ids", "output_tokens"}]}
                  (prompt_ids = bytes of data/corpus/pydoc_topics.txt; the byte models read them as text)
  dataset.jsonl   the same prompts as text, one {"prompt": ..., "output_tokens": N} per line, for
                  `vllm bench serve --dataset-name custom` (the byte tokenizer turns the text back
                  into exactly these ids: each slice is chosen to be pure ASCII)
  greedy.json     a few short prompts (token ids) for the greedy equality check

    python bench/vllm_cpu/make_workload.py OUT_DIR [--n 64] [--prompt 128] [--output 64]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

CORPUS = Path(__file__).resolve().parents[2] / "data" / "corpus" / "pydoc_topics.txt"


def ascii_slices(data: bytes, n: int, length: int, stride: int = 7919) -> list[bytes]:
    """n slices of `length` bytes, starting at multiples of `stride` (mod the corpus), skipping
    ahead past any slice with a non-ASCII byte, so text and ids agree one-to-one."""
    out, start = [], 0
    limit = len(data) - length
    while len(out) < n:
        s = data[start:start + length]
        if all(b < 128 for b in s):
            out.append(s)
            start = (start + stride) % limit
        else:
            start = (start + 1) % limit
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--n", type=int, default=64)
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--output", type=int, default=64)
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    data = CORPUS.read_bytes()
    prompts = ascii_slices(data, a.n, a.prompt)
    w = {"name": f"burst{a.n}_p{a.prompt}_o{a.output}",
         "requests": [{"id": f"r{k}", "arrival_ms": 0, "prompt_ids": list(s), "output_tokens": a.output}
                      for k, s in enumerate(prompts)]}
    (out / "workload.json").write_text(json.dumps(w) + "\n")
    with open(out / "dataset.jsonl", "w") as f:
        for s in prompts:
            f.write(json.dumps({"prompt": s.decode("ascii"), "output_tokens": a.output}) + "\n")
    greedy = [list(s) for s in ascii_slices(data[100_000:], 3, 48, stride=50_021)]
    (out / "greedy.json").write_text(json.dumps({"prompts": greedy, "max_tokens": 32}) + "\n")
    print(f"wrote {out}/workload.json, dataset.jsonl ({a.n} prompts x {a.prompt} tokens, {a.output} out), greedy.json")


if __name__ == "__main__":
    main()
