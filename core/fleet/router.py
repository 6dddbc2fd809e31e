"""Router policies: which replica gets a request. One module, used by the fleet simulator
(core.fleet.sim) and by a real fleet's front end alike: a policy sees only `Signals` (what the
router knows of each candidate replica, as of some time) and the request's prompt blocks.

Policies (`POLICIES`):
- `round-robin`: the i-th request routed among the same N candidates (in replica order) to
  candidate i mod N (the prefill and the decode choices of disaggregated serving turn apart).
- `random`: uniform over the candidates (seeded).
- `least-requests`: fewest requests held (running + waiting + routed but not yet queued).
- `least-kv`: lowest KV use (used blocks / pool); ties: fewest requests.
- `power-of-two`: two distinct candidates drawn at random (seeded), the one holding fewer
  requests (ties: the first drawn) — Mitzenmacher's "power of two choices".
- `prefix-aware`: after sglang-router's `cache_aware`. The candidate whose cache holds the
  longest prefix of the prompt wins if that prefix is more than `cache_threshold` (default
  0.3, sglang's) of the prompt's blocks — unless it is overloaded: it holds more than
  `balance_abs` (default 4) requests more than the least loaded candidate *and* more than
  `balance_rel` (default 1.5, sglang's) times as many; then the least loaded wins. No cache
  over the threshold: the candidate whose cache holds the fewest blocks (the most room), then
  the least loaded — with approximate knowledge, as sglang (its record grows at each routing,
  so a burst spreads); with precise knowledge the least loaded, then the emptiest cache (the
  replicas' cached blocks change only as their steps end, so "emptiest" would send a whole
  burst to one replica). sglang checks the imbalance over all workers and uses 64 as its absolute
  threshold (workers holding hundreds of requests); ours is per the prefix's holder and 4, for
  replicas holding tens (`--router-param balance_abs=64` gives sglang's).
  Its prefix knowledge is *approximate* by default, as sglang's: what the router itself sent
  where (a per-replica LRU of block hashes, capped at the replica's pool size).
- `weighted`: llm-d's scorer sum. Each scorer (SCORERS: name -> function, its weight a router
  parameter of that name) gives every candidate a score in [0, 1]:
  `prefix` = cached prefix blocks / prompt blocks; `queue` = 1 - (q - q_min)/(q_max - q_min)
  over the candidates' requests held (1 for all when equal); `kv` = 1 - KV use. The candidate
  with the highest weighted sum wins. Default weights are llm-d's
  (`precise-prefix-cache:2, queue-depth:1, kv-utilization:1`); its prefix knowledge is
  *precise* by default, as llm-d's precise scorer: the replicas' own cached blocks, as their
  KV events reported them.

Ties (several candidates equally good) go to the first of them at or after a pointer that
moves one candidate on at every decision among the same candidates (the prefill replicas and
the decode replicas each have their own), so equal replicas share the load deterministically
(a lowest-index rule would send every tie to replica 0, and under stale signals everything).

Staleness: the router reads each replica's load signals and (precise) cached blocks as of
`staleness_ms` ago; what it sent itself (approximate prefix knowledge, the round-robin
counter) it knows at once. Admission: `queue_limit` caps the requests waiting across the
fleet (as the router sees them); over it, a request is rejected at the router. Drain: a
replica taken out of rotation at time t gets nothing routed after t.
"""
from __future__ import annotations

import functools
import math
import random as _random
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

from core.config import check_options, opt
from core.errors import ConfigError

PREFIX_MODES = ("precise", "approximate")
ROLES = ("both", "prefill", "decode")   # a replica's role: whole requests, or one side of disaggregated serving


class Policy:
    """One routing policy, registered by name (`register`): `choose(router, cands, prompt_blocks)`
    picks a candidate from what the router knows of each (Signals) and may use the router's
    memory (its seeded generator, its round-robin counters, `router.best`). Declared with it: its
    words for the page (`words`), its parameters and their defaults (`params`), the prefix
    knowledge it uses by default (`prefix`: precise, approximate, or None: it does not look at
    prefixes), and whether it decides without any signal (`signal_free`: a fleet then plans every
    route ahead, asking it with prompt_blocks 0: such a policy reads neither signals nor the
    prompt). Adding a policy is one subclass: the simulator, `gpu_runner fleet`, the command lines'
    --router and the Fleet page all read the registry (worker processes get it through
    policy_setup)."""
    name = ""
    words = ""
    params: dict = {}
    prefix: str | None = None
    signal_free = False

    @staticmethod
    def choose(router, cands: list, prompt_blocks: int):
        raise NotImplementedError   # (register refuses a policy that leaves this as it is)


