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


def read_input_file(path, what: str, error=InputError) -> bytes:
    """Bytes of a user-given file, or `error` naming the path and what went wrong."""
    from pathlib import Path
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        raise error(f"{path}: no such file") from None
    except IsADirectoryError:
        raise error(f"{path}: is a directory, expected a {what} file") from None
    except OSError as e:
        raise error(f"{path}: cannot read ({e.strerror})") from None
