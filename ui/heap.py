"""The app process's startup: the imported heap frozen out of the garbage collector's reach,
the simulation workers started."""
import gc


def freeze_startup_heap() -> None:
    """Move everything the imports built (streamlit, pandas, plotly, core) out of the cyclic
    garbage collector's reach, once per process. Streamlit runs a full collection after every
    script run (runner.postScriptGC); over the startup heap that cost ~100 ms per rerun, a
    stop-the-world pause for every other user's script thread too. Later garbage is
    collected as before. Also turns off numpy's huge-page advice (core.cli.no_hugepage_advice),
    keeps freed memory for reuse (core.sim.simulate.reuse_freed_memory: a fleet trace of 10,000
    requests was built in 0.56 s from fresh pages, 0.49 s under cProfile from reused ones, its
    merge's gathers 0.46 -> 0.06 s) and starts the worker processes that simulate large
    workloads (core.sim.parallel.warm)."""
    global _HEAP_FROZEN
    if not _HEAP_FROZEN:
        from core.cli import no_hugepage_advice
        from core.sim.parallel import warm
        from core.sim.simulate import reuse_freed_memory
        no_hugepage_advice()
        reuse_freed_memory()
        warm()
        import core.figures  # noqa: F401  (plotly's figure classes: the largest import the pages share)
        gc.collect()
        gc.freeze()
        _HEAP_FROZEN = True


_HEAP_FROZEN = False
