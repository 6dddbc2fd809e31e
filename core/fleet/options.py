"""The fleet's command-line flags, shared by `simulate`, `sweep` and `search`, and the FleetSpec
they describe (None: no fleet flag given, one engine as before).

    --replicas N | --prefill-replicas P --decode-replicas D
    --router POLICY [--router-staleness-ms S] [--router-prefix precise|approximate]
    [--router-param KEY=VALUE ...] [--router-queue-limit Q] [--drain REPLICA@MS ...]
    --kv-link-gbps B --kv-link-latency-ms L [--pd-min-prompt T]    (disaggregated; KV size from --model)
    --replicas-file F.json       replicas that differ: a list of {role, drain_ms, <scheduler option>...,
                                 step_model: {<step model option>...}}

`sweep` and `search` take the same flags (`add_fleet_flags(p, seed=False)`: their `--seed` of the
Poisson arrivals seeds the router too); they hand their workers a FleetSpec (dataclasses: pickled to
worker processes and Ray tasks), `search` builds one per grid point from a FleetFlags (the flags as data).

Every flag is declared once (core.config.opt): the fleet's own in FleetOptions, the router's in
core.fleet.router.RouterConfig; the flags, `gpu_runner fleet`'s (the same names), FleetFlags' fields
and docs/configuration.md's tables are generated from them.
"""
from __future__ import annotations

import argparse
import dataclasses

from core.config import SchedulerConfig, add_flags, flag_dest, flag_name, flag_values, from_dict, opt, options
from core.errors import ConfigError
from core.fleet.router import (
    PREFIX_POLICIES,
    ROLES,
    ROUTER_MODULE_HELP,
    RouterConfig,
)
from core.fleet.spec import FleetSpec, ReplicaSpec

MAX_REPLICAS = 4096


def _count(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if not 1 <= v <= MAX_REPLICAS:
        raise argparse.ArgumentTypeError(f"expected an integer in 1..{MAX_REPLICAS}, got {v}")
    return v


def _nonneg(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}") from None
    if not 0 <= v < 1e12:
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text!r}")
    return v


