"""`/metrics` of `gpu_runner serve`: Prometheus text format (prometheus_client), under vLLM's
metric names for what the two engines share, so dashboards and scrapers built for vLLM
read ours. Each name means what it means in vLLM (v1 engine, docs "Production Metrics"):

    vllm:num_requests_running          gauge    requests in the running batch
    vllm:num_requests_waiting          gauge    requests queued (accepted, not yet running)
    vllm:kv_cache_usage_perc           gauge    KV blocks in use / pool (0..1)
    vllm:num_preemptions_total         counter  preemptions (recompute)
    vllm:prompt_tokens_total           counter  prompt tokens of scheduled requests
    vllm:generation_tokens_total       counter  generated tokens delivered
    vllm:prefix_cache_queries_total    counter  prompt tokens looked up in the prefix cache
    vllm:prefix_cache_hits_total       counter  of those, tokens found cached
    vllm:request_success_total         counter  finished requests, label finished_reason
    vllm:time_to_first_token_seconds   histogram  arrival -> first token
    vllm:inter_token_latency_seconds   histogram  gaps between consecutive tokens of a request
    vllm:e2e_request_latency_seconds   histogram  arrival -> last token
    vllm:request_queue_time_seconds    histogram  arrival -> first scheduled

With a CPU tier under the prefix cache (`--cpu-kv-blocks`), vLLM's offloading metrics (vllm/distributed/
kv_transfer/kv_connector/v1/offloading/metrics.py, vllm/v1/kv_offload/cpu/common.py; docs/kv-tiers.md):

    vllm:kv_offload_store_bytes_total / _load_bytes_total   counters  bytes copied GPU -> CPU / CPU -> GPU
    vllm:kv_offload_store_time_total / _load_time_total     counters  seconds those copies took
    vllm:kv_offload_cpu_cache_usage_perc                    gauge     CPU chunks being written or read / capacity
    vllm:external_prefix_cache_queries_total / _hits_total  counters  prompt tokens looked up in the tier (past
                                                                      the GPU hit) / found there, tokens

Every series carries `model_name`. A request's tokens delivered by one step (speculative
decoding) count as one gap of that step's length and zero-length gaps for the rest, as the
client sees them.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest

disable_created_metrics()   # no *_created series (vLLM exposes none either)

# vLLM's bucket edges (seconds)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)
LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                   240.0, 480.0, 960.0, 1920.0, 7680.0)
FINISH_REASONS = {"length": "length", "stop": "stop", "abort": "abort"}
TIER_COUNTERS = (("kv_offload_store_bytes", "Bytes stored to the CPU offloading tier"),
                 ("kv_offload_load_bytes", "Bytes loaded from the CPU offloading tier"),
                 ("kv_offload_store_time", "Seconds spent storing to the CPU offloading tier"),
                 ("kv_offload_load_time", "Seconds spent loading from the CPU offloading tier"),
                 ("external_prefix_cache_queries", "External (CPU tier) prefix-cache queries, in tokens"),
                 ("external_prefix_cache_hits", "External (CPU tier) prefix-cache hits, in tokens"))


class ServerMetrics:
    """`replicas` (a fleet's front end): every series also carries a `replica` label; `of(k)` is
    replica k's view, which the replica's client updates (the fleet's totals: sum over replica)."""

    def __init__(self, model_name: str, replicas: int | None = None, registry=None):
        self.registry = r = CollectorRegistry() if registry is None else registry
        self.model = model_name
        self.lv = {"model_name": model_name}        # this view's label values
        lab = ["model_name"] + (["replica"] if replicas is not None else [])
        self.running = Gauge("vllm:num_requests_running", "Requests in the running batch", lab, registry=r)
        self.waiting = Gauge("vllm:num_requests_waiting", "Requests waiting to run", lab, registry=r)
        self.kv = Gauge("vllm:kv_cache_usage_perc", "KV-cache usage: 1 means 100 percent", lab, registry=r)
        self.preempt = Counter("vllm:num_preemptions", "Cumulative preemptions", lab, registry=r)
        self.prompt = Counter("vllm:prompt_tokens", "Prompt tokens processed", lab, registry=r)
        self.gen = Counter("vllm:generation_tokens", "Generation tokens produced", lab, registry=r)
        self.pc_q = Counter("vllm:prefix_cache_queries", "Prefix-cache queries, in tokens", lab, registry=r)
        self.pc_h = Counter("vllm:prefix_cache_hits", "Prefix-cache hits, in tokens", lab, registry=r)
        self.success = Counter("vllm:request_success", "Finished requests", lab + ["finished_reason"], registry=r)
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Time to first token", lab,
                              buckets=TTFT_BUCKETS, registry=r)
        self.itl = Histogram("vllm:inter_token_latency_seconds", "Inter-token latency", lab,
                             buckets=ITL_BUCKETS, registry=r)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "End-to-end request latency", lab,
                             buckets=LATENCY_BUCKETS, registry=r)
        self.queue = Histogram("vllm:request_queue_time_seconds", "Time waiting before first scheduled", lab,
                               buckets=LATENCY_BUCKETS, registry=r)
        self.tier_counters = [Counter(f"vllm:{n}", h, lab, registry=r) for n, h in TIER_COUNTERS]
        self.tier_usage = Gauge("vllm:kv_offload_cpu_cache_usage_perc", "CPU offloading cache usage (chunks being "
                                "stored or loaded over the capacity)", lab, registry=r)
        self._preemptions = 0
        self._tier = (0,) * len(TIER_COUNTERS)
        if replicas is None:
            self._zero()

    def _zero(self):
        for m in (self.running, self.waiting, self.kv, self.preempt, self.prompt, self.gen, self.pc_q, self.pc_h,
                  self.ttft, self.itl, self.e2e, self.queue):
            m.labels(**self.lv)          # every series exists from the start, at 0
        for reason in FINISH_REASONS.values():
            self.success.labels(**self.lv, finished_reason=reason)

    def of(self, replica: int) -> ServerMetrics:
        """Replica `replica`'s view: the same series, labelled replica="k"."""
        import copy
        view = copy.copy(self)
        view.relabel({"model_name": self.model, "replica": str(replica)})
        return view

    def relabel(self, lv: dict):
        """This view's label values (its series start at 0)."""
        self.lv = lv
        self._preemptions = 0
        self._tier = (0,) * len(TIER_COUNTERS)
        self._zero()

    def gone(self):
        """This view's engine is gone (a dead replica): its gauges leave the exposition until it steps
        again; its counters stay (what it did)."""
        for g in (self.running, self.waiting, self.kv):
            try:
                g.remove(*self.lv.values())
            except KeyError:
                pass

    def step(self, running: int, waiting: int, kv_usage: float, preemptions: int, hit_tokens: int,
             tier: tuple | None = None):
        lv = self.lv
        if tier is not None:   # (the CPU tier's totals so far: the counters move by what they added)
            store_b, load_b, store_s, load_s, usage, queried, hit = tier
            now = (store_b, load_b, store_s, load_s, queried, hit)
            for c, new, old in zip(self.tier_counters, now, self._tier):
                if new > old:
                    c.labels(**lv).inc(new - old)
            self._tier = now
            self.tier_usage.labels(**lv).set(usage)
        self.running.labels(**lv).set(running)
        self.waiting.labels(**lv).set(waiting)
        self.kv.labels(**lv).set(kv_usage)
        if preemptions > self._preemptions:
            self.preempt.labels(**lv).inc(preemptions - self._preemptions)
            self._preemptions = preemptions
        if hit_tokens:
            self.pc_h.labels(**lv).inc(hit_tokens)

    def scheduled(self, s, prompt_tokens: int):
        lv = self.lv
        self.prompt.labels(**lv).inc(prompt_tokens)
        self.pc_q.labels(**lv).inc(prompt_tokens)
        self.queue.labels(**lv).observe(max(0.0, (s.scheduled_ms - s.arrival_ms) / 1000))

    def tokens(self, s, n: int, t_ms: float):
        lv = self.lv
        self.gen.labels(**lv).inc(n)
        if s.first_token_ms is None:
            self.ttft.labels(**lv).observe(max(0.0, (t_ms - s.arrival_ms) / 1000))
            n -= 1
        else:
            self.itl.labels(**lv).observe(max(0.0, (t_ms - s.last_token_ms) / 1000))
            n -= 1
        for _ in range(n):   # tokens of the same step reach the client together
            self.itl.labels(**lv).observe(0.0)

    def finished(self, s, reason: str, t_ms: float):
        lv = self.lv
        self.success.labels(**lv, finished_reason=FINISH_REASONS.get(reason, reason)).inc()
        if s.last_token_ms is not None:
            self.e2e.labels(**lv).observe(max(0.0, (s.last_token_ms - s.arrival_ms) / 1000))

    def idle(self, running: int, waiting: int, kv_usage: float):
        lv = self.lv
        self.running.labels(**lv).set(running)
        self.waiting.labels(**lv).set(waiting)
        self.kv.labels(**lv).set(kv_usage)

    def render(self) -> bytes:
        return generate_latest(self.registry)
