"""Helpers the tests share (one module; test modules import from here, never from each other):
AppTest pages and their charts, a real Streamlit server and headless Chromium (Playwright),
and small traces and schedules the checks are written against."""
import base64
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from bench.helpers import minimal, open_page, peak_mib  # noqa: F401  (shared with bench/)
from tests.conftest import DATA, ROOT

# ---- AppTest -------------------------------------------------------------------------------------

def charts(at):
    """Plotly figures on the page as dicts (st.plotly_chart appears as an unknown element)."""
    return [json.loads(el.proto.spec) for el in at.get("plotly_chart")]


def arr(v):
    """Plotly 7 may store arrays as base64 'bdata'."""
    if isinstance(v, dict) and "bdata" in v:
        return np.frombuffer(base64.b64decode(v["bdata"]), dtype=np.dtype(v["dtype"])).tolist()
    return v


def run_app(timeout_s: int = 60):
    """The home page through app.py."""
    from streamlit.testing.v1 import AppTest
    return AppTest.from_file(str(ROOT / "app.py"), default_timeout=timeout_s).run()


# ---- a real server and browser -------------------------------------------------------------------

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
SHOTS = ROOT / "artifacts" / "screenshots"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage"]


def require_browser():
    if not shutil.which(CHROMIUM) and not os.path.exists(CHROMIUM):
        if os.environ.get("CI"):
            pytest.fail(f"CI needs Chromium at {CHROMIUM} (apt-get install -y chromium)")
        pytest.skip(f"no Chromium at {CHROMIUM}")
    pytest.importorskip("playwright")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def streamlit_server(env_extra: dict | None = None):
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env_extra or {})}
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", str(ROOT / "app.py"), "--server.headless", "true",
         "--server.port", str(port), "--server.address", "127.0.0.1", "--browser.gatherUsageStats", "false",
         "--server.fileWatcherType", "none"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 60
        while True:
            try:
                if urllib.request.urlopen(f"{url}/_stcore/health", timeout=2).read() == b"ok":
                    break
            except OSError:
                pass
            if proc.poll() is not None or time.time() > deadline:
                out = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
                raise RuntimeError(f"streamlit did not become healthy:\n{out[-3000:]}")
            time.sleep(0.3)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


@contextmanager
def launched_browser():
    """The system Chromium under Playwright (tests share one: conftest's `browser`; a second sync
    Playwright inside a first one fails)."""
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@contextmanager
def browser_page():
    with launched_browser() as browser:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.set_default_timeout(60_000)
        yield page


def wait_idle(page):
    page.wait_for_selector("[data-testid='stApp'][data-test-script-state='notRunning']", timeout=60_000)


# ---- traces and schedules ------------------------------------------------------------------------

def sim_trace(**cfg):
    """30 requests of the shared-prefix workload, simulated with prefix caching (options: cfg)."""
    from core.config import SchedulerConfig
    from core.sim.simulate import simulate
    from core.sim.stepmodel import StepModel
    from core.workload import load_workload
    w = load_workload(DATA / "workloads" / "shared_prefix_200.json")
    w.requests = w.requests[:30]
    return simulate(w, SchedulerConfig(**{"max_seqs": 8, "token_budget": 512, "chunk": 256, "kv_blocks": 160,
                                          "prefix_caching": True, **cfg}),
                    StepModel("affine", base_ms=3, prefill_ms_per_token=0.02, decode_ms_per_seq=0.1))


def growing(path, n):
    """Write the chapter's continuous trace cut to its first n requests (as a server would,
    atomically, while it grows)."""
    doc = json.loads((DATA / "traces" / "chapter31_continuous.json").read_text())
    keep = {r["id"] for r in doc["requests"][:n]}
    doc["requests"] = doc["requests"][:n]
    doc["events"] = [e for e in doc["events"] if e.get("req") in keep]
    tmp = path.with_name(".tmp-" + path.name)
    tmp.write_text(json.dumps(doc))
    tmp.replace(path)


def emissions(tr):
    out = {rid: [] for rid in tr.ids}
    tk = tr.tokens.sort_values(["req", "index"])
    for r, t in zip(tk["req"], tk["t_ms"]):
        out[tr.ids[r]].append(float(t))
    return out


def unwritable_dir(tmp_path, empty: bool = False):
    """A folder in which nothing can be created: mode 0555, or (root ignores modes) a sysfs folder;
    `empty`: an existing empty one. Skips where no folder refuses root (none found on this project's
    machines: CI runs the tests that use it)."""
    import pytest
    if os.geteuid() != 0:
        d = tmp_path / "ro"
        d.mkdir()
        d.chmod(0o555)
        return d
    if empty:
        roots = (Path("/sys/class"), Path("/sys/kernel"))
        candidates = [d for r in roots if r.is_dir() for d in sorted(r.iterdir())]
    else:
        candidates = [Path("/sys/kernel"), Path("/proc/sys")]
    for d in candidates:
        try:
            if empty and (not d.is_dir() or d.is_symlink() or any(d.iterdir())):
                continue
            (d / "probe-serving-explorer").mkdir()
        except OSError:
            return d
        (d / "probe-serving-explorer").rmdir()
    pytest.skip("no" + (" empty" if empty else "") + " folder here refuses root")


