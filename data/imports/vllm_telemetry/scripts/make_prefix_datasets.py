"""Custom `vllm bench serve` datasets with shared prefixes, pure-ASCII slices of the project's
corpus (byte tokenizer: text length == token count). Order: a seeded shuffle written to the file;
vllm bench serve is run with --disable-shuffle so it keeps this order.

  python make_prefix_datasets.py OUT_DIR
    run1.jsonl: 8 prefixes x 6 requests, prefix 96 + unique suffix 32 = 128 tokens, output 32
    run2.jsonl: 6 prefixes x 8 requests, prefix 128 + unique suffix 64 = 192 tokens, output 48
"""
import json, random, sys
from pathlib import Path

CORPUS = Path("/work/main/data/corpus/pydoc_topics.txt").read_bytes()

def ascii_slices(data, n, length, start, stride):
    out, s0, limit = [], start, len(data) - length
    while len(out) < n:
        s = data[s0:s0 + length]
        if all(32 <= b < 127 or b == 10 for b in s):
            out.append(s); s0 = (s0 + stride) % limit
        else:
            s0 = (s0 + 1) % limit
    return out

def make(path, n_prefix, per, plen, slen, olen, start, seed):
    prefixes = ascii_slices(CORPUS, n_prefix, plen, start, 15013)
    suffixes = ascii_slices(CORPUS, n_prefix * per, slen, start + 200_003, 3001)
    rows = []
    for i, p in enumerate(prefixes):
        for j in range(per):
            s = suffixes[i * per + j]
            rows.append({"prompt": (p + s).decode("ascii"), "output_tokens": olen, "prefix_id": i})
    random.Random(seed).shuffle(rows)
    assert len({r["prompt"] for r in rows}) == len(rows)
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    print(path, len(rows), "x", plen + slen, "in /", olen, "out")

out = Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
make(out / "run1.jsonl", 8, 6, 96, 32, 32, 1000, 1)
make(out / "run2.jsonl", 6, 8, 128, 64, 48, 60000, 2)
make(out / "warmup.jsonl", 4, 4, 64, 64, 32, 300000, 3)
