"""Greedy equality check against OpenAI-compatible servers (standard library only, so it
runs under either interpreter).

    greedy.py query --url URL --prompts greedy.json --out ids.json
        POST /v1/completions for each prompt (token ids), temperature 0, ignore_eos, max_tokens
        from greedy.json, return_token_ids (vLLM) -> {"ids": [[...], ...]}. When a server
        does not return token_ids the bytes of the text are used (byte models: id = byte).
    greedy.py compare A.json B.json
        prints PASS / FAIL per prompt (first differing position), exits 1 on any FAIL.
"""
from __future__ import annotations

import argparse
import json
import sys
import urllib.request
from pathlib import Path


def post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read())


def query(a) -> int:
    spec = json.loads(Path(a.prompts).read_text())
    base = a.url.rstrip("/")
    with urllib.request.urlopen(f"{base}/v1/models", timeout=30) as r:
        model = json.loads(r.read())["data"][0]["id"]
    out = {"url": base, "model": model, "max_tokens": spec["max_tokens"], "ids": [], "text": [], "source": []}
    for p in spec["prompts"]:
        body = {"model": model, "prompt": p, "max_tokens": spec["max_tokens"], "temperature": 0,
                "ignore_eos": True, "return_token_ids": True}
        ch = post(f"{base}/v1/completions", body)["choices"][0]
        ids = ch.get("token_ids")
        if ids is None:
            ids, src = list(ch["text"].encode("utf-8")), "text bytes"
        else:
            src = "token_ids"
        out["ids"].append(ids)
        out["text"].append(ch["text"])
        out["source"].append(src)
    Path(a.out).write_text(json.dumps(out, indent=1))
    print(f"{a.out}: {len(out['ids'])} completions from {model} at {base} ({', '.join(sorted(set(out['source'])))})")
    return 0


def compare(a) -> int:
    x, y = json.loads(Path(a.a).read_text()), json.loads(Path(a.b).read_text())
    bad = 0
    for k, (i, j) in enumerate(zip(x["ids"], y["ids"])):
        if i == j:
            print(f"prompt {k}: PASS ({len(i)} tokens identical)")
        else:
            d = next((n for n, (p, q) in enumerate(zip(i, j)) if p != q), min(len(i), len(j)))
            print(f"prompt {k}: FAIL (first difference at token {d}: {i[d:d + 4]} vs {j[d:d + 4]}; "
                  f"{len(i)} vs {len(j)} tokens)")
            bad += 1
    if len(x["ids"]) != len(y["ids"]):
        print(f"FAIL: {len(x['ids'])} vs {len(y['ids'])} prompts")
        bad += 1
    print("greedy equality: " + ("PASS" if not bad else f"FAIL ({bad} of {len(x['ids'])})"))
    return 1 if bad else 0


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    q = sub.add_parser("query")
    q.add_argument("--url", required=True)
    q.add_argument("--prompts", required=True)
    q.add_argument("--out", required=True)
    c = sub.add_parser("compare")
    c.add_argument("a")
    c.add_argument("b")
    a = p.parse_args()
    sys.exit(query(a) if a.cmd == "query" else compare(a))
