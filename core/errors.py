"""The project's own error types. Every user-facing failure is one of these, with a
message that names the field (or event/row) and what was expected."""


class InputError(ValueError):
    """Bad user input: a workload, a trace, a config value."""


class WorkloadError(InputError):
    pass


class TraceError(InputError):
    pass


class ConfigError(InputError):
    pass


def short(v, limit: int = 40) -> str:
    """repr() of a bad value for an error message, cut to a readable length."""
    r = repr(v)
    return r if len(r) <= limit else r[: limit - 3] + "..."
