"""The app process's startup: the imported heap frozen out of the garbage collector's reach,
the simulation workers started."""
import gc


def freeze_startup_heap() -> None:
    """Move everything the imports built (streamlit, pandas, plotly, core) out of the cyclic
    garbage collector's reach, once per process. Streamlit runs a full collection after every
    script run (runner.postScriptGC); over the startup heap that cost ~100 ms per rerun, a
    stop-the-world pause for every other user's script thread too. Later garbage is
    collected as before. Also turns off numpy's huge-page advice (core.cli.no_hugepage_advice)
    and starts the worker processes that simulate large workloads (core.sim.parallel.warm)."""
    global _HEAP_FROZEN
    if not _HEAP_FROZEN:
        from core.cli import no_hugepage_advice
        from core.sim.parallel import warm
        no_hugepage_advice()
        warm()
        import core.figures  # noqa: F401  (plotly's figure classes: the largest import the pages share)
        gc.collect()
        gc.freeze()
        _HEAP_FROZEN = True


_HEAP_FROZEN = False