REGISTRY: dict[str, type[Policy]] = {}


def register(cls: type[Policy]) -> type[Policy]:
    """Register a Policy subclass under its name (a class decorator)."""
    if not cls.name or not cls.words:
        raise ConfigError(f"router policy {cls.__name__}: a name and words are needed")
    if cls.choose is Policy.choose:
        raise ConfigError(f"router policy {cls.name}: it needs its own choose(router, cands, prompt_blocks)")
    if cls.prefix not in (None, *PREFIX_MODES):
        raise ConfigError(f"router policy {cls.name}: prefix knowledge must be precise, approximate or None")
    REGISTRY[cls.name] = cls
    return cls


ROUTER_MODULE_HELP = ("import MODULE before anything else: a module that registers routing policies "
                      "(core.fleet.router.register); they are then --router choices")


def load_policies(modules) -> list[str]:
    """Import modules that hold routing policies (a command line's --router-module): each registers
    its Policy classes as it is imported (`register`), or lists them in ROUTER_POLICIES (registered
    here); returns the names added. ConfigError naming a module that cannot be imported."""
    import importlib
    before = set(REGISTRY)
    for m in modules or ():
        try:
            mod = importlib.import_module(m)
        except Exception as e:   # (its own error, in one line)
            raise ConfigError(f"--router-module {m}: cannot import it ({type(e).__name__}: {e})") from None
        for cls in getattr(mod, "ROUTER_POLICIES", ()):
            register(cls)
    return [n for n in REGISTRY if n not in before]


def policy_setup() -> tuple | None:
    """What a worker process must run to know the policies registered here beyond the shipped ones
    (core.sim.parallel.run_all's `setup`): (load_policies, their modules), or None."""
    mods = sorted({c.__module__ for c in REGISTRY.values() if c.__module__ != __name__})
    return (load_policies, mods) if mods else None


def router_modules(argv) -> list[str]:
    """The --router-module values of a command line (read before its parser checks --router)."""
    out, args = [], list(argv or ())
    for k, x in enumerate(args):
        flag, eq, value = x.partition("=")
        if len(flag) > len("--router-") and "--router-module".startswith(flag):   # (argparse takes a prefix)
            if eq:
                out.append(value)
            elif k + 1 < len(args):
                out.append(args[k + 1])
    return out


class _Live:
    """A read-only view of what `read()` returns now: never stale (a policy registered later is in it)."""

    def __init__(self, read):
        self._read = read

    def __getitem__(self, k):
        return self._read()[k]

    def __len__(self):
        return len(self._read())

    def __iter__(self):   # (read once: Sequence's would read it again for every item)
        return iter(self._read())

    def __contains__(self, k):   # (a router asks at every routing: one read, not one per item)
        return k in self._read()

    def __repr__(self):
        return repr(self._read())


class _LiveNames(_Live, Sequence):
    """The registry's names, live."""


class _LiveMap(_Live, Mapping):
    """What the registered policies declare, live."""


POLICIES = _LiveNames(lambda: tuple(REGISTRY))                       # their names, in registration order
RECORDED_SIGNALS = 16   # a route event records what the router saw of at most this many replicas


def recorded(cands: list, chosen: tuple, scores: dict | None) -> tuple[list, dict | None, int]:
    """What a route event keeps of a decision among `cands` (Signals, or replica indices): the
    chosen replicas', then the best scored (or, without scores, the first in replica order), up to
    RECORDED_SIGNALS; their scores; how many candidates were left out. A fleet of thousands of
    replicas would otherwise record thousands of entries per request (2,000 requests on 4,096
    replicas: 5 GB)."""
    if len(cands) <= RECORDED_SIGNALS:
        return list(cands), scores, 0
    import heapq
    at = {(c if isinstance(c, int) else c.replica): k for k, c in enumerate(cands)}
    order = [r for r in dict.fromkeys(chosen) if r in at]
    room = RECORDED_SIGNALS - len(order)
    if scores:
        rest = heapq.nsmallest(room, (r for r in at if r not in order), key=lambda r: (-scores.get(r, 0.0), r))
    else:           # (candidates come in replica order: the first ones)
        rest = []
        for r in at:
            if len(rest) == room:
                break
            if r not in order:
                rest.append(r)
    keep = order + rest
    return [cands[at[r]] for r in keep], None if scores is None else {r: scores[r] for r in keep if r in scores}, \
        len(cands) - len(keep)


