"""The project's own error types. Every user-facing failure is one of these, with a
message that names the field (or event/row) and what was expected."""
import os


class InputError(ValueError):
    """Bad user input: a workload, a trace, a config value."""


class WorkloadError(InputError):
    pass


class TraceError(InputError):
    pass


class ConfigError(InputError):
    pass


def short(v, limit: int = 40) -> str:
    """repr() of a bad value for an error message, cut to a readable length. Only the part shown is
    written: a value with millions of items (or aliases shared 3**30 times) is never repr'd whole."""
    r = _repr_head(v, limit + 1)
    return r if len(r) <= limit else r[: limit - 3] + "..."


class _Enough(Exception):
    pass


def _repr_head(v, n: int) -> str:
    """repr(v), or a text of at least n characters that begins as repr(v) does (lists, tuples, dicts
    and sets are written item by item only that far; a long string or integer by its start)."""
    out: list[str] = []
    size = 0

    def put(s: str):
        nonlocal size
        out.append(s)
        size += len(s)
        if size >= n:
            raise _Enough

    def items(xs, open_: str, close: str, pair: bool = False):
        put(open_)
        for k, x in enumerate(xs):
            if k:
                put(", ")
            if pair:
                walk(x[0])
                put(": ")
                x = x[1]
            walk(x)
        put(close)

    def walk(x):
        t = type(x)
        if t is list:
            items(x, "[", "]")
        elif t is tuple:
            items(x, "(", ",)" if len(x) == 1 else ")")
        elif t is dict:
            items(x.items(), "{", "}", pair=True)
        elif t in (set, frozenset):
            name = "" if t is set else "frozenset("
            put(f"{name or 'set('})" if not x else "")
            if x:
                items(x, name + "{", "}" + (")" if name else ""))
        elif t is str and len(x) > n:
            put(repr(x[:n]))
        elif t is int and x.bit_length() > 14_000:      # (str() of an int past 4,300 digits is refused)
            put(f"{'-' if x < 0 else ''}<an integer of {x.bit_length():,} bits>")
        else:
            put(repr(x))
    try:
        walk(v)
    except _Enough:
        pass
    return "".join(out)


MAX_DECOMPRESSED_BYTES = 2 * 2**30  # gzip input inflates to at most this (2 GiB): a bigger one is a bomb
GZIP_MAGIC = b"\x1f\x8b"


def _size(n: int) -> str:
    return f"{n / 2**30:g} GiB" if n >= 2**30 else f"{n:,} bytes"


def gunzip(data: bytes, name: str, error=InputError) -> bytes:
    """`data` decompressed when it is gzip (else as is), refused as `error` naming the file when
    it would inflate past MAX_DECOMPRESSED_BYTES: a first pass counts the inflated bytes piece
    by piece and keeps none (a bomb is refused holding nothing, in about a second per 2 GiB),
    the second keeps them; gzip inside gzip is refused too. (The gzip trailer's size field is
    not trusted: it is the size mod 2**32, and any bytes in a truncated file.)"""
    import zlib
    if data[:2] != GZIP_MAGIC:
        return data
    limit = MAX_DECOMPRESSED_BYTES
    too_big = f"{name}: gzip data inflates to more than {_size(limit)} (the limit for compressed input)"
    try:
        _members(data, name, error, limit, too_big, keep=False)      # count first, keeping nothing
        pieces = _members(data, name, error, limit, too_big, keep=True)
    except zlib.error as e:
        raise error(f"{name}: broken gzip data ({e})") from None
    out = b"".join(pieces)
    if out[:2] == GZIP_MAGIC:
        raise error(f"{name}: gzip data inside gzip data (compressed twice?); decompress it once first")
    return out


def _members(data: bytes, name: str, error, limit: int, too_big: str, keep: bool) -> list:
    """Inflate every gzip member of `data` in pieces of at most 4 MiB, refusing past `limit`;
    the pieces when `keep` (else only counted: a refusal then holds nothing)."""
    import zlib
    pieces, total, rest = [], 0, memoryview(data)
    while rest.nbytes:       # members one after another (concatenated gzip files)
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        buf = rest
        while not d.eof:
            piece = d.decompress(buf, 1 << 22)
            total += len(piece)
            if total > limit:
                raise error(too_big)
            if keep:
                pieces.append(piece)
            if d.unconsumed_tail:
                buf = memoryview(d.unconsumed_tail)
            elif not piece:
                break        # input used up before the end of the stream
            else:
                buf = memoryview(b"")
        if not d.eof:
            raise error(f"{name}: broken gzip data (it ends before the end of its compressed stream)")
        rest = memoryview(d.unused_data)
        if rest.nbytes and bytes(rest[:2]) != GZIP_MAGIC:
            if any(bytes(rest)):      # zero padding after the last member is read as gzip reads it
                raise error(f"{name}: broken gzip data (bytes after the end of its last member)")
            break
    return pieces