def _positive(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        v = None
    if v is None or not 0 < v < 1e12:
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {text!r}")
    return v


def _count_of(what: str):
    """An argparse type: an integer count of `what`, 0 to 2^31 - 1."""
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            v = -1
        if not 0 <= v < 2**31:
            raise argparse.ArgumentTypeError(f"expected a number of {what} >= 0, got {text!r}")
        return v
    return parse


_prompt_tokens = _count_of("prompt tokens")
_queue_limit = _count_of("requests")


def _link_gbps(text: str) -> float:
    """A KV link's bandwidth: 1 MB/s (0.001 GB/s) to 1 PB/s: below, one prompt's KV takes longer than
    any run a trace can hold."""
    v = _positive(text)
    if not 1e-3 <= v <= 1e6:
        raise argparse.ArgumentTypeError(f"expected GB/s in 0.001..1e6 (1 MB/s to 1 PB/s), got {text!r}")
    return v


def _drain(text: str) -> tuple[int, float]:
    r, sep, t = text.partition("@")
    try:
        rep, ms = int(r), float(t)
    except ValueError:
        rep = ms = None
    if not sep or rep is None or rep < 0 or not 0 <= ms < 1e12:
        raise argparse.ArgumentTypeError(f"expected REPLICA@MS (e.g. 1@5000: replica 1 leaves rotation at 5 s), "
                                         f"got {text!r}")
    return rep, ms


_SPEC = {f.name: f.default for f in dataclasses.fields(FleetSpec)}      # (the link's defaults are FleetSpec's)
# The fleet's own options (the router's are RouterConfig's). Each option's flag, help, argument check
# and docs/configuration.md row come from these declarations; `gpu_runner fleet` takes the ones a real
# fleet has (REAL_FLEET) under the same names.
_FLEET_OPTIONS = (
    ("replicas", int | None, opt(None, "identical replicas behind the router, each serving whole requests "
                                 f"(1..{MAX_REPLICAS}; simulate/sweep/search: default one engine; gpu_runner fleet: "
                                 "default 2)", parse=_count, metavar="N")),
    ("prefill_replicas", int | None, opt(None, "disaggregated: replicas that compute prompts (with "
                                         "--decode-replicas)", parse=_count, metavar="P")),
    ("decode_replicas", int | None, opt(None, "disaggregated: replicas that decode (each request's prompt KV "
                                        "arrives over the link)", parse=_count, metavar="D")),
    ("replicas_file", str | None, opt(None, "replicas that differ: a JSON list, one object per replica ({role, "
                                      "drain_ms, scheduler options, step_model: {step model options}}; unset options "
                                      "are the flags'); not with the counts above", metavar="F.json")),
    ("drain", tuple | None, opt(None, "take replica REPLICA (0-based) out of rotation at MS ms; it finishes what it "
                                "holds (repeat)", parse=_drain, many=tuple, metavar="REPLICA@MS")),
    ("kv_link_gbps", float, opt(_SPEC["link_gbps"], "disaggregated: the KV link's bandwidth in GB/s (10^9 "
                                "bytes/s), shared fairly by concurrent transfers", parse=_link_gbps, metavar="B")),
    ("kv_link_latency_ms", float, opt(_SPEC["link_latency_ms"], "disaggregated: latency added to each KV transfer, "
                                      "ms", parse=_nonneg, metavar="L")),
    ("pd_min_prompt", int, opt(_SPEC["pd_min_prompt"], "disaggregated: prompts shorter than T tokens run whole on a "
                               "decode replica", parse=_prompt_tokens, metavar="T")),
)
REAL_FLEET = ("replicas", "prefill_replicas", "decode_replicas", "pd_min_prompt")   # what gpu_runner fleet takes
LINK_DEFAULTS = {name: field.default for name, _, field in _FLEET_OPTIONS
                 if name in ("kv_link_gbps", "kv_link_latency_ms", "pd_min_prompt")}   # (disaggregated only)


def _fleet_option_group():
    """The fleet's own options as an option group (docs/configuration.md's table, the flags)."""
    return dataclasses.make_dataclass("FleetOptions", list(_FLEET_OPTIONS), frozen=True,
                                      namespace={"__module__": __name__})


FleetOptions = _fleet_option_group()
FleetOptions.__doc__ = "The fleet's own options (the router's: RouterConfig), declared once."


def _as_flags(fields, prefix: str = "") -> list:
    """Declared options as FleetFlags' fields: under their flags' names (router, router_staleness_ms,
    router_param, ...), None when not given (the declared defaults apply then)."""
    return [(flag_dest(f, prefix), object, dataclasses.field(default=None, metadata=f.metadata)) for f in fields]


def _from_args(cls, a):
    """The flags as data: every option of `cls` given in the namespace `a` (lists as tuples)."""
    got = {}
    for f in dataclasses.fields(cls):
        v = getattr(a, f.name, None)
        if v is not None:
            got[f.name] = tuple(v) if isinstance(v, list) else v
    return cls(**got)


# The fleet flags as data (what `fleet_from_args` reads), for a caller without a command line (a
# search builds one fleet per grid point from them): the fleet's options, the router's (generated
# from RouterConfig's declarations), and the settings of other groups a fleet reads (the arrivals'
# seed, the model whose KV a transfer moves). Unset: the flags' defaults.
FleetFlags = dataclasses.make_dataclass(
    "FleetFlags",
    [*_as_flags(dataclasses.fields(FleetOptions)), *_as_flags(options(RouterConfig), RouterConfig.FLAG_PREFIX),
     ("seed", int, opt(0, cli=False)), ("model", str | None, opt(None, cli=False)),
     ("dtype_bytes", float, opt(2.0, cli=False))],
    frozen=True, namespace={"from_args": classmethod(_from_args), "__module__": __name__})
FleetFlags.__doc__ = "The fleet's flags as data (core.fleet.options): the fleet's options and the router's."




def add_fleet_flags(p: argparse.ArgumentParser, seed: bool = True):
    g = p.add_argument_group("fleet (several replicas behind a router; core/fleet)")
    # (unset: a flag that does not apply to the fleet given is refused, not silently ignored; the
    # defaults stated in the help are applied in fleet_from_args)
    add_flags(g, FleetOptions, unset=True, skip=("drain", "kv_link_gbps", "kv_link_latency_ms", "pd_min_prompt"))
    add_router_flags(g, defaults=False, seed=seed)
    add_flags(g, FleetOptions, unset=True, skip=("replicas", "prefill_replicas", "decode_replicas", "replicas_file"))
    if seed:   # (the name it had before --router-seed, kept)
        g.add_argument("--seed", dest="router_seed", type=int, help=argparse.SUPPRESS)


def add_real_fleet_flags(p) -> None:
    """`gpu_runner fleet`'s fleet flags: the declared ones a real fleet has, and the router's."""
    add_flags(p, FleetOptions, unset=True, skip=tuple(n for n, _, _ in _FLEET_OPTIONS if n not in REAL_FLEET))
    add_router_flags(p, defaults=True)


def add_router_flags(g, defaults: bool, seed: bool = True) -> None:
    """The router's flags, generated from RouterConfig's declarations for both command lines
    (`python -m core simulate | sweep | search` and `python -m gpu_runner fleet`). `defaults` False:
    they stay None when not given (the core refuses a fleet flag given to one engine;
    router_from_args applies the declared defaults)."""
    add_flags(g, RouterConfig, unset=not defaults, skip=() if seed else ("seed",))
    g.add_argument("--router-module", action="append", metavar="MODULE", help=ROUTER_MODULE_HELP)


def wants_fleet(a) -> bool:
    return bool(a.replicas or a.prefill_replicas or a.decode_replicas or a.replicas_file)


def router_from_args(a) -> RouterConfig:
    """The RouterConfig of either command line's router flags (add_router_flags, or a FleetFlags);
    without --router-seed (sweep, search) the arrivals' --seed seeds the router too."""
    given = flag_values(RouterConfig, a, unset=True)
    if "seed" not in given:
        given["seed"] = getattr(a, "seed", 0) or 0
    return RouterConfig(**given)


# flags that mean something only for a fleet, and those only for disaggregated serving
FLEET_ONLY = {**{flag_dest(f, RouterConfig.FLAG_PREFIX): flag_name(f, RouterConfig.FLAG_PREFIX)
                 for f in options(RouterConfig) if f.name != "seed"},
              "drain": "--drain", "router_module": "--router-module"}
PD_ONLY = {n: "--" + n.replace("_", "-") for n in LINK_DEFAULTS}


def _given(a, flags: dict) -> list[str]:
    return [flag for k, flag in flags.items() if getattr(a, k, None) not in (None, (), [])]


def check_no_fleet_flags(a) -> None:
    """No fleet: refuse the fleet's flags (they would be ignored)."""
    given = _given(a, {**FLEET_ONLY, **PD_ONLY})
    if given:
        raise ConfigError(f"{', '.join(given)}: a fleet's flags, but no fleet is given (add --replicas N, or "
                          "--prefill-replicas P --decode-replicas D, or --replicas-file F)")


def kv_bytes_per_token(a) -> tuple[int, str]:
    """The model's KV bytes per token for disaggregated transfers: the --model preset (the
    roofline step model's), at --dtype-bytes."""
    from core.formulas.kv import MODELS
    name = getattr(a, "model", None) or "Llama-2-7B"
    if name not in MODELS:
        raise ConfigError(f"--model {name!r}: expected one of {', '.join(MODELS)}")
    dtype = getattr(a, "dtype_bytes", None)
    if dtype is None:
        dtype = 2.0
    if not (isinstance(dtype, (int, float)) and 0 < dtype <= 16):    # (0 was priced as 2: fp16, silently)
        raise ConfigError(f"--dtype-bytes: expected bytes per KV element in (0, 16], got {dtype!r}")
    return MODELS[name].kv_bytes_per_token(dtype), name


def _grid_router(a, router: str | None) -> RouterConfig:
    """The flags' router, its policy replaced by a search grid's `router` (the flags' parameters were
    for --router's policy: the grid's other policies take their defaults)."""
    rc = router_from_args(a)
    if router is None or router == rc.policy:
        return rc
    return dataclasses.replace(rc, policy=router, params={}, prefix=rc.prefix if router in PREFIX_POLICIES else None)


def _replica_specs(a, cfg: SchedulerConfig, step_model, n, p, d) -> list[ReplicaSpec]:
    """The replicas: a file's, or n whole ones, or p prefill and d decode ones."""
    if a.replicas_file:
        if n or p or d:
            raise ConfigError("--replicas-file and --replicas/--prefill-replicas/--decode-replicas: give one or the "
                              "other (the file lists every replica)")
        return replicas_from_file(a.replicas_file, cfg, step_model)
    if p or d:
        if n:
            raise ConfigError("--replicas and --prefill-replicas/--decode-replicas: give one or the other")
        if not (p and d):
            raise ConfigError("disaggregated serving needs both --prefill-replicas and --decode-replicas")
        return [ReplicaSpec(cfg, step_model, "prefill") for _ in range(p)] + \
               [ReplicaSpec(cfg, step_model, "decode") for _ in range(d)]
    return [ReplicaSpec(cfg, step_model) for _ in range(n)]


def _drained(specs: list[ReplicaSpec], drains) -> list[ReplicaSpec]:
    """The replicas with --drain REPLICA@MS applied (one drain a replica)."""
    drained: dict[int, float] = {}
    for rep, t in drains or ():
        if rep >= len(specs):
            raise ConfigError(f"--drain {rep}@{t:g}: there are {len(specs)} replicas (0..{len(specs) - 1})")
        if rep in drained:
            raise ConfigError(f"--drain {rep}@{t:g}: replica {rep} is already drained at {drained[rep]:g} ms (one "
                              "drain a replica)")
        drained[rep] = t
        specs[rep] = dataclasses.replace(specs[rep], drain_ms=t)
    return specs


def fleet_from_args(a, cfg: SchedulerConfig, step_model, kv_bytes_per_token=None, model: str | None = None,
                    replicas: int | None = None, prefill: int | None = None, decode: int | None = None,
                    router: str | None = None) -> FleetSpec | None:
    """The FleetSpec the flags describe (None: no fleet flag: one engine). `replicas`, `prefill`,
    `decode`, `router` override the flags (a search's grid)."""
    n = replicas if replicas is not None else a.replicas
    p = prefill if prefill is not None else a.prefill_replicas
    d = decode if decode is not None else a.decode_replicas
    if not (n or p or d or a.replicas_file):
        check_no_fleet_flags(a)
        return None
    rc = _grid_router(a, router)
    specs = _drained(_replica_specs(a, cfg, step_model, n, p, d), a.drain)
    pd = any(s.role != "both" for s in specs)
    if not pd and _given(a, PD_ONLY):
        raise ConfigError(f"{', '.join(_given(a, PD_ONLY))}: disaggregated serving's flags, but every replica runs "
                          "requests whole (give --prefill-replicas and --decode-replicas, or roles in --replicas-file)")
    link = {k: v if getattr(a, k) is None else getattr(a, k) for k, v in LINK_DEFAULTS.items()}
    return FleetSpec(specs, rc, link["kv_link_gbps"], link["kv_link_latency_ms"], link["pd_min_prompt"],
                     kv_bytes_per_token if pd else None, model)


REPLICAS_FILE_BYTES = 16 << 20


def replicas_from_file(path: str, cfg: SchedulerConfig, step_model) -> list[ReplicaSpec]:
    from core.errors import json_from_bytes, read_input_file
    from core.sim.stepmodel import StepModel
    # at most 16 MiB read (a 1 GiB file, or a link to /dev/zero, is refused before it is read whole)
    raw = read_input_file(path, "replicas (a short JSON list)", ConfigError, REPLICAS_FILE_BYTES)
    doc = json_from_bytes(raw, f"--replicas-file {path}", ConfigError)   # (nesting too deep: one line too)
    if not isinstance(doc, list) or not doc or len(doc) > MAX_REPLICAS:
        raise ConfigError(f"--replicas-file {path}: expected a list of 1..{MAX_REPLICAS} replica objects")
    base_cfg = dataclasses.asdict(cfg)
    base_sm = dataclasses.asdict(step_model) if step_model is not None else {}
    out = []
    for i, d in enumerate(doc):
        where = f"--replicas-file {path}: replica {i}"
        if not isinstance(d, dict):
            raise ConfigError(f"{where}: expected an object, got {type(d).__name__}")
        d = dict(d)
        role = d.pop("role", "both")
        if role not in ROLES:
            raise ConfigError(f"{where}: role: expected one of {', '.join(ROLES)}, got {role!r}")
        drain = d.pop("drain_ms", None)
        bad_drain = isinstance(drain, bool) or not isinstance(drain, (int, float)) or not 0 <= drain < 1e12
        if drain is not None and bad_drain:
            raise ConfigError(f"{where}: drain_ms: expected a number of ms >= 0, got {drain!r}")
        sm_d = d.pop("step_model", None)
        if sm_d is not None and not isinstance(sm_d, dict):
            raise ConfigError(f"{where}: step_model: expected an object of step model options")
        try:
            rc = from_dict(SchedulerConfig, {**base_cfg, **d}, where)
            sm = (from_dict(StepModel, {**base_sm, **(sm_d or {})}, f"{where}: step_model")
                  if (sm_d or base_sm) else None)
        except ConfigError:
            raise
        except (TypeError, ValueError) as e:
            raise ConfigError(f"{where}: {e}") from None
        out.append(ReplicaSpec(rc, sm, role, drain))
    return out


def seeded(fleet: FleetSpec, seed: int) -> FleetSpec:
    """The fleet with its router's random draws seeded by `seed` (a sweep run's arrival seed)."""
    if fleet.router.seed == seed:
        return fleet
    return dataclasses.replace(fleet, router=dataclasses.replace(fleet.router, seed=seed))


def fleet_shape(fleet: FleetSpec) -> dict:
    """{replicas, prefill and decode (disaggregated only), router: policy}: what a sweep point or a
    search configuration reports of its fleet (replicas: every replica, prefill and decode ones included)."""
    roles = [r.role for r in fleet.replicas]
    out = {"replicas": len(roles)}
    if fleet.disaggregated:
        out |= {"prefill": roles.count("prefill"), "decode": roles.count("decode")}
    return out | {"router": fleet.router.policy}


def fleet_summary(fleet: FleetSpec) -> dict:
    """fleet_shape, the router's settings and (disaggregated) the link's: a sweep's or search's `fleet`."""
    out = fleet_shape(fleet) | {"router": fleet.router.to_dict()}
    if fleet.disaggregated:
        out |= {"link": {"gbps": fleet.link_gbps, "latency_ms": fleet.link_latency_ms,
                         "kv_bytes_per_token": fleet.kv_bytes_per_token, "model": fleet.model},
                "pd_min_prompt": fleet.pd_min_prompt}
    if any(r.drain_ms is not None for r in fleet.replicas):
        out["drain_ms"] = [r.drain_ms for r in fleet.replicas]
    return out


def describe_shape(shape: dict) -> str:
    """"2 replicas", "1P+3D" (a fleet_shape)."""
    if "prefill" in shape:
        return f"{shape['prefill']}P+{shape['decode']}D"
    n = shape["replicas"]
    return f"{n} replica{'s' if n != 1 else ''}"
