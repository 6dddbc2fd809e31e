"""Triton attention kernels vs torch SDPA on CUDA (prepared for a GPU machine).

    python -m bench.triton_attention [--out DIR]

Times the paged FlashAttention forward (tile capture off and on) and the paged decode kernel
against torch.nn.functional.scaled_dot_product_attention over contiguous tensors, for
sequence lengths 512..16k, head dims 64/128, bf16, and prints the ratios. On CPU the kernels
only run under the Triton interpreter, where timings mean nothing: the script says so and
exits without measuring.
"""
import argparse
import json
import os

import torch
import torch.nn.functional as F


def bench(fn, reps=20):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: Triton kernels would run in the interpreter, whose timings are meaningless; "
              "nothing measured (correctness is covered by tests/test_triton_kernels.py)")
        return
    from gpu_runner.kernels.reference import Chunk
    from gpu_runner.kernels.triton_attention import flash_attention_paged, paged_decode
    dev, dt = torch.device("cuda"), torch.bfloat16
    rows = []
    for hd in (64, 128):
        H, Hkv, bs = 16, 4, 16
        for T in (512, 1024, 2048, 4096, 8192, 16384):
            nb = T // bs
            kc = torch.randn(nb, bs, Hkv, hd, device=dev, dtype=dt)
            vc = torch.randn_like(kc)
            slots = torch.arange(T, device=dev)
            q = torch.randn(T, H, hd, device=dev, dtype=dt)
            ch = [Chunk(0, T, 0, slots)]
            kq = kc.view(-1, Hkv, hd).transpose(0, 1)[None]
            vq = vc.view(-1, Hkv, hd).transpose(0, 1)[None]
            qq = q.transpose(0, 1)[None]
            sdpa = bench(lambda: F.scaled_dot_product_attention(qq, kq, vq, is_causal=True, enable_gqa=True))
            tri = bench(lambda: flash_attention_paged(q, kc, vc, ch))
            cap = bench(lambda: flash_attention_paged(q, kc, vc, ch, capture_head=0))
            B = 32
            qd = torch.randn(B, H, hd, device=dev, dtype=dt)
            dch = [Chunk(b, 1, T - 1, slots) for b in range(B)]
            dec = bench(lambda: paged_decode(qd, kc, vc, dch))
            qdd = qd[:, :, None]
            kdd, vdd = kq.expand(B, -1, -1, -1), vq.expand(B, -1, -1, -1)
            sdec = bench(lambda: F.scaled_dot_product_attention(qdd, kdd, vdd, enable_gqa=True))
            rows.append({"head_dim": hd, "seq_len": T, "sdpa_prefill_ms": sdpa, "triton_prefill_ms": tri,
                         "triton_prefill_capture_ms": cap, "triton_decode_ms": dec, "sdpa_decode_ms": sdec})
            print(f"hd {hd:3} T {T:6}: prefill SDPA {sdpa:8.3f} ms, Triton {tri:8.3f} ms ({tri / sdpa:5.2f}x), "
                  f"with capture {cap:8.3f} ms; decode B={B}: Triton {dec:7.3f} ms vs SDPA {sdec:7.3f} ms "
                  f"({dec / sdec:5.2f}x)")
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "triton_vs_sdpa.json"), "w") as f:
            json.dump({"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
