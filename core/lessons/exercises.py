"""Chapter 31's six exercises, the serving lesson's ten recall questions and five on routing a
fleet, with a link that opens the page (and parameters) to work each one, numeric answers
computed by the core, and reference answers (our wording; the facts and numbers are the
sources').

Numeric answers are never typed in here: each is computed from the bundled chapter traces,
core.analysis.metrics, core.formulas.speculative, or the fleet simulator's runs of the routing
lesson (core.lessons.fleet) and its KV link (core.fleet.link), so they stay equal to what the
pages show.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache


@dataclass(frozen=True)
class Numeric:
    label: str
    value: Callable[[], float]      # the reference value, computed
    tolerance: float
    unit: str = ""

    def check(self, answer: float | None) -> bool | None:
        """True/False for an answer within tolerance; None when nothing was entered."""
        if answer is None or (isinstance(answer, float) and math.isnan(answer)):
            return None
        return abs(float(answer) - self.value()) <= self.tolerance


@dataclass(frozen=True)
class Exercise:
    key: str
    source: str
    question: str
    link: str                       # page path and query, e.g. "schedules?sc=Chapter+31"
    answer: str                     # reference answer (markdown)
    numeric: tuple[Numeric, ...] = field(default_factory=tuple)


@cache
def _chapter():
    from core.analysis.metrics import request_metrics
    from core.lessons.scenarios import DATA
    from core.trace import load_trace
    out = {}
    for name in ("serial", "continuous"):
        tr = load_trace(DATA / "traces" / f"chapter31_{name}.json")
        out[name] = (tr, dict(zip(request_metrics(tr)["id"], request_metrics(tr)["e2e_ms"])))
    return out


def _e2e(schedule: str, req: str) -> Callable[[], float]:
    return lambda: float(_chapter()[schedule][1][req])


def _window_tput(schedule: str) -> Callable[[], float]:
    def f():
        from core.analysis.metrics import throughput
        return throughput(_chapter()[schedule][0], (0.0, 500.0)).tok_per_s
    return f


EX3_P, EX3_Q = [0.3, 0.7], [0.6, 0.4]   # target p and draft q of the changed Example 31.3


def _spec(what: str, i: int | None = None) -> Callable[[], float]:
    def f():
        from core.formulas import speculative as s
        v = getattr(s, what)(EX3_P, EX3_Q)
        return float(v if i is None else v[i])
    return f


# ---- routing a fleet (core.lessons.fleet's runs) ---------------------------------------------------
RR_NTH = (10, 100)          # fleet-1: which replica serves the 10th and the 100th request (1-based)
XFER_TOKENS = 2048          # fleet-2: a prompt of this many tokens of ...
XFER_MODEL = "Llama-2-7B"   # ... this model, over the fleet's default link


def _rr_replica(nth: int) -> Callable[[], float]:
    def f():
        from core.lessons.fleet import run
        tr = run("shared", "round-robin")
        rid = tr.ids[nth - 1]          # the workload is in arrival order
        return float(next(e["replica"] for e in tr.events_of("route") if e["req"] == rid))
    return f


def xfer_bytes() -> int:
    from core.formulas.kv import MODELS
    return XFER_TOKENS * MODELS[XFER_MODEL].kv_bytes_per_token()


def _xfer_ms(together: int) -> Callable[[], float]:
    """How long one of `together` equal transfers started at once takes on the fleet's default link."""
    def f():
        from core.fleet.link import Link
        from core.fleet.sim import FleetSpec
        link = Link(FleetSpec.link_gbps, FleetSpec.link_latency_ms)
        for k in range(together):
            link.add(k, xfer_bytes(), 0.0)
        return max(end - start for _, start, end, _ in link.pop_done(math.inf))
    return f


def _skew_hits(replica: int) -> Callable[[], float]:
    def f():
        from core.lessons.fleet import hit_blocks, run
        return float(hit_blocks(run("shared", "prefix-aware", no_balance=True))[replica])
    return f


