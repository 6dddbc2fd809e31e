import os
from pathlib import Path

import pytest

# The repository root is on sys.path through pyproject's [tool.pytest.ini_options] pythonpath.
ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "data"
os.environ.setdefault("PYTHONHASHSEED", "0")

# Triton kernels run under the interpreter when there is no GPU; set before anything imports
# triton.language (see gpu_runner/__init__.py).
try:
    import torch as _torch
    HAS_CUDA = _torch.cuda.is_available()
    if not HAS_CUDA:
        os.environ.setdefault("TRITON_INTERPRET", "1")
except ImportError:
    HAS_CUDA = False


def pytest_collection_modifyitems(config, items):
    """Tests marked `gpu` need a CUDA device: skip them cleanly where there is none."""
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="module")
def server():
    """The app under `streamlit run` on a free loopback port, for a browser test module."""
    from tests.browser import require_browser, streamlit_server
    require_browser()
    with streamlit_server() as url:
        yield url
