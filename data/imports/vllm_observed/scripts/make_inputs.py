"""Inputs of this session, pure-ASCII slices of data/corpus/pydoc_topics.txt (byte tokenizer: text
length == token count), shared prefixes, seeded shuffle.

  python make_inputs.py OUT_DIR
    bench.jsonl     `vllm bench serve --dataset-name custom`: 6 prefixes x 4 = 24 requests,
                    prefix 96 + unique 32 = 128 tokens, output 32 (sent twice, a reset between)
    workload.json   our JSON workload for `gpu_runner loadgen`: 32 requests (6 prefixes: 6,6,5,5,5,5),
                    prefix 96 + unique 32 = 128 chars as "prompt" text, output_tokens 32, arrival 0
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

out = Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)

# bench dataset
pre = ascii_slices(CORPUS, 6, 96, 5000, 15013)
suf = ascii_slices(CORPUS, 24, 32, 250_003, 3001)
rows = [{"prompt": (pre[i] + suf[i * 4 + j]).decode(), "output_tokens": 32, "prefix_id": i}
        for i in range(6) for j in range(4)]
random.Random(11).shuffle(rows)
assert len({r["prompt"] for r in rows}) == 24 and all(len(r["prompt"]) == 128 for r in rows)
with open(out / "bench.jsonl", "w") as f:
    for r in rows:
        f.write(json.dumps(r) + "\n")

# loadgen workload
pre = ascii_slices(CORPUS, 6, 96, 90000, 15013)
suf = ascii_slices(CORPUS, 32, 32, 400_009, 3001)
reqs = [{"prefix_id": k % 6, "prompt": (pre[k % 6] + suf[k]).decode(), "output_tokens": 32} for k in range(32)]
random.Random(12).shuffle(reqs)
reqs = [{"id": f"r{n:02d}", "arrival_ms": 0.0, **r} for n, r in enumerate(reqs)]
assert len({r["prompt"] for r in reqs}) == 32 and all(len(r["prompt"]) == 128 for r in reqs)
json.dump({"name": "vllm_observed_prefix6x32", "requests": reqs}, open(out / "workload.json", "w"), indent=1)
print("wrote", out / "bench.jsonl", out / "workload.json")
