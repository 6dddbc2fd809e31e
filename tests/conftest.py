import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "data"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("PYTHONHASHSEED", "0")

# Triton kernels run under the interpreter when there is no GPU; set before anything imports
# triton.language (see gpu_runner/__init__.py).
try:
    import torch as _torch
    if not _torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
except ImportError:
    pass
