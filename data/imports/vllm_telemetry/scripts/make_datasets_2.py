"""Custom `vllm bench serve` datasets for run3..run9 (one vLLM server per run), pure-ASCII slices of
the project's corpus (byte tokenizer: text length == token count), like make_prefix_datasets.py but
with other corpus offsets per run, so that no prompt (and no prompt's first 32-token block) of one
run occurs in another run or in run1/run2. Order: a seeded shuffle written to the file; vllm bench
serve is run with --disable-shuffle so it keeps this order.

  python make_datasets_2.py OUT_DIR
    runN.jsonl          the measured prompts (shapes in RUNS below)
    runN_warmup.jsonl   8 other prompts per run (2 prefixes x 4, 64 + 64 tokens), the unmeasured warm-up
    run6.jsonl          a byte-for-byte copy of run2's dataset.jsonl (run6 = run2 without prefix caching)
"""
import json, random, shutil, sys
from pathlib import Path

CORPUS = Path("/work/main/data/corpus/pydoc_topics.txt").read_bytes()
D = Path("/work/main/data/imports/vllm_telemetry")
BLOCK = 32

# name: (n_prefixes, requests per prefix, prefix len, unique suffix len, output len, corpus start, seed)
RUNS = {
    "run3": (8, 6, 128, 128, 64, 21_000, 31),
    "run4": (6, 8, 64, 64, 32, 87_000, 41),
    "run5": (6, 8, 128, 64, 48, 151_000, 51),
    "run7": (6, 8, 192, 64, 32, 233_000, 71),
    "run8": (8, 6, 64, 64, 64, 347_000, 81),
    "run9": (32, 1, 0, 64, 128, 409_000, 91),   # no shared prefix: 32 unique 64-token prompts
}


def ascii_slices(data, n, length, start, stride):
    out, s0, limit = [], start % (len(data) - length), len(data) - length
    while len(out) < n:
        s = data[s0:s0 + length]
        if all(32 <= b < 127 or b == 10 for b in s):
            out.append(s); s0 = (s0 + stride) % limit
        else:
            s0 = (s0 + 1) % limit
    return out


def make(path, n_prefix, per, plen, slen, olen, start, seed):
    prefixes = ascii_slices(CORPUS, n_prefix, plen, start, 15013) if plen else [b""] * n_prefix
    suffixes = ascii_slices(CORPUS, n_prefix * per, slen, start + 7_919, 1009)
    if plen:  # distinct prefixes already in their first block
        assert len({p[:BLOCK] for p in prefixes}) == n_prefix, path
    # suffixes distinct in their first block (no accidental hit beyond the shared prefix)
    assert len({s[:BLOCK] for s in suffixes}) == len(suffixes), path
    rows = []
    for i, p in enumerate(prefixes):
        for j in range(per):
            s = suffixes[i * per + j]
            rows.append({"prompt": (p + s).decode("ascii"), "output_tokens": olen,
                         "prefix_id": i if plen else None})
    random.Random(seed).shuffle(rows)
    assert len({r["prompt"] for r in rows}) == len(rows)
    assert all(len(r["prompt"].encode()) == plen + slen for r in rows)
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    print(path, len(rows), "x", plen + slen, f"in ({plen} shared x{per} / {slen} unique) /", olen, "out")
    return rows


out = Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
seen_first_blocks = {}  # first 32 tokens of every prompt -> dataset
for old in ("run1_c4_p128_o32", "run2_poisson4_p192_o48"):
    for line in open(D / old / "dataset.jsonl"):
        seen_first_blocks.setdefault(json.loads(line)["prompt"][:BLOCK], old)


def check_disjoint(name, rows):
    firsts = {r["prompt"][:BLOCK] for r in rows}
    clash = {f: seen_first_blocks[f] for f in firsts if f in seen_first_blocks}
    assert not clash, (name, clash)
    for f in firsts:
        seen_first_blocks[f] = name


for k, (npre, per, plen, slen, olen, start, seed) in RUNS.items():
    check_disjoint(k, make(out / f"{k}.jsonl", npre, per, plen, slen, olen, start, seed))
for k, start in (("run3", 12_345), ("run4", 54_321), ("run5", 123_457), ("run6", 198_765),
                 ("run7", 276_543), ("run8", 312_111), ("run9", 441_777)):
    check_disjoint(k + "_warmup", make(out / f"{k}_warmup.jsonl", 2, 4, 64, 64, 16, start,
                                       1000 + int(k[3:])))
shutil.copy(D / "run2_poisson4_p192_o48" / "dataset.jsonl", out / "run6.jsonl")
print(out / "run6.jsonl", "= run2_poisson4_p192_o48/dataset.jsonl (copied)")