# ---- the command line refusing an input ----------------------------------------------------------

def metrics_refused(capsys, path, *names, argv=()):
    """`python -m core metrics PATH ARGV` ends with exit 2 and one line naming each of `names`."""
    from core.__main__ import main
    rc = main(["metrics", str(path), *argv])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    for n in names:
        assert n in err, err
    return err


def merge_refused(capsys, tmp_path, files, *words, out_name="refused.json"):
    """`python -m core merge FILES --out OUT` ends with exit 2, one line naming each of `words`, no OUT."""
    from core.__main__ import main
    out = tmp_path / out_name
    rc = main(["merge", *map(str, files), "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.startswith("error: merge: ") and err.count("\n") == 1 and "Traceback" not in err, err
    for w in words:
        assert w in err, err
    assert not out.exists()
    return err


# ---- the runner's server in this process ------------------------------------------------------

class Running:
    """A server in this process: uvicorn in a thread, the engine in its own."""

    def __init__(self, model, max_waiting=256, draft=None, engine_process=False, trace_out=None, tok=None,
                 **sched):
        """engine_process: the engine in its own process, as `serve` runs it by default (the
        bundled tiny model, loaded there from the same flags; scheduler options default)."""
        import uvicorn

        from core.config import SchedulerConfig
        from gpu_runner.client import InProcessClient
        from gpu_runner.engine import Engine
        from gpu_runner.options import EngineConfig
        from gpu_runner.server import App
        from gpu_runner.server_metrics import ServerMetrics
        from gpu_runner.tokenizer import ByteTokenizer
        self.metrics = ServerMetrics("tiny")
        if engine_process:
            from gpu_runner.__main__ import build_parser, serve_options
            from gpu_runner.engine_process import ProcessClient
            assert draft is None and not sched
            args = build_parser().parse_args(["serve", "--model", "tiny", "--threads", "1", "--kv-blocks", "256"])
            self.se = ProcessClient(serve_options(args), metrics=self.metrics, max_waiting=max_waiting)
        else:
            cfg = EngineConfig(scheduler=SchedulerConfig(**{"kv_blocks": 256, **sched}), gamma=3)
            self.engine = Engine(model, tok or ByteTokenizer(), cfg, "cpu", "tiny", draft=draft,
                                 draft_name="tiny-draft")
            self.se = InProcessClient(self.engine, metrics=self.metrics, max_waiting=max_waiting, trace_out=trace_out)
        app = App(self.se, "tiny", self.metrics)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app.app, host="127.0.0.1", port=self.port, log_level="error",
                                                    lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self):
        self.se.start()
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.05)
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(15)
        self.se.stop()

    def metric(self, name, **labels):
        import httpx
        from prometheus_client.parser import text_string_to_metric_families
        text = httpx.get(f"{self.url}/metrics", timeout=10).text
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                    return s.value
        raise KeyError(name)


def reference(model, prompts, max_tokens):
    """Greedy outputs of the batch runner (Engine.run) for the same prompts."""
    from core.workload import Request, Workload
    from gpu_runner.engine import Engine
    from gpu_runner.options import EngineConfig
    from gpu_runner.tokenizer import ByteTokenizer
    tok = ByteTokenizer()
    wl = Workload([Request(f"p{i}", 0.0, len(tok.encode(p)), max_tokens, tuple(tok.encode(p)))
                   for i, p in enumerate(prompts)])
    _, out = Engine(model, tok, EngineConfig()).run(wl)
    return [out[f"p{i}"] for i in range(len(prompts))]




# ---- a real fleet in its own process ----------------------------------------------------------

BOUND_S = 120      # a bound on any one wait (a loaded CI machine), never an expected duration


def start_fleet(tmp_path, *flags, kv_blocks=256):
    """`python -m gpu_runner fleet` on a free loopback port with a trace (healthy, or AssertionError with
    its output): (process, url, trace path)."""
    from deploy.serve import wait_healthy
    port = free_port()
    out = tmp_path / "fleet.json"
    proc = subprocess.Popen([sys.executable, "-m", "gpu_runner", "fleet", "--port", str(port), "--trace-out", str(out),
                             "--kv-blocks", str(kv_blocks), "--threads", "1", *flags], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, BOUND_S, [proc], path="/health")
    except Exception:
        proc.kill()
        raise AssertionError(proc.communicate(timeout=30)[0]) from None
    return proc, url, out