def check_roles(roles: list[str], where: str = "roles") -> None:
    """A fleet's replica roles: all `both` (whole requests), or prefill and decode ones (at least one
    of each); ConfigError otherwise (the fleet simulator's rule, and a measured fleet's)."""
    bad = [r for r in roles if r not in ROLES]
    if bad:
        raise ConfigError(f"{where}: expected each of {', '.join(ROLES)}, got {bad[0]!r}")
    kinds = set(roles)
    if "both" in kinds and len(kinds) > 1:
        raise ConfigError(f"{where}: replicas are either all whole (role both) or prefill and decode ones, got "
                          f"{','.join(roles)}")
    if "both" not in kinds and kinds != {"prefill", "decode"}:
        raise ConfigError(f"{where}: disaggregated serving needs at least one prefill and one decode replica, got "
                          f"{','.join(roles)}")


# In a student's words (the Fleet page's glossary and its policy help): what each policy does
POLICY_WORDS = _LiveMap(lambda: {n: c.words for n, c in REGISTRY.items()})
GLOSSARY = {
    "replica": "one copy of the model on its own GPU(s), with its own scheduler, batch and KV cache.",
    "router": "the front door of a fleet: every request arrives there first and the router chooses the replica "
              "that serves it, using a policy and what it knows of each replica.",
    "staleness": "how old the router's knowledge of each replica is. Real routers hear of a replica's load "
                 "every so often, not at every step; with stale signals, a router that looks at loads can send a "
                 "whole burst to the replica that looked idle.",
    "P:D split": "disaggregated serving: P prefill replicas compute prompts, D decode replicas generate the "
                 "tokens; each prompt's KV cache is copied over a link from its prefill replica to its decode "
                 "replica. Prefill (compute-bound) and decode (memory-bound) then stop slowing each other down.",
    "drain": "taking a replica out of the router's rotation: it gets no new requests but finishes the ones it "
             "holds, so it can stop without cutting anyone off.",
}
PREFIX_POLICIES = _LiveNames(lambda: tuple(n for n, c in REGISTRY.items() if c.prefix))   # those that look at prefixes
DEFAULT_PREFIX_MODE = _LiveMap(lambda: {n: c.prefix for n, c in REGISTRY.items() if c.prefix})
# sglang-router's cache_aware defaults (its Rust router's --cache-threshold, --balance-abs-threshold,
# --balance-rel-threshold) and llm-d's default scorer weights.
NO_LOAD_CHECK = 1e9     # prefix-aware's balance_abs that switches its load check off
DEFAULT_PARAMS = _LiveMap(lambda: {n: dict(c.params) for n, c in REGISTRY.items() if c.params})


@dataclass(slots=True)
class Signals:
    """What the router knows of one replica: its load as the replica reported it (as of
    `t_ms`), and the prefix of this request's prompt it holds (blocks)."""
    replica: int
    requests: int          # running + waiting + routed there but not yet queued
    running: int
    waiting: int
    kv_used_blocks: int
    kv_blocks: int
    cached_blocks: int = 0     # blocks the router believes it has cached in all
    prefix_blocks: int = 0     # of this request's prompt blocks, the leading ones cached there
    t_ms: float = 0.0          # the time these signals describe
    cpu_prefix_blocks: int = 0   # and the ones after those held in its CPU tier (precise knowledge of a tier)

    @property
    def kv_usage(self) -> float:
        return self.kv_used_blocks / max(1, self.kv_blocks)

    def to_dict(self) -> dict:
        d = signals_dict(self.requests, self.running, self.waiting, self.kv_used_blocks, self.kv_blocks,
                         self.prefix_blocks, self.cached_blocks, self.t_ms)
        if self.cpu_prefix_blocks:
            d["cpu_prefix_blocks"] = self.cpu_prefix_blocks
        return d


