"""Every Triton kernel variant the engine launches compiles for real GPUs (sm_80 and sm_90),
on a machine without one: compiling for a CUDA target needs the ptxas that ships in the Triton
wheel, not a device. A change that would not compile on a GPU fails here, though the CPU tests
only ever run the kernels in Triton's interpreter.

The interpreter is chosen once per process when triton is imported (gpu_runner/kernels/
triton_attention.py), so the compilation runs in a subprocess with TRITON_INTERPRET=0.

Variants: every model the runner loads by name (the bundled tiny and tiny-draft, random-0.5b)
gives a head dim and a query-heads-per-KV-head group; each in bfloat16 (the CUDA default),
float16 and float32; the default 16-token KV block and a 32-token one; the prefill kernel with
tile capture off and on. Pointer and scalar argument types are those a launch passes (int32
block tables and chunk tables, float32 statistics, int32 strides)."""
import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytest.importorskip("triton")
pytestmark = pytest.mark.slow   # ~110 small compilations, ~20 s

COMPILE = r"""
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from gpu_runner.kernels import triton_attention as T

shapes, arch = json.loads(sys.argv[1]), int(sys.argv[2])
kernels = {"flash_fwd": T._flash_fwd, "paged_decode": T._paged_decode}
const = {"KV_GROUP", "BS", "HD", "BLOCK_M", "BLOCK_N", "CAPTURE"}
types = {"BT": "*i32", "QROW": "*i32", "QLEN": "*i32", "QSTART": "*i32", "CTX": "*i32",
         "STATS_M": "*fp32", "STATS_L": "*fp32", "scale": "fp32"}
built = 0
for hd, group in shapes:
    for dt in ("bf16", "fp16", "fp32"):
        for bs in (16, 32):
            for name, capture in (("flash_fwd", False), ("flash_fwd", True), ("paged_decode", None)):
                fn = kernels[name]
                assert type(fn).__name__ == "JITFunction", type(fn)      # not the interpreter's
                sig = {a: "constexpr" if a in const else f"*{dt}" if a in ("Q", "K", "V", "O")
                       else types.get(a, "i32") for a in fn.arg_names}
                consts = {"KV_GROUP": group, "BS": bs, "HD": hd, "BLOCK_N": T.BLOCK_N}
                if name == "flash_fwd":
                    consts.update(BLOCK_M=T.BLOCK_M, CAPTURE=capture)
                what = f"{name} {dt} head_dim {hd} group {group} block {bs} capture {capture} sm_{arch}"
                try:
                    out = triton.compile(ASTSource(fn, sig, constexprs=consts), target=GPUTarget("cuda", arch, 32))
                except Exception as e:
                    print(f"FAILED {what}: {type(e).__name__}: {e}")
                    sys.exit(1)
                assert out.asm.get("cubin"), what
                built += 1
print(f"compiled {built}")
"""


def model_shapes() -> list[tuple[int, int]]:
    """(head_dim, query heads per KV head) of every model `--model NAME` can load."""
    from gpu_runner import checkpoint
    shapes = set()
    for path in checkpoint.BUNDLED.values():
        c = json.loads((path / "config.json").read_text())
        shapes.add((c.get("head_dim") or c["dim"] // c["n_heads"], c["n_heads"] // c["n_kv_heads"]))
    shapes.add((896 // 14, 14 // 2))     # random-0.5b (gpu_runner.launch.load_model)
    return sorted(shapes)


@pytest.mark.parametrize("arch", [80, 90], ids=lambda a: f"sm_{a}")
def test_every_kernel_variant_compiles_for_the_gpu(arch, tmp_path):
    shapes = model_shapes()
    env = {**os.environ, "TRITON_INTERPRET": "0", "PYTHONPATH": str(ROOT), "TRITON_CACHE_DIR": str(tmp_path)}
    p = subprocess.run([sys.executable, "-c", COMPILE, json.dumps(shapes), str(arch)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    assert p.stdout.strip().splitlines()[-1] == f"compiled {len(shapes) * 3 * 2 * 3}"
