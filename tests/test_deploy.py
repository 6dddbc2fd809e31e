"""The classroom deployment (docs/deploy.md): Streamlit processes behind HAProxy, sticky per
browser. Needs haproxy (apt-get install haproxy; CI installs it) and, for the browser test,
Chromium."""
import os
import shutil
import socket
import subprocess

import pytest

from deploy.serve import DeployError, cluster, haproxy_config
from tests.conftest import DATA
from tests.helpers import wait_idle


def require_haproxy():
    if shutil.which("haproxy") is None:
        if os.environ.get("CI"):
            pytest.fail("CI needs haproxy (apt-get install -y haproxy)")
        pytest.skip("haproxy is not installed")


def free_run(n: int) -> int:
    """A port p with p .. p+n all free on loopback (the proxy and n processes)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + n > 65535:
            continue
        try:
            socks = []
            for p in range(base, base + n + 1):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no run of free ports")


def test_generated_config_is_accepted_by_haproxy(tmp_path):
    require_haproxy()
    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text(haproxy_config("127.0.0.1", 8501, [8502, 8503, 8504]))
    text = cfg.read_text()
    assert "bind 127.0.0.1:8501" in text and text.count("    server st") == 3
    assert "cookie SE_BACKEND insert" in text and "timeout tunnel" in text
    r = subprocess.run(["haproxy", "-c", "-f", str(cfg)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr


def test_missing_haproxy_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(DeployError, match="haproxy is not installed"), cluster(1, 8501):
        pass


@pytest.mark.browser
def test_browsers_spread_over_processes_and_uploads_reach_their_session(browser):
    """Four browsers (separate cookie jars) through the proxy: they land on both processes, and
    each one's upload, an HTTP request apart from its websocket, reaches the process that holds
    its session: the trace renders, no error. Without stickiness about half the uploads would
    reach the other process and fail."""
    require_haproxy()
    from playwright.sync_api import expect
    trace = DATA / "traces" / "chapter31_serial.json"
    with cluster(2, free_run(2)) as (url, pids):
        assert len(pids) == 3   # two Streamlit processes and the proxy
        landed, contexts = [], []
        try:
            for _ in range(4):
                ctx = browser.new_context(viewport={"width": 1280, "height": 900})
                contexts.append(ctx)
                page = ctx.new_page()
                page.set_default_timeout(60_000)
                page.goto(f"{url}/replay?tr=Upload+a+file%E2%80%A6")
                wait_idle(page)
                page.locator("[data-testid='stFileUploaderDropzoneInput']").set_input_files(str(trace))
                expect(page.get_by_text("16.7", exact=True).first).to_be_visible(timeout=60_000)
                wait_idle(page)
                assert page.locator("[data-testid='stException']").count() == 0
                assert page.locator("[data-testid='stAlertContentError']").count() == 0
                landed += [c["value"] for c in ctx.cookies() if c["name"] == "SE_BACKEND"]
                # stay connected (an open tab), so the next browser sees this one's websocket
        finally:
            for ctx in contexts:
                ctx.close()
    assert len(landed) == 4 and set(landed) == {"st1", "st2"}, landed
