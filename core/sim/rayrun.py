"""Independent runs (sweep points, search configurations) as Ray tasks (issue 29 part 2): on a
local Ray started for the call, or on an existing cluster (`auto`, or `ray://HOST:PORT`). Ray is
optional and imported only here, only when asked for (`--ray`); the simulator's package travels to
the cluster's workers with each job (`runtime_env` py_modules), so a cluster needs only Python and
the pinned requirements. Results come back through Ray's object store, in job order."""
from __future__ import annotations

from pathlib import Path

from core.errors import ConfigError

LOCAL = "local"
INSTALL = "pip install ray==2.60.0 opentelemetry-api==1.45.2 opentelemetry-sdk==1.45.2"


def run_on_ray(fn, jobs: list[dict], address: str = LOCAL, workers: int | None = None) -> list:
    """[fn(**job) for job in jobs] as Ray tasks of one CPU each. `address`: LOCAL (a Ray of
    `workers` CPUs, default all, started and stopped here), "auto" or "ray://HOST:PORT" (an
    existing cluster, joined and left). Raises ConfigError when Ray is missing or unreachable."""
    try:
        import ray
    except ImportError:
        raise ConfigError(f"--ray: Ray is not installed ({INSTALL}; docs/scale.md)") from None
    import core
    package = str(Path(core.__file__).resolve().parent)
    started = False
    if not ray.is_initialized():
        env = {"py_modules": [package]}
        try:
            if address == LOCAL:
                ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False, runtime_env=env)
            else:
                ray.init(address=address, log_to_driver=False, runtime_env=env)
        except Exception as e:           # Ray raises ConnectionError, RuntimeError, ValueError...
            raise ConfigError(f"--ray {address}: could not start or join Ray ({str(e).splitlines()[0][:300]})") \
                from None
        started = True
    try:
        task = ray.remote(num_cpus=1)(fn)
        return ray.get([task.remote(**job) for job in jobs])
    finally:
        if started:
            ray.shutdown()