def signals_dict(requests: int, running: int, waiting: int, kv_used: int, kv_blocks: int, prefix: int, cached: int,
                 t_ms: float) -> dict:
    """What a route event records of one candidate (Signals.to_dict; the fleet simulator's
    read-back builds it from columns)."""
    return {"requests": requests, "running": running, "waiting": waiting, "kv_usage": _usage(kv_used, kv_blocks),
            "prefix_blocks": prefix, "cached_blocks": cached, "as_of_ms": t_ms}


@functools.lru_cache(maxsize=1 << 16)
def _usage(kv_used: int, kv_blocks: int) -> float:
    """The KV usage a route event records (a few distinct values a run: each rounded once)."""
    return round(kv_used / max(1, kv_blocks), 6)


@dataclass(slots=True)
class Decision:
    replica: int
    reason: str                          # in words: why this one
    scores: dict[int, float]             # candidate -> its score (higher wins), where the policy scores


def param_item(text: str) -> tuple[str, float]:
    """One --router-param KEY=VALUE as (key, number)."""
    k, sep, v = text.partition("=")
    if not sep or not k:
        raise ConfigError(f"router parameter {text!r}: expected key=value")
    try:
        return k.strip(), float(v)
    except ValueError:
        raise ConfigError(f"router parameter {k}: expected a number, got {v!r}") from None


def parse_params(items) -> dict:
    """`key=value` strings (a command line's --router-param), or (key, number) pairs as param_item
    read them, as a dict of numbers."""
    return dict(param_item(s) if isinstance(s, str) else s for s in items or ())


@dataclass
class RouterConfig:
    """The router's settings, each declared once (core.config.opt): the --router* flags of both
    command lines (`python -m core simulate|sweep|search`, `python -m gpu_runner fleet`), trace
    metadata and the table in docs/configuration.md come from these declarations."""
    FLAG_PREFIX: ClassVar[str] = "router-"
    policy: str = opt("round-robin", "routing policy (each defined in core/fleet/router.py's docstring; "
                      "--router-module adds more)", flag="--router", choices=POLICIES)
    staleness_ms: float = opt(0.0, "the router reads each replica's load (and, precise, its cached blocks) as of "
                              "this many ms ago", minimum=0, below=1e9, metavar="S")
    seed: int = opt(0, "seed of the router's random draws (random, power-of-two); sweep and search: the arrivals' "
                    "--seed (each repeat's) seeds the router too", metavar="SEED")
    prefix: str | None = opt(None, "prefix-aware/weighted: what the router knows of each replica's prefix cache, "
                             "the replicas' own cached blocks (precise) or what it sent where (approximate); "
                             "default: prefix-aware approximate, weighted precise", choices=PREFIX_MODES)
    queue_limit: int | None = opt(None, "refuse a request at the router when this many requests wait across the "
                                  "fleet, as the router sees them (finish reason rejected)", minimum=0,
                                  metavar="Q")
    params: dict = opt(help="policy parameter KEY=VALUE (repeat): prefix-aware cache_threshold 0.3, "
                       "balance_abs 4, balance_rel 1.5; weighted weights prefix 2, queue 1, kv 1",
                       flag="--router-param", parse=param_item, many=parse_params, factory=dict, metavar="KEY=VALUE")

    def __post_init__(self):
        try:
            check_options(self)
        except ConfigError as e:     # ("policy" alone would read as the scheduler's)
            raise ConfigError(f"router {e}") from None
        if self.prefix is not None and self.policy not in PREFIX_POLICIES:
            raise ConfigError(f"router prefix knowledge ({self.prefix}): {self.policy} does not look at prefixes "
                              f"(only {' and '.join(PREFIX_POLICIES)} do); leave it out")
        known = DEFAULT_PARAMS.get(self.policy, {})
        if not isinstance(self.params, dict):
            raise ConfigError(f"router parameters: expected an object of numbers, got {self.params!r}")
        for k, v in self.params.items():
            if k not in known:
                raise ConfigError(f"router parameter {k!r}: {self.policy} takes "
                                  + (", ".join(known) if known else "no parameters"))
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < math.inf:
                raise ConfigError(f"router parameter {k}: expected a finite number >= 0, got {v!r}")
        self.params = {**known, **{k: float(v) for k, v in self.params.items()}}

    @property
    def prefix_mode(self) -> str | None:
        """How the router knows what each replica has cached (None: the policy does not look)."""
        if self.policy not in PREFIX_POLICIES:
            return None
        return self.prefix or DEFAULT_PREFIX_MODE[self.policy]

    def to_dict(self) -> dict:
        d = {"policy": self.policy, "staleness_ms": self.staleness_ms, "seed": self.seed}
        if self.prefix_mode:
            d["prefix"] = self.prefix_mode
        if self.params:
            d["params"] = dict(self.params)
        if self.queue_limit is not None:
            d["queue_limit"] = self.queue_limit
        return d


