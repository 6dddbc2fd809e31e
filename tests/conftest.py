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


def _skip_gpu(config, items):
    """Tests marked `gpu` need a CUDA device: skip them cleanly where there is none."""
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_configure(config):
    config.addinivalue_line("markers", "xdist_group: tests that share one worker (-n: --dist loadgroup)")


def pytest_collection_modifyitems(config, items):
    _skip_gpu(config, items)
    for item in items:   # browser tests share one worker's Streamlit server and Chromium under -n
        if "browser" in item.keywords:
            item.add_marker(pytest.mark.xdist_group("browser"))


# ---- fixtures shared by every test module: one of each per test session (per xdist worker) ------

@pytest.fixture(scope="session")
def server():
    """The app under `streamlit run` on a free loopback port, stopped when the session ends."""
    from tests.helpers import require_browser, streamlit_server
    require_browser()
    with streamlit_server() as url:
        yield url


class _Chromium:
    """One headless Chromium under one Playwright for a run of browser tests: started by the
    first one, stopped after the last one of a run (Playwright's sync API keeps an event loop
    running in this thread, so any other test calling asyncio.run must run without it)."""

    def __init__(self):
        self._cm = self.browser = None

    def get(self):
        if self.browser is None:
            from tests.helpers import launched_browser
            self._cm = launched_browser()
            self.browser = self._cm.__enter__()
        return self.browser

    def close(self):
        if self._cm is not None:
            cm, self._cm, self.browser = self._cm, None, None
            cm.__exit__(None, None, None)


_CHROMIUM = _Chromium()


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium (the system binary), shared by consecutive browser test modules (under
    -n --dist loadgroup: every browser test of the session, on one worker)."""
    from tests.helpers import require_browser
    require_browser()
    return _CHROMIUM.get()


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    if "browser" in item.keywords and (nextitem is None or "browser" not in nextitem.keywords):
        _CHROMIUM.close()


@pytest.fixture(scope="module")
def page(browser):
    """A page of its own per test module (1400x1000; a module may resize it)."""
    p = browser.new_page(viewport={"width": 1400, "height": 1000})
    p.set_default_timeout(60_000)
    yield p
    p.close()


@pytest.fixture(scope="session")
def bundled():
    """bundled(name) -> a fresh copy of a bundled model ("tiny", "tiny-draft"); each checkpoint
    is read once per session (copies: a test may change its model's dtype or weights)."""
    import copy
    torch = pytest.importorskip("torch")
    from gpu_runner import checkpoint
    loaded = {}

    def get(name: str):
        if name not in loaded:
            loaded[name] = checkpoint.load_bundled(checkpoint.BUNDLED[name])
        with torch.no_grad():
            return copy.deepcopy(loaded[name])
    return get
