"""The workloads of bench/vllm_repeats.sh: `vllm bench serve --dataset-name custom` files of
pure-ASCII slices of the project's corpus (the byte tokenizer: text length == token count), with
shared prefixes, in a seeded order kept by --disable-shuffle. Plain Python (no project imports).

    python bench/vllm_repeats/make_datasets.py OUT_DIR

Writes OUT_DIR/<name>.jsonl for each workload below and OUT_DIR/warmup.jsonl (8 other prompts),
and prints each workload's client flags as `name|n|output|flags` lines (the shell reads them).
"""
import json
import random
import sys
from pathlib import Path

CORPUS = (Path(__file__).resolve().parents[2] / "data/corpus/pydoc_topics.txt").read_bytes()

# name: (prefixes, requests per prefix, prefix len, unique suffix len, output len, corpus start, seed, client flags)
WORKLOADS = {
    "wA_poisson8_p192_o48": (8, 8, 128, 64, 48, 511_000, 101, "--request-rate 8"),
    "wB_c4_p128_o32": (6, 8, 64, 64, 32, 577_000, 102, "--max-concurrency 4 --request-rate inf"),
    "wC_poisson3_p96_o96": (32, 1, 0, 96, 96, 643_000, 103, "--request-rate 3"),
}
WARMUP = (2, 4, 64, 64, 16, 701_000, 104)
# The calibration run (issue 49): one run that shows the engine at every width it will be asked
# about, so that a fit on it can tell a step's fixed cost from its cost per decoding sequence and a
# wake-up after a pause from a busy engine's step. Mixed prompts (64-256 tokens, half of them behind
# one of 8 shared 64-token prefixes) and outputs (16-96 tokens, each row's own), sent as a Poisson
# stream whose rate rises linearly from 1/s to 24/s over the run (`--ramp-up-strategy linear`):
# its first requests find the engine idle, its last ones 8+ decoding beside them.
CALIBRATION = ("wK_ramp1to24_mixed", 128, 705_000, 105,
               "--ramp-up-strategy linear --ramp-up-start-rps 1 --ramp-up-end-rps 24")
# Other clients against the same server (issue 49's held-out runs were driven by them too), each
# with its own synthetic prompts (no dataset file: the spans give each request's token counts) and
# its own way of sending; run only when WORKLOADS names them (each needs its client's venv:
# bench/vllm_repeats.sh, AIPERF / GUIDELLM / INFERENCE_PERF). name: (client, requests, input, output)
OTHER_CLIENTS = {
    "wD_aiperf_chat_c4_p128_o32": ("aiperf", 48, 128, 32),        # chat, a closed loop of 4
    "wE_guidellm_sweep_p96_o48": ("guidellm", 64, 96, 48),        # sweep: 4 strategies of 16 requests
    "wF_ip_stages_p64_o32": ("inference-perf", 52, 64, 32),       # constant stages: 2/s for 8 s, 6/s for 6 s
}


def ascii_slices(n, length, start, stride):
    out, limit = [], len(CORPUS) - length
    s0 = start % limit
    while len(out) < n:
        s = CORPUS[s0:s0 + length]
        if all(32 <= b < 127 or b == 10 for b in s):
            out.append(s)
            s0 = (s0 + stride) % limit
        else:
            s0 = (s0 + 1) % limit
    return out


def make(path, n_prefix, per, plen, slen, olen, start, seed):
    prefixes = ascii_slices(n_prefix, plen, start, 15013) if plen else [b""] * n_prefix
    suffixes = ascii_slices(n_prefix * per, slen, start + 200_003, 3001)
    rows = [{"prompt": (p + suffixes[i * per + j]).decode("ascii"), "output_tokens": olen, "prefix_id": i}
            for i, p in enumerate(prefixes) for j in range(per)]
    random.Random(seed).shuffle(rows)
    assert len({r["prompt"] for r in rows}) == len(rows)
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return len(rows)


def make_calibration(path, n, start, seed):
    rng = random.Random(seed)
    prefixes = ascii_slices(8, 64, start, 15013)
    rows = []
    for i in range(n):
        plen = rng.choice((64, 128, 192, 256))
        shared = plen > 64 and i % 2 == 0
        rows.append((plen, shared, rng.choice((16, 32, 64, 96)), rng.randrange(8)))
    own = iter(ascii_slices(n, 256, start + 200_003, 1499))
    out = []
    for plen, shared, olen, k in rows:
        body = next(own)
        prompt = (prefixes[k] + body[:plen - 64]) if shared else body[:plen]
        out.append({"prompt": prompt.decode("ascii"), "output_tokens": olen, "prefix_id": k if shared else -1})
    assert len({r["prompt"] for r in out}) == len(out)
    with open(path, "w") as f:
        for r in out:
            f.write(json.dumps(r) + "\n")
    return len(out)


def main():
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    make(out / "warmup.jsonl", *WARMUP)
    for name, (*shape, flags) in WORKLOADS.items():
        n = make(out / f"{name}.jsonl", *shape)
        print(f"{name}|{n}|{shape[4]}|{flags}|vllm")
    name, n, start, seed, flags = CALIBRATION
    n = make_calibration(out / f"{name}.jsonl", n, start, seed)
    print(f"{name}|{n}|-1|{flags}|vllm")    # (-1: each row's own output length)
    for name, (client, n, isl, osl) in OTHER_CLIENTS.items():
        print(f"{name}|{n}|{osl}|{isl}|{client}")    # (flags: the input length; the shell builds the rest)


if __name__ == "__main__":
    main()