class Router:
    """Chooses a replica for each request with one policy (`choose`). Holds what the policy
    remembers: the round-robin counter, the seeded generator, and (approximate prefix
    knowledge) the block hashes it sent to each replica."""

    def __init__(self, config: RouterConfig, replicas: int, capacity_blocks: list[int] | None = None):
        self.cfg = config
        self.n = replicas
        self.rng = _random.Random(config.seed)
        self.rr_of: dict = {}   # round-robin: the next turn of each candidate set (prefill, decode, ...)
        self.turns: dict = {}   # the tie-break pointer of each candidate set (moves at each of its decisions)
        self.turn = 0
        cap = capacity_blocks or [1 << 30] * replicas
        self.sent: list[OrderedDict] = [OrderedDict() for _ in range(replicas)]   # approximate: hash -> None (LRU)
        self.cap = list(cap)
        self.prefix_mode = config.prefix_mode   # (read at every routing: the config's is worked out each time)

    # -- approximate prefix knowledge: what the router sent where --------------------------------
    def known_prefix(self, replica: int, hashes: list, published: set) -> tuple[int, int]:
        """(the blocks the router believes `replica` holds, of them the prompt's leading blocks
        `hashes`): with precise knowledge the hashes the replica `published` (its cache events, as
        heard), with approximate knowledge what the router sent it (`remember`). Both fleets ask."""
        known = published if self.prefix_mode == "precise" else self.sent[replica]
        k = 0
        for h in hashes:
            if h not in known:
                break
            k += 1
        return len(known), k

    def remember(self, replica: int, hashes: list):
        seen = self.sent[replica]
        for h in hashes:
            if h in seen:
                seen.move_to_end(h)
            else:
                seen[h] = None
        while len(seen) > self.cap[replica]:
            seen.popitem(last=False)

    def best(self, cands: list[Signals], key) -> Signals:
        """The candidate with the smallest `key`; ties: the first at or after the rotating pointer
        (a position among these candidates)."""
        keys = [key(s) for s in cands]
        low = min(keys)
        tied = [j for j, k in enumerate(keys) if k == low]
        if len(tied) == 1:
            return cands[tied[0]]
        start = self.turn % len(cands)
        return cands[min(tied, key=lambda j: (j - start) % len(cands))]

    # -- the choice ------------------------------------------------------------------------------
    def choose(self, cands: list[Signals], prompt_blocks: int) -> Decision:
        """The replica for a request among `cands` (non-empty, in replica order), given what the
        router knows of each and the request's prompt length in full blocks: the policy's choice
        (REGISTRY), the only candidate when there is one."""
        group = tuple([c.replica for c in cands])   # one pointer per set of candidates (prefill, decode, ...)
        self.turn = self.turns[group] = self.turns.get(group, -1) + 1
        if len(cands) == 1:
            c = cands[0]
            return Decision(c.replica, "the only replica in rotation", {c.replica: 1.0})
        policy = REGISTRY.get(self.cfg.policy)
        if policy is None:   # (a policy a --router-module registered in another process)
            raise ConfigError(f"router policy {self.cfg.policy!r} is not registered in this process (known: "
                              f"{', '.join(REGISTRY)}); a module's policy is registered where it is imported")
        return policy.choose(self, cands, prompt_blocks)