def stop_process(proc, signal_it=True):
    """SIGTERM (unless `signal_it` is False), then its output, killed past BOUND_S."""
    if signal_it and proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.communicate(timeout=BOUND_S)[0]
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.communicate(timeout=30)[0]
    except ValueError:       # (its output already read)
        return ""


class StreamedCompletion:
    """A streamed completion (ignore_eos, greedy) read in a thread: its chunks and lines, and whether it
    ended; a refusal before the stream began (a JSON error body) is its one chunk."""

    def __init__(self, url, prompt, max_tokens):
        self.chunks, self.lines, self.done = [], [], threading.Event()
        self.cut = None        # the body broke off before its end (a fleet's dead replica): the error
        self.t = threading.Thread(target=self._run, args=(url, prompt, max_tokens), daemon=True)
        self.t.start()

    def _run(self, url, prompt, max_tokens):
        import httpx
        try:
            with httpx.stream("POST", f"{url}/v1/completions", timeout=BOUND_S,
                              json={"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
                                    "ignore_eos": True}) as r:
                for line in r.iter_lines():
                    if line:
                        self.lines.append(line)
                    if line.startswith("data: ") and line != "data: [DONE]":
                        self.chunks.append(json.loads(line[6:]))
                    elif line.startswith("{"):
                        self.chunks.append(json.loads(line))
        except httpx.TransportError as e:      # (RemoteProtocolError: the body ended unfinished)
            self.cut = e
        finally:
            self.done.set()

    def wait_tokens(self, n):
        """Until n chunks with text arrived (AssertionError if it ends first, or past BOUND_S)."""
        end = time.monotonic() + BOUND_S
        while sum(1 for c in self.chunks if c.get("choices") and c["choices"][0].get("text")) < n:
            assert not self.done.is_set(), self.lines
            assert time.monotonic() < end
            time.sleep(0.02)

    def end(self) -> str:
        """How it ended: its finish reason, or its error's message."""
        last = self.chunks[-1] if self.chunks else {}
        if isinstance(last.get("error"), dict):
            return last["error"]["message"]
        return next((c["choices"][0]["finish_reason"] for c in reversed(self.chunks)
                     if c.get("choices") and c["choices"][0]["finish_reason"]), "none")


def fleet_e2e_error_median(tr) -> float:
    """The fleet simulator's prediction of a measured fleet trace (core.fit.fleet.predict_fleet),
    held against it here: the median over requests of |simulated - measured| / measured E2E."""
    import numpy as np

    from core.analysis.metrics import request_metrics
    from core.fit.fleet import predict_fleet
    sim, _, _ = predict_fleet(tr)
    m, s = request_metrics(tr), request_metrics(sim)
    s_e2e = dict(zip(s["id"], s["e2e_ms"]))
    return float(np.median([abs(s_e2e[r] - e) / e for r, e in zip(m["id"], m["e2e_ms"])]))


def scattered_cache(lens, starts, H, Hkv, hd, bs, seed=0, dtype=None):
    """A paged KV cache with each sequence's blocks scattered, its chunks (start: positions cached
    before the step) and each chunk's contiguous causal attention: (q, k cache, v cache, chunks,
    reference, full q per sequence, full k per sequence)."""
    import torch

    from gpu_runner.kernels.reference import Chunk, contiguous_causal_attention
    dtype = torch.float32 if dtype is None else dtype
    g = torch.Generator().manual_seed(seed)
    nb = sum(-(-L // bs) for L in lens) + 3
    kc = torch.zeros(nb, bs, Hkv, hd, dtype=dtype)
    vc = torch.zeros_like(kc)
    perm = torch.randperm(nb, generator=g).tolist()
    chunks, qs, refs, full_q, full_k, row, used = [], [], [], [], [], 0, 0
    for L, start in zip(lens, starts):
        k = torch.randn(L, Hkv, hd, generator=g, dtype=dtype)
        v = torch.randn(L, Hkv, hd, generator=g, dtype=dtype)
        q = torch.randn(L, H, hd, generator=g, dtype=dtype)
        table = perm[used:used + -(-L // bs)]
        used += len(table)
        slots = torch.tensor([table[p // bs] * bs + p % bs for p in range(L)])
        kc.view(-1, Hkv, hd)[slots] = k
        vc.view(-1, Hkv, hd)[slots] = v
        chunks.append(Chunk(row, L - start, start, slots))
        qs.append(q[start:])
        refs.append(contiguous_causal_attention(q, k, v)[start:])
        full_q.append(q)
        full_k.append(k)
        row += L - start
    return torch.cat(qs), kc, vc, chunks, torch.cat(refs), full_q, full_k
