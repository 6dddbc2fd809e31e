"""`gpu_runner observe` records what a server emits: the real vLLM captures in
data/imports/vllm_telemetry are replayed to it as vLLM sent them (the ZMQ frames through a PUB
socket, the OTLP protobuf bodies as HTTP POSTs, /metrics pages from a local server), and what it
wrote must hold exactly what was sent. Every process and socket is started here, on loopback,
and every wait is bounded."""
import base64
import json
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
import zmq

from core.analysis.metrics import request_metrics, summarize
from core.trace import load_trace, open_trace
from tests.conftest import ROOT
from tests.helpers import free_port

pytestmark = pytest.mark.slow     # subprocesses and real sockets, a few seconds each
RUN = ROOT / "data" / "imports" / "vllm_telemetry" / "run2_poisson4_p192_o48"


def kv_frames() -> list[list[bytes]]:
    """The bundled run's KV-event messages as vLLM's publisher sent them (ZMQ frames)."""
    return [[base64.b64decode(f) for f in json.loads(ln)["frames"]]
            for ln in (RUN / "kv_events.jsonl").read_text().splitlines()]


def stop_when(proc, done, timeout_s: float = 20.0):
    """SIGTERM once `done()` holds (or after timeout_s: the caller's asserts then say what is missing);
    (stdout, stderr)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not done():
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    return proc.communicate(timeout=30)


def observe(*flags):
    return subprocess.Popen([sys.executable, "-m", "gpu_runner", "observe", *flags], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_http(url: str, timeout_s: float = 30.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{url} did not answer in {timeout_s} s")


class MetricsPages(BaseHTTPRequestHandler):
    pages: list = []
    served = 0

    def log_message(self, *a):
        pass

    def do_GET(self):
        cls = type(self)
        body = cls.pages[min(cls.served, len(cls.pages) - 1)].encode()
        cls.served += 1
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def test_observe_records_vllms_kv_events_spans_and_metrics_exactly(tmp_path):
    frames = kv_frames()
    bodies = [json.loads(ln) for ln in (RUN / "otlp_bodies.jsonl").read_text().splitlines()]
    MetricsPages.pages = [json.loads(ln)["text"] for ln in (RUN / "metrics_scrapes.jsonl").read_text().splitlines()]
    metrics = ThreadingHTTPServer(("127.0.0.1", 0), MetricsPages)
    threading.Thread(target=metrics.serve_forever, daemon=True).start()
    ctx = zmq.Context()
    pub = ctx.socket(zmq.XPUB)            # XPUB: we see the observer's subscription before publishing
    kv_port = pub.bind_to_random_port("tcp://127.0.0.1")
    otlp_port, out = free_port(), tmp_path / "observed.json.gz"
    proc = observe("--kv-events", f"tcp://127.0.0.1:{kv_port}", "--otlp-port", str(otlp_port),
                   "--metrics", f"http://127.0.0.1:{metrics.server_port}/metrics", "--metrics-interval", "0.05",
                   "--out", str(out), "--flush-interval", "0.5")
    try:
        assert pub.poll(30_000), "the observer never subscribed"
        assert pub.recv()[:1] == b"\x01"      # a subscription
        for f in frames:
            pub.send_multipart(f)
        wait_http(f"http://127.0.0.1:{otlp_port}/health")
        for b in bodies:
            r = httpx.post(f"http://127.0.0.1:{otlp_port}/v1/traces", content=base64.b64decode(b["body_b64"]),
                           headers={"Content-Type": b["content_type"]}, timeout=10)
            assert r.status_code == 200, r.text
        bad = httpx.post(f"http://127.0.0.1:{otlp_port}/v1/traces", content=b"\xff\x00 not protobuf",
                         headers={"Content-Type": "application/x-protobuf"}, timeout=10)
        assert bad.status_code == 400 and "not an OTLP trace export" in bad.json()["error"]
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not (out.exists() and len(load_trace(out).kv_events) and
                                                   len(load_trace(out).requests) == 48):
            time.sleep(0.3)                   # rewritten while it runs: a complete trace at every moment
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        pub.close(0)
        ctx.term()
        metrics.shutdown()
    assert proc.returncode == 0, stderr
    tr = load_trace(out)
    # the KV events: what the file import of the same frames gives, row for row
    ref = open_trace(RUN / "kv_events.jsonl").trace
    assert tr.kv_events["hash"].tolist() == ref.kv_events["hash"].tolist()
    assert summarize(tr)["summary"]["kv_events"] == {"stored_blocks": 177, "removed_blocks": 115, "cleared": 1,
                                                     "peak_cached_blocks": summarize(ref)["summary"]["kv_events"][
                                                         "peak_cached_blocks"]}
    # the spans: vLLM's own TTFT and E2E per request
    spans = request_metrics(open_trace(RUN / "spans.otlp.jsonl").trace).set_index("id")
    mine = request_metrics(tr).set_index("id")
    assert sorted(mine.index) == sorted(spans.index) and len(mine) == 48
    assert (abs(mine.loc[spans.index, "ttft_ms"] - spans["ttft_ms"]) < 1e-6).all()
    assert (abs(mine.loc[spans.index, "e2e_ms"] - spans["e2e_ms"]) < 1e-6).all()
    gauges = tr.events_of("gauge")
    assert gauges and all("kv_usage" in g for g in gauges)
    assert tr.meta["clock"]["kind"] == "epoch" and "148 OTLP" not in stdout
    assert "request spans" in stdout and "KV event rows" in stdout


def test_observe_with_endpoints_that_never_answer_writes_an_empty_trace_and_says_so(tmp_path):
    out = tmp_path / "nothing.json"
    proc = observe("--kv-events", f"tcp://127.0.0.1:{free_port()}", "--metrics",
                   f"http://127.0.0.1:{free_port()}/metrics", "--out", str(out), "--duration", "1.5")
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr
    assert "nothing was received" in stdout and "nothing received" in stdout
    tr = load_trace(out)
    assert not len(tr.requests) and not len(tr.kv_events) and not tr.other


def test_observe_refuses_bad_flags_in_one_line(tmp_path):
    for flags, msg in ((["--out", str(tmp_path / "x.json")], "give at least one of"),
                       (["--kv-events", "localhost:5557", "--out", str(tmp_path / "x.json")], "a ZMQ endpoint"),
                       (["--metrics", "http://127.0.0.1:1/metrics", "--duration", "0", "--out",
                         str(tmp_path / "x.json")], "--duration")):
        proc = observe(*flags)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 2 and msg in err and "Traceback" not in err
    assert not (tmp_path / "x.json").exists()


def test_kv_bind_hears_a_publisher_that_connects_as_vllm_does_to_a_host_address(tmp_path):
    """Issue 52 item 8: vLLM's publisher binds only `*`, ipc:// and inproc:// endpoints and connects to
    a host address (vllm/distributed/kv_events.py ZmqEventPublisher); a subscriber that connects to the
    same tcp://127.0.0.1:PORT then hears nothing, and the summary says why. With --kv-bind it binds."""
    frames = kv_frames()
    port = free_port()
    out = tmp_path / "bound.json"
    proc = observe("--kv-events", f"tcp://127.0.0.1:{port}", "--kv-bind", "--out", str(out), "--flush-interval",
                   "0.3")
    ctx = zmq.Context()
    pub = ctx.socket(zmq.XPUB)
    pub.connect(f"tcp://127.0.0.1:{port}")      # the publisher connects, as vLLM does here
    try:
        assert pub.poll(30_000), "the observer never subscribed"
        pub.recv()
        for f in frames:
            pub.send_multipart(f)
        want = len(open_trace(RUN / "kv_events.jsonl").trace.kv_events)
        stdout, stderr = stop_when(proc, lambda: out.exists() and len(load_trace(out).kv_events) == want)
    finally:
        if proc.poll() is None:
            proc.kill()
        pub.close(0)
        ctx.term()
    assert proc.returncode == 0, stderr
    assert len(load_trace(out).kv_events) == want
    quiet = observe("--kv-events", f"tcp://127.0.0.1:{free_port()}", "--out", str(tmp_path / "q.json"),
                    "--duration", "1")
    stdout, stderr = quiet.communicate(timeout=60)
    assert quiet.returncode == 0, stderr
    assert "--kv-bind" in stdout and "connects to it rather than binding it" in stdout