# ---- the policies -------------------------------------------------------------------------------------
@register
class RoundRobin(Policy):
    name, signal_free = "round-robin", True
    words = ("takes turns: request 0 to replica 0, request 1 to replica 1, ... and around again. It never looks "
             "at the replicas, so it cannot be misled by old news, nor avoid a busy replica.")

    @staticmethod
    def choose(router, cands: list[Signals], prompt_blocks: int) -> Decision:
        group = tuple([c.replica for c in cands])   # (a counter per candidate set: prefill, decode turn apart)
        k = router.rr_of.get(group, 0)
        router.rr_of[group] = k + 1
        c = cands[k % len(cands)]
        return Decision(c.replica, f"turn {k} of round-robin over {len(cands)}", {})


@register
class Random(Policy):
    name, signal_free = "random", True
    words = 'picks a replica at random for each request: even on average, uneven in any short stretch.'

    @staticmethod
    def choose(router, cands: list[Signals], prompt_blocks: int) -> Decision:
        c = cands[router.rng.randrange(len(cands))]
        return Decision(c.replica, "drawn at random", {})


@register
class LeastRequests(Policy):
    name = "least-requests"
    words = 'sends each request to the replica holding the fewest requests (running, waiting, or just sent there).'

    @staticmethod
    def choose(router, cands: list[Signals], prompt_blocks: int) -> Decision:
        c = router.best(cands, lambda s: s.requests)
        return Decision(c.replica, f"fewest requests ({c.requests})", {s.replica: -s.requests for s in cands})


@register
class LeastKV(Policy):
    name = "least-kv"
    words = 'sends each request to the replica with the most free KV-cache memory (ties: fewest requests).'

    @staticmethod
    def choose(router, cands: list[Signals], prompt_blocks: int) -> Decision:
        c = router.best(cands, lambda s: (s.kv_usage, s.requests))
        return Decision(c.replica, f"lowest KV use ({c.kv_usage:.1%})",
                        {s.replica: -round(s.kv_usage, 6) for s in cands})


@register
class PowerOfTwo(Policy):
    name = "power-of-two"
    words = ("draws two replicas at random and sends the request to the less busy of the two: nearly as good as "
             "asking every replica, at the price of asking two.")

    @staticmethod
    def choose(router, cands: list[Signals], prompt_blocks: int) -> Decision:
        a, b = router.rng.sample(range(len(cands)), 2)
        x, y = cands[a], cands[b]
        c = y if y.requests < x.requests else x
        return Decision(c.replica, f"fewer requests of two drawn (replicas {x.replica}: {x.requests}, "
                        f"{y.replica}: {y.requests})", {x.replica: -x.requests, y.replica: -y.requests})


@register
class PrefixAware(Policy):
    # sglang-router's cache_aware defaults (its Rust router's --cache-threshold, --balance-abs-threshold,
    # --balance-rel-threshold)
    name, prefix = "prefix-aware", "approximate"
    params = {"cache_threshold": 0.3, "balance_abs": 4.0, "balance_rel": 1.5}
    words = ("sends a request to the replica that already has the longest start of its prompt in its prefix cache "
             "(that part need not be computed again), unless that replica is much busier than the least busy one "
             "(its load check); with no useful cache anywhere, it spreads the load. After sglang-router's "
             "cache_aware.")

    @staticmethod
    def choose(router, cands: list[Signals], prompt_blocks: int) -> Decision:
        return cache_aware(router, cands, prompt_blocks, {s.replica: s.prefix_blocks for s in cands})


