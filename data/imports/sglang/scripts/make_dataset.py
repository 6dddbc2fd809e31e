"""Write a small ShareGPT-format JSON of ASCII prompts taken from
/work/main/data/corpus/pydoc_topics.txt (for sglang.bench_serving
--dataset-name random --dataset-path ..., so the client never downloads ShareGPT)."""
import json, re, sys
src = "/work/main/data/corpus/pydoc_topics.txt"
out = sys.argv[1]
text = open(src, encoding="utf-8").read()
paras = [re.sub(r"\s+", " ", p).strip() for p in re.split(r"\n\s*\n", text)]
paras = [p for p in paras if p.isascii() and len(p) >= 120 and not set(p) <= set("*=-")]
rows = []
for i in range(0, min(len(paras) - 1, 128), 2):
    rows.append({"id": f"pydoc-{i//2:03d}", "conversations": [
        {"from": "human", "value": paras[i]},
        {"from": "gpt", "value": paras[i + 1]}]})
json.dump(rows, open(out, "w"), indent=1)
print(f"wrote {len(rows)} conversations to {out}")
