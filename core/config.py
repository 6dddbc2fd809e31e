"""Options as data: every option is declared once, and everything else is derived.

An option group is a `slots` dataclass whose fields are declared with `opt(default, help)`.
From that one declaration come
- `to_dict(cfg)` and `from_dict(Cls, d)`: trace metadata, page presets, JSON files;
- `add_flags(parser, Cls)` and `from_args(Cls, args)`: both command lines;
- `options_markdown(...)`: the option tables in docs/configuration.md (a test keeps them current).
- `check_options(cfg)`: every value against its declaration (type, `choices`, `minimum`,
  `maximum`, `above`, `below`), with one message naming the option; each class's
  `__post_init__` calls it and adds only the rules that join several options. So a value is
  checked the same way whether it came from a flag, a URL, a preset or a trace.

Groups: `SchedulerConfig` (core.engine.scheduler), `SamplingParams` (token sampling),
`core.sim.stepmodel.StepModel` (simulated step times), `gpu_runner.engine.EngineConfig`.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import types
import typing
from dataclasses import MISSING, dataclass, field

from core.errors import ConfigError

# Batching policies (core.engine.policies has each one's rules): the generic three, and four named
# after the systems whose schedulers they follow.
POLICIES = ("serial", "static", "continuous", "vllm-v1", "vllm-v0", "orca", "sarathi")
SARATHI_CHUNK = 512          # sarathi's token budget per step when no chunk is given (Vidur's default)
VLLM_V0_WATERMARK = 0.01     # vllm-v0's free-block watermark when none is given (vLLM's default)
SCHEDULING_POLICIES = ("fcfs", "priority")
KV_MANAGERS = ("keep-cached", "vllm-v1")
CPU_TIER_POLICIES = ("lru", "arc")   # vLLM 0.32's CPU offloading policies (core.kvtier.policy)
BIG = 1 << 62  # "no limit" for budgets and seats


def opt(default=MISSING, help: str = "", *, flag: str | None = None, cli: bool = True,
        choices: tuple | None = None, minimum: float | None = None, maximum: float | None = None,
        above: float | None = None, below: float | None = None, parse=None, factory=None,
        label: str | None = None, none: str = "no limit", many=None, metavar: str | None = None):
    """A declared option. Bounds: `minimum`/`maximum` inclusive, `above`/`below` exclusive
    (`minimum` also drives the flag's argument check: 1 a positive integer, 0 a number >= 0);
    `parse` turns a flag's text into the value (e.g. "0,1" -> (0, 1)); `cli=False` keeps an
    option out of the command lines (set by the program itself). `label`: the option's name on
    a page (its widget is generated from this declaration: ui.widgets.option_input); `none`: what
    an unset (None) value means there, shown as "0 = ...". `many`: the flag may be given several
    times, each text parsed by `parse`, and `many` turns the list into the value (e.g. dict, tuple). """
    meta = {"help": help, "flag": flag, "cli": cli, "choices": choices, "minimum": minimum, "maximum": maximum,
            "above": above, "below": below, "parse": parse, "label": label, "none": none, "many": many,
            "metavar": metavar}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return _is_int(v) or (isinstance(v, float) and math.isfinite(v))


def _range_text(meta: dict, integer: bool) -> str:
    lo, hi = meta.get("minimum"), meta.get("maximum")
    above, below = meta.get("above"), meta.get("below")
    if integer:
        if lo == 1 and hi is None:
            return "a positive integer"
        if lo is not None and hi is not None:
            return f"an integer in {lo}..{hi}"
        return f"an integer >= {lo}" if lo is not None else "an integer"
    left = f"[{lo:g}" if lo is not None else f"({above:g}" if above is not None else None
    right = f"{hi:g}]" if hi is not None else f"{below:g})" if below is not None else None
    if left and right:
        return f"a {'fraction' if (lo, below) == (0, 1) else 'number'} in {left}, {right}"
    if left:
        return f"a finite number {'>=' if lo is not None else '>'} {left[1:]}"
    if right:
        return f"a finite number {'<=' if hi is not None else '<'} {right[:-1]}"
    return "a finite number"


def _in_range(v, meta: dict) -> bool:
    lo, hi, above, below = (meta.get(k) for k in ("minimum", "maximum", "above", "below"))
    return ((lo is None or v >= lo) and (hi is None or v <= hi) and (above is None or v > above)
            and (below is None or v < below))


def check_options(cfg) -> None:
    """Check every option of `cfg` against its declaration (type hint and `opt` metadata);
    the first value that does not fit raises ConfigError naming the option and what it expects.
    Nested option groups check themselves; tuples are left to the class."""
    hints = _hints(type(cfg))
    for f in options(type(cfg)):
        v = getattr(cfg, f.name)
        tp, nullable = _base_type(hints[f.name])
        if v is None and nullable:
            continue
        meta = f.metadata
        none = " or none" if nullable else ""
        if meta.get("choices"):
            if v not in meta["choices"]:
                raise ConfigError(f"{f.name}: expected one of {', '.join(map(str, meta['choices']))}, got {v!r}")
        elif tp is bool:
            if not isinstance(v, bool):
                raise ConfigError(f"{f.name}: expected true or false, got {v!r}")
        elif tp is int:
            if not (_is_int(v) and _in_range(v, meta)):
                raise ConfigError(f"{f.name}: expected {_range_text(meta, True)}{none}, got {v!r}")
        elif tp is float:
            if not (_is_number(v) and _in_range(v, meta)):
                raise ConfigError(f"{f.name}: expected {_range_text(meta, False)}{none}, got {v!r}")
        elif tp is str and not isinstance(v, str):
            raise ConfigError(f"{f.name}: expected a string{none}, got {v!r}")


# ---- the option groups the core owns ---------------------------------------------------------

@dataclass(slots=True)
class SchedulerConfig:
    policy: str = opt("continuous", "serial: one request at a time; static: fixed cohorts; continuous: "
                      "iteration-level refill; vllm-v1, vllm-v0, orca, sarathi: those systems' batching "
                      "rules (see Batching policies)", choices=POLICIES)
    max_seqs: int | None = opt(None, "running sequences at most (default: no limit; serial: 1)", minimum=1,
                               label="Max running sequences")
    token_budget: int | None = opt(None, "tokens computed per step, prefill + decode (default: no limit)",
                                   minimum=1, label="Token budget per step")
    chunk: int | None = opt(None, "chunked prefill: prompt tokens per request per step (default: off; vllm-v1: "
                            "the token budget; sarathi: 512, and the step's token budget)", minimum=1,
                            label="Chunk size (chunked prefill)")
    block_size: int = opt(16, "tokens per KV block", minimum=1, maximum=1 << 20, label="Block size (tokens)")
    kv_blocks: int | None = opt(None, "KV pool size in blocks (default: enough for every request at once)",
                                minimum=1, maximum=1 << 22, label="KV blocks", none="enough for all")
    prefix_caching: bool = opt(False, "reuse cached full blocks whose token-id prefix matches exactly",
                               label="Prefix caching")
    kv_manager: str = opt("keep-cached", "what the KV block manager caches, and when: keep-cached (a full block when "
                          "the step computing it ends, where its token ids are known: a simulated request's prompt "
                          "blocks); vllm-v1 (vLLM V1's: full blocks, outputs included, cached when the step that fills "
                          "them is scheduled; one block of kv_blocks is its null block). Both reuse released uncached "
                          "blocks first, most recent first, then never-used ones, then evict cached-free ones, oldest "
                          "release first, as vLLM 0.32 does", choices=KV_MANAGERS, label="KV block manager")
    scheduling_policy: str = opt("fcfs", "order of the waiting queue: fcfs (arrival order) or priority (lower "
                                 "`priority` first, then arrival; preemption takes the lowest priority)",
                                 choices=SCHEDULING_POLICIES)
    kv_watermark: float | None = opt(None, "admit a request only if this fraction of the KV pool stays free "
                                     "(vLLM's watermark; running requests may still use it; default: 0, "
                                     "vllm-v0: 0.01)", minimum=0, below=1)
    queue_limit: int | None = opt(None, "waiting-queue bound: after each step's admissions, requests beyond it "
                                  "that never ran are rejected, newest first (default: no bound)", minimum=0)
    max_model_len: int | None = opt(None, "context budget: a request whose prompt + output tokens exceed it, or "
                                    "that could never fit the KV pool, is rejected on arrival instead of run",
                                    minimum=1)
    model_id: str | None = opt(None, "part of the prefix-cache key (model/adapter identity)", cli=False)
    spec_gamma: int = opt(0, "speculative decoding: draft tokens verified per decode step (0: off)", cli=False,
                          minimum=0)
    cpu_kv_blocks: int = opt(0, "CPU tier under the prefix cache, in blocks (vLLM's --kv-offloading-size over the "
                             "bytes of a block): full prompt blocks are copied to it as they are computed, and a "
                             "request admitted later loads its prefix from it before its prefill (0: no tier; needs "
                             "prefix_caching and the vllm-v1 KV manager)", minimum=0, maximum=1 << 30,
                             label="CPU tier (blocks)", none="no tier")
    cpu_kv_policy: str = opt("lru", "which CPU-tier block leaves first when a store needs room: lru or arc (vLLM's "
                             "eviction_policy)", choices=CPU_TIER_POLICIES, label="CPU tier eviction")
    kv_block_bytes: int | None = opt(None, "bytes of one KV block, all layers, K and V: the simulated CPU tier prices "
                                     "its copies by it (the runner sets its own)", minimum=1, label="KV block bytes",
                                     none="unset")
    host_gbps: float = opt(25.0, "host link bandwidth for CPU-tier copies, GB/s per direction (one copy at a time "
                           "in each direction, as vLLM's offloading streams)", above=0, label="Host link GB/s")
    host_latency_ms: float = opt(0.0, "fixed time added to each CPU-tier copy, ms", minimum=0,
                                 label="Host link latency (ms)")

    def __post_init__(self):
        check_options(self)
        # the named policies' settings, made explicit here so a trace records what ran
        if self.policy in ("vllm-v0", "orca") and self.chunk is not None:
            raise ConfigError(f"chunk: the {self.policy} policy computes each prompt in one step (no chunked "
                              f"prefill); leave chunk unset, or use vllm-v1, sarathi or continuous")
        if self.policy == "vllm-v1" and self.chunk is None:
            self.chunk = self.token_budget
        if self.policy == "sarathi":
            self.chunk = self.chunk or SARATHI_CHUNK
            self.token_budget = self.chunk if self.token_budget is None else min(self.token_budget, self.chunk)
        if self.kv_watermark is None:
            self.kv_watermark = VLLM_V0_WATERMARK if self.policy == "vllm-v0" else 0.0
        if self.cpu_kv_blocks:
            if not self.prefix_caching or self.kv_manager != "vllm-v1":
                raise ConfigError("cpu_kv_blocks: the CPU tier follows vLLM V1's offloading connector, keyed by the "
                                  "prefix cache's hashes; set prefix_caching and kv_manager vllm-v1")

    @property
    def seats(self) -> int:
        if self.policy == "serial":
            return 1
        return self.max_seqs if self.max_seqs is not None else BIG

    def to_dict(self) -> dict:
        # The effective seat count is recorded (serial: 1), so a trace states its limits.
        return {**to_dict(self), "max_seqs": self.seats if self.seats != BIG else None}


SAMPLING_EPS = 1e-5   # a temperature below it samples greedily (as vLLM does): logits / 1e-40 overflow


@dataclass(slots=True)
class SamplingParams:
    temperature: float = opt(0.0, f"softmax temperature; 0 = greedy (below {SAMPLING_EPS:g}: greedy too)", minimum=0)
    top_k: int = opt(0, "keep the k most likely tokens (0 = off)", minimum=0)
    top_p: float = opt(1.0, "keep the smallest set with this much probability (1 = off)", above=0, maximum=1)
    seed: int = opt(0, "per-request random generators derive from it")

    def __post_init__(self):
        check_options(self)
        if self.temperature < SAMPLING_EPS:
            self.temperature = 0.0      # greedy: one spelling, so every sampler takes the argmax path

    def to_dict(self) -> dict:
        return to_dict(self)


# ---- derived codecs ----------------------------------------------------------------------

@functools.cache
def _hints(cls) -> dict:
    return typing.get_type_hints(cls)


def _base_type(tp):
    """int | None -> (int, True); bool -> (bool, False); nested dataclass -> (cls, False)."""
    args = typing.get_args(tp)
    if typing.get_origin(tp) in (typing.Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return (rest[0] if len(rest) == 1 else tp), True
    return tp, False


def options(cls) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(cls) if f.init]


def to_dict(cfg) -> dict:
    """Plain JSON-able dict of an option group (nested groups as dicts, tuples as lists)."""
    out = {}
    for f in options(type(cfg)):
        v = getattr(cfg, f.name)
        if dataclasses.is_dataclass(v):
            v = v.to_dict() if hasattr(v, "to_dict") else to_dict(v)
        elif isinstance(v, tuple):
            v = list(v)
        out[f.name] = v
    return out


def from_dict(cls, d, where: str = "config", strict: bool = True, aliases: dict | None = None):
    """Build an option group from a dict. strict: unknown keys are an error naming them;
    otherwise they are ignored (trace metadata carries more than the options)."""
    if not isinstance(d, dict):
        raise ConfigError(f"{where}: expected an object of options, got {type(d).__name__}")
    hints = _hints(cls)
    known = {f.name: f for f in options(cls)}
    d = {(aliases or {}).get(k, k): v for k, v in d.items()}
    unknown = [k for k in d if k not in known]
    if strict and unknown:
        raise ConfigError(f"{where}: unknown option {unknown[0]!r} (known: {', '.join(known)})")
    kwargs = {}
    for name in known:
        if name not in d:
            continue
        v = d[name]
        tp, _ = _base_type(hints[name])
        if dataclasses.is_dataclass(tp) and v is not None:
            v = from_dict(tp, v, f"{where}.{name}", strict)
        elif isinstance(v, list) and typing.get_origin(tp) is tuple:
            v = tuple(v)
        elif tp is float and not isinstance(v, bool) and isinstance(v, int):
            v = float(v)
        kwargs[name] = v
    try:
        return cls(**kwargs)
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None


def flag_prefix(cls) -> str:
    """The prefix of a group's flags: its FLAG_PREFIX (e.g. "router-": --router-staleness-ms), else none."""
    return getattr(cls, "FLAG_PREFIX", "")


def flag_name(f: dataclasses.Field, prefix: str = "") -> str:
    return f.metadata.get("flag") or "--" + prefix + f.name.replace("_", "-")


def flag_dest(f: dataclasses.Field, prefix: str = "") -> str:
    """Where a flag's value lands in the parsed namespace: the option's name, or with a `prefix`
    (options of a group that shares a command line with others) the flag's own name, as argparse
    derives it ("--router-staleness-ms" -> router_staleness_ms)."""
    return flag_name(f, prefix).lstrip("-").replace("-", "_") if prefix else f.name


def _arg_type(tp, minimum):
    from core import cli
    if tp is int:
        return cli.positive_int if minimum == 1 else cli.nonneg_int if minimum == 0 else cli.any_int
    if tp is float:
        return cli.nonneg_float if minimum == 0 else cli.finite_float
    return str


def _flag_type(parse):
    """A declaration's `parse` as an argparse type: its InputError's message becomes the flag's
    error ("argument --router-param: router parameter 'x': expected key=value")."""
    from core.errors import InputError

    @functools.wraps(parse)
    def flag_type(text: str):
        try:
            return parse(text)
        except InputError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return flag_type


def _flag_default(f: dataclasses.Field):
    if f.default is not MISSING:
        return f.default
    return None


def add_flags(parser, cls, prefix: str | None = None, skip: tuple = (), defaults: dict | None = None,
              unset: bool = False):
    """One command-line flag per option of `cls` (nested groups are skipped: add them
    with their own call). Defaults come from the declaration unless `defaults` overrides.
    `prefix`: flags named --PREFIX<option> (dest as flag_dest says); `unset`: every flag's value
    stays None when not given (a caller that must tell a flag given from a default, e.g. to refuse
    it where it does not apply), its help still stating the declared default."""
    hints = _hints(cls)
    prefix = flag_prefix(cls) if prefix is None else prefix
    for f in options(cls):
        meta = f.metadata
        if not meta.get("cli", True) or f.name in skip:
            continue
        tp, nullable = _base_type(hints[f.name])
        if dataclasses.is_dataclass(tp):
            continue
        declared = (defaults or {}).get(f.name, _flag_default(f))
        default = None if unset else declared
        help_ = meta.get("help", "").replace("%", "%%")     # (argparse formats help with %)
        dest = flag_dest(f, prefix)
        if tp is bool:
            parser.add_argument(flag_name(f, prefix), dest=dest, action=argparse.BooleanOptionalAction,
                                default=default, help=help_)
            continue
        kw = {"dest": dest, "default": default,
              "help": help_ + ("" if declared is None or meta.get("many") else f" (default {declared})")}
        if meta.get("choices"):
            kw["choices"] = meta["choices"]        # (a live sequence stays live: policies a module registers)
        elif meta.get("parse") is not None:
            kw["type"] = _flag_type(meta["parse"])
        else:
            kw["type"] = _arg_type(tp, meta.get("minimum"))
        if meta.get("many"):
            kw["action"] = "append"
        if meta.get("metavar"):
            kw["metavar"] = meta["metavar"]
        parser.add_argument(flag_name(f, prefix), **kw)


def flag_values(cls, args, prefix: str | None = None, unset: bool = False) -> dict:
    """{option: value} of the parsed flags of `cls` (add_flags with the same prefix); `unset`:
    the flags not given are left out (their declared defaults apply)."""
    out = {}
    prefix = flag_prefix(cls) if prefix is None else prefix
    for f in options(cls):
        dest = flag_dest(f, prefix)
        if not f.metadata.get("cli", True) or not hasattr(args, dest):
            continue
        v = getattr(args, dest)
        if v is None and unset:
            continue
        many = f.metadata.get("many")
        out[f.name] = many(v) if many and v is not None else v
    return out


def from_args(cls, args: argparse.Namespace, prefix: str | None = None, unset: bool = False, **overrides):
    """The option group from parsed flags (options without a flag keep their defaults)."""
    return cls(**(flag_values(cls, args, prefix, unset) | overrides))


def options_markdown(groups: dict) -> str:
    """The option tables of docs/configuration.md: {title: option group class}."""
    out = []
    for title, cls in groups.items():
        out += [f"### {title} (`{cls.__module__}.{cls.__name__}`)", "",
                "| option | flag | default | meaning |", "|---|---|---|---|"]
        for f in options(cls):
            meta = f.metadata
            nested = f.default is MISSING and (f.default_factory is MISSING
                                               or dataclasses.is_dataclass(f.default_factory))
            value = f.default if f.default is not MISSING else None if nested else f.default_factory()
            default = "(options below)" if nested else "none" if value in (None, {}, ()) else f"`{value}`"
            flag = f"`{flag_name(f, flag_prefix(cls))}`" if meta.get("cli", True) and not nested else "—"
            choices = f" ({' / '.join(map(str, meta['choices']))})" if meta.get("choices") else ""
            text = f"{meta.get('help', '')}{choices}".replace("|", "\\|")
            out.append(f"| `{f.name}` | {flag} | {default} | {text} |")
        out.append("")
    return "\n".join(out)


def describe_options(config: dict) -> str:
    """Options in words, as a grid point of a capacity search shows them ("max_seqs 16, kv_blocks none")."""
    return ", ".join(f"{k} {'none' if v is None else v}" for k, v in config.items())