def cache_aware(router, cands: list[Signals], prompt_blocks: int, held: dict) -> Decision:
    """sglang's cache_aware over `held` (replica -> the prompt's blocks it holds, as the policy counts
    them): the longest held prefix over cache_threshold wins unless its replica fails the load check."""
    prm = router.cfg.params
    least = router.best(cands, lambda s: s.requests)
    scores = {s.replica: round(held[s.replica] / max(1, prompt_blocks), 6) for s in cands}
    best = router.best(cands, lambda s: (-held[s.replica], s.requests))
    got = held[best.replica]
    rate = got / max(1, prompt_blocks)
    if not (got and rate > prm["cache_threshold"]):
        if router.prefix_mode == "precise":
            room = router.best(cands, lambda s: (s.requests, s.cached_blocks))
            why = f"the least loaded ({room.requests} requests)"
        else:
            room = router.best(cands, lambda s: (s.cached_blocks, s.requests))
            why = f"the emptiest cache ({room.cached_blocks} blocks)"
        return Decision(room.replica, f"no cache holds over {prm['cache_threshold']:.0%} of the prompt "
                        f"(best {rate:.0%}): {why}", scores)
    lo = least.requests
    if best.requests - lo > prm["balance_abs"] and best.requests > lo * prm["balance_rel"]:
        return Decision(least.replica, f"replica {best.replica} holds the prefix but is overloaded "
                        f"({best.requests} requests vs {lo}): the least loaded", scores)
    tier = f" ({best.prefix_blocks} on its GPU, {best.cpu_prefix_blocks} in its CPU tier)" \
        if best.cpu_prefix_blocks and got != best.prefix_blocks else ""
    shown = got if isinstance(got, int) else f"{got:g}"
    return Decision(best.replica, f"holds {shown} of {prompt_blocks} prompt blocks{tier} "
                    f"({rate:.0%} > {prm['cache_threshold']:.0%})", scores)


@register
class TierAware(Policy):
    name, prefix = "tier-aware", "precise"
    params = {**PrefixAware.params, "cpu_weight": 0.5}
    words = ("prefix-aware routing that knows which tier holds a prefix, as llm-d's index by tier: the prompt's "
             "leading blocks in a replica's GPU prefix cache count fully, the ones after them in its CPU tier "
             "count `cpu_weight` (0.5) each (they save their prefill but must be loaded first); then as "
             "prefix-aware, with the replicas' own cache news (precise).")

    @staticmethod
    def choose(router, cands: list[Signals], prompt_blocks: int) -> Decision:
        w = router.cfg.params["cpu_weight"]
        return cache_aware(router, cands, prompt_blocks,
                           {s.replica: s.prefix_blocks + w * s.cpu_prefix_blocks for s in cands})


def _prefix_scores(cands: list[Signals], prompt_blocks: int) -> list[float]:
    """The share of the prompt's blocks each candidate has cached (llm-d's precise-prefix-cache)."""
    return [s.prefix_blocks / max(1, prompt_blocks) for s in cands]


def _queue_scores(cands: list[Signals], prompt_blocks: int) -> list[float]:
    """1 - (q - q_min) / (q_max - q_min) over the requests each holds; 1 for all when equal (queue-depth)."""
    qs = [s.requests for s in cands]
    qlo, qhi = min(qs), max(qs)
    return [1.0 if qhi == qlo else 1.0 - (q - qlo) / (qhi - qlo) for q in qs]


def _kv_scores(cands: list[Signals], prompt_blocks: int) -> list[float]:
    """1 - KV use (kv-utilization)."""
    return [1.0 - min(1.0, s.kv_usage) for s in cands]


# The weighted policy's scorers, by the name its weight (a router parameter) has: each gives every
# candidate a score in [0, 1]; a scorer added here, with its default weight in Weighted.params, is used.
SCORERS = {"prefix": _prefix_scores, "queue": _queue_scores, "kv": _kv_scores}


@register
class Weighted(Policy):
    # llm-d's default scorer weights (one per SCORERS entry, in the order they are summed)
    name, prefix = "weighted", "precise"
    params = {"prefix": 2.0, "queue": 1.0, "kv": 1.0}
    words = ("scores every replica on three things, the share of the prompt it has cached (weight 2), how few "
             "requests it holds (1) and how much KV memory it has free (1), and takes the highest total. After "
             "llm-d's scorers.")

    @staticmethod
    def choose(router, cands: list[Signals], prompt_blocks: int) -> Decision:
        w = router.cfg.params
        parts = {k: SCORERS[k](cands, prompt_blocks) for k in w}
        scores = {}
        for i, s in enumerate(cands):
            total = 0.0
            for k, weight in w.items():      # (in the weights' order: the sums are the same to the last bit)
                total += weight * parts[k][i]
            scores[s.replica] = round(total, 9)
        best = router.best(cands, lambda s: -scores[s.replica])
        return Decision(best.replica, f"highest weighted score {scores[best.replica]:g} "
                        f"(prefix x{w['prefix']:g}, queue x{w['queue']:g}, kv x{w['kv']:g})", scores)
