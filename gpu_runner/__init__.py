"""gpu_runner: executes a real small transformer under core's scheduler and block manager
and writes measured `serving-trace/1` traces. The only package that imports torch/triton;
the app never imports it."""
import os as _os

# Triton kernels run natively on CUDA; without a GPU they need the interpreter, and the
# switch must be set before triton.language is first imported anywhere in the process.
if "TRITON_INTERPRET" not in _os.environ:
    import torch as _torch
    if not _torch.cuda.is_available():
        _os.environ["TRITON_INTERPRET"] = "1"