def _pd(what: str) -> Callable[[], float]:
    def f():
        from core.lessons.fleet import pd_run
        tr = pd_run()
        if what == "whole":
            return float(sum(e["stage"] == "whole" for e in tr.events_of("route")))
        return float(len(tr.events_of("transfer")))
    return f


def _drained(what: str) -> Callable[[], float]:
    def f():
        from core.lessons.fleet import DRAINED, drain_numbers, run
        d = drain_numbers(run("shared", "round-robin", drained=DRAINED), DRAINED)
        return float(d["finished"] if what == "served" else d["requests"] - d["finished in the fleet"])
    return f


def _tier(what: str, model: str | None = None) -> Callable[[], float]:
    def f():
        from core.lessons import kv_tiers as L
        if what == "break_even":
            return L.per_token(model or L.MODEL)["break_even_gbps"]
        c = L.compare()
        if what == "saved":
            return float(c["without"]["prefill_tokens"] - c["with"]["prefill_tokens"])
        return c["without"]["ttft_mean_ms"] - c["with"]["ttft_mean_ms"]
    return f


EXERCISES = [
    Exercise("ch31-1", "Chapter 31, exercise 1",
             "From the chapter's serial and continuous schedules (Table 31.1), how long does each of A and B take "
             "from arrival to its last token under each schedule? Who gains from continuous batching, and who "
             "loses?",
             "schedules?sc=Chapter+31",
             "Serial: A 180 ms, B 300 − 20 = 280 ms. Continuous: A 200 ms, B 200 − 20 = 180 ms. B's request "
             "completes 100 ms faster, A's 20 ms slower: one scheduling change helps one user and costs "
             "another.",
             (Numeric("A, serial (ms)", _e2e("serial", "A"), 0.5, "ms"),
              Numeric("B, serial (ms)", _e2e("serial", "B"), 0.5, "ms"),
              Numeric("A, continuous (ms)", _e2e("continuous", "A"), 0.5, "ms"),
              Numeric("B, continuous (ms)", _e2e("continuous", "B"), 0.5, "ms"))),
    Exercise("ch31-2", "Chapter 31, exercise 2",
             "Compute each schedule's output throughput over one fixed 500 ms window, and say why it is not the "
             "drain-window number.",
             "schedules?sc=Chapter+31&w0=0&w1=500",
             "Both schedules emit 6 tokens inside [0, 500] ms: 6 / 0.5 s = 12 tokens/s each. The fixed window "
             "counts the idle time after the last token; a drain window stops at each schedule's own last "
             "token. A throughput number means nothing without its window.",
             (Numeric("serial (tokens/s)", _window_tput("serial"), 0.01),
              Numeric("continuous (tokens/s)", _window_tput("continuous"), 0.01))),
    Exercise("ch31-3", "Chapter 31, exercise 3",
             "Redo Example 31.3 with target p = [0.3, 0.7] and draft q = [0.6, 0.4]: the acceptance probability "
             "of each draft token, the rejection mass and the residual distribution; check that the final "
             "masses equal p.",
             "speculative?sp_preset=exercise",
             "Acceptance min(1, p/q) = [0.5, 1]. Accepted masses 0.3 and 0.4, so 0.3 is rejected. The positive "
             "residual (p − q)+ normalised is [0, 1]: every rejected draw becomes the second token (Lyon in the "
             "chapter). Final masses: 0.3 and 0.4 + 0.3 = 0.7 — exactly p.",
             (Numeric("acceptance of token 1", _spec("acceptance", 0), 1e-9),
              Numeric("rejection mass", _spec("rejection_mass"), 1e-9),
              Numeric("final mass of token 2", _spec("final_distribution", 1), 1e-9))),
    Exercise("ch31-4", "Chapter 31, exercise 4",
             "Two prompts hold the same words in a different order. May a prefix cache treat the second as a hit? "
             "Even with identical token ids, what else has to match?",
             "kv?px_a=10,11,12,13&px_b=13,12,11,10",
             "No. A prefix hit needs the same tokens at the same positions from the start, not the same bag of "
             "words. The model and adapter, positional settings and everything else that shapes the computed "
             "keys and values must match too, and the tenant boundary must allow sharing (a cache salt)."),
    Exercise("ch31-5", "Chapter 31, exercise 5",
             "A framework cuts attention memory, yet decode steps are hardly faster. Name two plausible "
             "bottlenecks and one measurement that tells them apart.",
             "roofline",
             "Reading the weights (or other non-attention work) may dominate each step, or requests may spend "
             "their time queueing. Time kernels on the device and compare with request queue and emission "
             "timestamps on the same workload; smaller memory allocations alone do not locate the bottleneck."),
    Exercise("ch31-6", "Chapter 31, exercise 6",
             "A server completes more tokens by pushing every first token past the application's limit. Under a "
             "contract with a hard TTFT bound, is that an improvement?",
             "load",
             "No. A hard bound is a gate: extra throughput cannot pay for a violated bound. Report the gain and "
             "the violation, then find another schedule or change the contract explicitly before comparing "
             "again. The Load & SLOs page builds such a pair and marks the contract failed."),
    Exercise("recall-1", "Serving lesson, recall 1",
             "Why do prefill and decode tend to hit different bottlenecks?",
             "roofline?rf_batch=1&rf_prompt=2048",
             "Their arithmetic intensity differs (many tokens per weight read in prefill, one per sequence in "
             "decode). Place each on a roofline and check with profiles; neither is 'compute-bound' or "
             "'bandwidth-bound' by definition."),
    Exercise("recall-2", "Serving lesson, recall 2",
             "What does continuous batching change, and what does it not promise?",
             "schedules?sc=Burst+5&pol=static&pol=continuous&ms=3&s_kind=constant&s_step=1",
             "It refills free slots between iterations, which can raise utilisation; it does not promise any "
             "particular utilisation and queues can still form."),
    Exercise("recall-3", "Serving lesson, recall 3",
             "What is stored in the KV cache, when is it written, and what does its size depend on?",
             "kv",
             "Each layer's keys and values: written during prefill, appended one position per decode step, and "
             "read by later attention. Its size scales with the number of KV heads (not query heads) and with "
             "the tokens cached."),
    Exercise("recall-4", "Serving lesson, recall 4",
             "What does paging the KV cache buy, and what remains?",
             "kv",
             "A logical-to-physical block table cuts allocation waste and lets sequences share blocks; the last "
             "block of a sequence is still partly empty and the pool is still finite."),
    Exercise("recall-5", "Serving lesson, recall 5",
             "When does speculative decoding slow things down?",
             "speculative",
             "When drafting and verification cost more than the accepted tokens save — low acceptance, or a "
             "target already saturated — there is no universal threshold; compute the break-even for the case."),
    Exercise("recall-6", "Serving lesson, recall 6",
             "Will a GPU with more memory bandwidth (H100 over A100) speed up serving?",
             "roofline?rf_gpu=H100-SXM",
             "It can help a bandwidth-limited workload, but the product variant, cache traffic, compute, "
             "precision and kernel support decide what is actually measured."),
    Exercise("recall-7", "Serving lesson, recall 7",
             "After quantising, aggregate benchmarks hold steady but code generation regresses. What now?",
             "",
             "An aggregate score is not enough: rerun the product's own slices, study the errors, and roll back "
             "or keep separate configurations where the evidence says so."),
    Exercise("recall-8", "Serving lesson, recall 8",
             "When does prefix reuse save prefill, and what limits the gain?",
             "schedules?sc=Shared+prefix",
             "Identical token prefixes under an identical execution identity skip their repeated prefill. "
             "Isolation between tenants, whether the cache is warm, and the prefix's length bound the gain."),
    Exercise("recall-9", "Serving lesson, recall 9",
             "What causes head-of-line delays, and which controls help?",
             "pathologies",
             "Long prefills, or long generations holding cache, delay everyone behind them. Scheduling and "
             "admission limits, chunked prefill, cancellation and workload isolation help."),
    Exercise("recall-10", "Serving lesson, recall 10 (stretch)",
             "With 2 TB/s of memory bandwidth and 14 GB of weights read every decode step, about how many steps "
             "per second are possible at most? What changes with batching?",
             "roofline",
             "2 × 10¹² / 14 × 10⁹ ≈ 143 steps/s, before any other cost. Batching shares one weight read among "
             "sequences but adds compute and KV traffic, until another limit is reached.",
             (Numeric("steps per second", lambda: 2e12 / 14e9, 1.0, "steps/s"),)),
    Exercise("fleet-1", "Routing a fleet, 1",
             f"Four replicas behind a round-robin router serve shared_prefix_200. Which replica (0-3) serves the "
             f"{RR_NTH[0]}th request to arrive? The {RR_NTH[1]}th?",
             "fleet?fl_n=4&fl_pol=round-robin&fl_load=1",
             "Round-robin gives the i-th request (counting from 0) to replica i mod N, whatever the loads or the "
             "caches: the 10th request is i = 9, 9 mod 4 = 1; the 100th is i = 99, 99 mod 4 = 3. The simulated "
             "run's route events say the same.",
             tuple(Numeric(f"replica of request {n}", _rr_replica(n), 0.5) for n in RR_NTH)),
    Exercise("fleet-2", "Routing a fleet, 2",
             f"With disaggregated serving, a prefill replica sends a {XFER_TOKENS:,}-token prompt's KV cache of "
             f"{XFER_MODEL} (512 KiB a token) to a decode replica over a 25 GB/s link with 0.05 ms latency. How long "
             "does the transfer take alone? How long does each of two such transfers take when they start together "
             "and share the link fairly?",
             "fleet?fl_dis=true&fl_p=1&fl_d=1&fl_gbps=25&fl_lat=0.05",
             "Alone: latency + bytes / bandwidth = 0.05 ms + 2,048 x 524,288 bytes / 25 x 10^9 bytes/s = 0.05 + "
             "42.95 ms = 43.0 ms. Together each gets half the bandwidth until both end: 0.05 + 2 x 42.95 = 85.95 ms. "
             "GB/s here is 10^9 bytes per second; 1 GiB is 2^30 bytes.",
             (Numeric("alone (ms)", _xfer_ms(1), 0.05, "ms"), Numeric("each of two (ms)", _xfer_ms(2), 0.05, "ms"))),
    Exercise("fleet-3", "Routing a fleet, 3",
             "Route shared_prefix_200 (two tenants, each with its own system prompt) over four replicas with prefix "
             "caching, using prefix-aware routing with its load check off (balance_abs very large). How many "
             "prompt blocks (16 tokens each) does replica 0 find in its prefix cache over the whole run?",
             "fleet?fl_n=4&fl_pol=prefix-aware&fl_bal=false&fl_load=1&fl_kb=2000",
             "The first request goes to replica 0 (all caches empty) and every later request of its tenant follows "
             "it there. Each of them finds the tenant's system prompt cached: its full 16-token blocks, the tokens "
             "every prompt of the tenant starts with, divided by 16 and rounded down. So: (requests of that tenant "
             "- 1) x (shared prefix tokens // 16). The routing lesson's second scenario shows the run.",
             (Numeric("prefix-hit blocks on replica 0", _skew_hits(0), 0.5, "blocks"),)),
    Exercise("fleet-4", "Routing a fleet, 4",
             "Serve shared_prefix_200 on one prefill and three decode replicas (P:D = 1:3) with pd_min_prompt = "
             "300: prompts shorter than 300 tokens run whole on a decode replica, the others are prefilled on the "
             "prefill replica and their KV cache moved. How many requests run whole on a decode replica, and how "
             "many KV transfers cross the link?",
             "fleet?fl_dis=true&fl_p=1&fl_d=3&fl_min=300&fl_load=1",
             "Count the prompts under 300 tokens in the workload: those run whole. Every other request is "
             "prefilled, then moved: one transfer each (none is rejected here).",
             (Numeric("run whole on a decode replica", _pd("whole"), 0.5, "requests"),
              Numeric("KV transfers", _pd("transfers"), 0.5, "transfers"))),
    Exercise("fleet-5", "Routing a fleet, 5",
             "Four replicas, round-robin, shared_prefix_200: replica 3 is drained (taken out of rotation) when the "
             "101st request arrives. How many requests does replica 3 serve in all? How many requests does the "
             "fleet lose?",
             "fleet?fl_n=4&fl_pol=round-robin&fl_load=1&fl_drain=true&fl_dr=3&fl_dt=4674.3",
             "Before the drain, round-robin gave replica 3 every request i with i mod 4 = 3 among i = 0..99: 25. "
             "From the drain on it receives nothing, but it finishes what it holds, so nothing is lost: 0. A "
             "replica stopped without draining would have cut off the requests it still held.",
             (Numeric("served by replica 3", _drained("served"), 0.5, "requests"),
              Numeric("lost", _drained("lost"), 0.5, "requests"))),
    Exercise("kvtier-1", "KV tiers, 1",
             "A CPU hit replaces the prefill of the tokens it loads by a copy of their KV over the host link. At the "
             "compute roof a token's prefill costs 2 x parameters FLOPs. On an H100-SXM (989 TFLOP/s in bf16), "
             "below which host-link bandwidth (GB/s) does loading a token's KV take longer than computing it again, "
             "for Llama-3-8B (8.03 B parameters, 131,072 KV bytes a token) and for Llama-2-7B (6.74 B, 524,288)?",
             "kv?kt_model=Llama-2-7B&kt_gbps=25",
             "Break-even: KV bytes per token / bandwidth = 2 x parameters / FLOP/s, so bandwidth = KV bytes per token "
             "x FLOP/s / (2 x parameters). Llama-3-8B: 131,072 x 989e12 / (2 x 8.03e9) = 8.1 GB/s; Llama-2-7B: "
             "524,288 x 989e12 / (2 x 6.74e9) = 38.5 GB/s. Grouped-query attention (8 KV heads instead of 32) makes "
             "Llama-3-8B's KV four times smaller per token: a PCIe link pays for it, while Llama-2-7B's needs a link "
             "faster than PCIe 4.0. (Presets: core.formulas.kv; GB/s is 10^9 bytes per second.)",
             (Numeric("Llama-3-8B (GB/s)", _tier("break_even", "Llama-3-8B"), 0.2, "GB/s"),
              Numeric("Llama-2-7B (GB/s)", _tier("break_even", "Llama-2-7B"), 0.5, "GB/s"))),
    Exercise("kvtier-2", "KV tiers, 2",
             "On the KV page's lesson run (Llama-3-8B on an H100, 96 requests over 12 long prefixes, a GPU pool of "
             "400 blocks, a CPU tier of 4,000, 25 GB/s), how many prompt tokens does the CPU tier take off the "
             "prefills, and by how many ms does it lower the mean TTFT?",
             "kv?kt_model=Llama-3-8B&kt_gbps=25&kt_cpu=4000&kt_pool=400",
             "Read them off the page: prefill tokens computed without the tier minus with it (the GPU hits are "
             "the same in both runs: the tier only adds the prefixes the GPU pool had let go), and the two mean "
             "TTFTs. The saving is the prefill those tokens no longer need, less the loads' copies and the step "
             "each loading request waits.",
             (Numeric("prefill tokens saved", _tier("saved"), 0.5, "tokens"),
              Numeric("mean TTFT lower by (ms)", _tier("ttft"), 0.05, "ms"))),
]

# The Exercises page's groups: (heading, key prefix)
GROUPS = (("Chapter 31", "ch31"), ("Serving lesson: recall and stretch", "recall"), ("Routing a fleet", "fleet"),
          ("KV tiers", "kvtier"))