def loads_json(text: str | bytes, name: str, error=InputError, **kw):
    """json.loads, with JSON nested too deeply for the parser refused as `error` naming the file
    (a RecursionError otherwise). Every JSON parse of user input goes through here or through
    a parser with its own depth limit (orjson, msgspec). JSONDecodeError is left to the caller.
    NaN, Infinity and numbers beyond float range (1e309) are not JSON: refused as `error`."""
    import json
    import math

    def not_json(c):
        raise error(f"{name}: {c} is not a JSON number (numbers must be finite)")

    def finite(s):
        v = float(s)
        return v if math.isfinite(v) else not_json(s)
    kw.setdefault("parse_constant", not_json)
    kw.setdefault("parse_float", finite)
    try:
        return json.loads(text, **kw)
    except RecursionError:
        raise error(f"{name}: JSON nested too deeply") from None


MAX_INPUT_BYTES = MAX_DECOMPRESSED_BYTES   # a file read whole (Parquet traces larger than this are read in parts)


def read_input_file(path, what: str, error=InputError, limit: int | None = None) -> bytes:
    """Bytes of a user-given file, or `error` naming the path and what went wrong. At most
    `limit` bytes (default MAX_INPUT_BYTES) are read, a larger file is refused before more is
    read (its size when the file says it; a pipe's bytes as they come); a device (a link to
    /dev/zero, which never ends) is refused unread."""
    import stat
    limit = MAX_INPUT_BYTES if limit is None else limit
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
                raise error(f"{path}: is a device, expected a {what} file")
            if stat.S_ISREG(st.st_mode):
                if st.st_size > limit:
                    raise error(f"{path}: larger than {limit:,} bytes ({st.st_size:,}); not a {what} file")
                data = f.read(st.st_size + 1)    # (read(n) allocates n bytes first: never the limit itself)
            else:                                 # a pipe: its bytes as they come, in pieces
                pieces, got = [], 0
                while got <= limit:
                    piece = f.read(min(16 << 20, limit + 1 - got))
                    if not piece:
                        break
                    pieces.append(piece)
                    got += len(piece)
                data = b"".join(pieces)
    except FileNotFoundError:
        raise error(f"{path}: no such file") from None
    except IsADirectoryError:
        raise error(f"{path}: is a directory, expected a {what} file") from None
    except OSError as e:
        raise error(f"{path}: cannot read ({e.strerror or e})") from None
    if len(data) > limit:
        raise error(f"{path}: larger than {limit:,} bytes; not a {what} file")
    return data


def json_from_bytes(data: bytes, where: str, error=InputError):
    """JSON from untrusted bytes; every failure (encoding, syntax, nesting, huge numbers) is a
    one-line `error` naming `where`."""
    import json
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{where}: not UTF-8 text (bad byte at offset {e.start})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise error(f"{where}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    except RecursionError:
        raise error(f"{where}: not valid JSON (nested too deeply)") from None
    except ValueError as e:  # e.g. an integer with thousands of digits
        raise error(f"{where}: not valid JSON ({str(e).split(';')[0]})") from None


_TYPE_WORDS = {"int": "an integer", "float": "a number", "str": "a string", "bool": "true or false",
               "array": "a list", "object": "an object", "null": "null"}


def validation_message(e, where: str = "", top: str = "document") -> str:
    """A msgspec ValidationError in this project's words, one line naming the field: "Expected
    `int` >= 1, got `float` - at `$.max_tokens`" -> "max_tokens: expected an integer >= 1, got a
    number"; a missing field -> "field: missing". `where` goes before the field's path (a dot
    between them; none before an index), `top` names an error at the top of the document."""
    import re
    m = re.match(r"(?P<what>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", str(e), re.S)
    what, path = m.group("what"), m.group("path") or ""
    missing = re.match(r"Object missing required field `(\w+)`", what)
    if missing:
        path, what = f"{path}.{missing.group(1)}", "missing"
    else:
        def name(t):
            return " or ".join(_TYPE_WORDS.get(x.strip(), x.strip()) for x in t.group(1).split("|"))
        what = re.sub(r"`([^`]+)`", name, what)
        what = what[:1].lower() + what[1:]
    if path.startswith("."):
        path = path[1:]
    if not path:
        return f"{where or top}: {what}"
    return f"{where}{'.' if where and not path.startswith('[') else ''}{path}: {what}"

