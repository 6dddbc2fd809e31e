"""Files the replay page may be pointed at that are not plain trace files: FIFOs,
directories named *.json, broken and looping symlinks. Listing skips them; opening one
that changed since it was listed gives a message, never a hang or a traceback."""
import os
import re
import shutil
import threading

import pytest

from core.lessons.scenarios import trace_files
from tests.conftest import DATA


@pytest.fixture
def odd_dir(tmp_path):
    shutil.copy(DATA / "traces" / "chapter31_serial.json", tmp_path / "good.json")
    os.mkfifo(tmp_path / "fifo.json")
    (tmp_path / "dir.json").mkdir()
    (tmp_path / "broken.json").symlink_to(tmp_path / "missing.json")
    (tmp_path / "loop1.json").symlink_to(tmp_path / "loop2.json")
    (tmp_path / "loop2.json").symlink_to(tmp_path / "loop1.json")
    return tmp_path


def test_listing_keeps_only_regular_files(odd_dir):
    found = {n: p for n, p in trace_files(str(odd_dir)).items() if p.parent == odd_dir}
    assert sorted(found) == ["good.json"]


def test_opening_a_fifo_gives_a_message_not_a_hang(odd_dir):
    from ui import load_trace_file
    result = {}
    t = threading.Thread(target=lambda: result.update(out=load_trace_file(odd_dir / "fifo.json")), daemon=True)
    t.start()
    t.join(timeout=20)
    assert not t.is_alive(), "opening a FIFO blocked"
    tr, imp, err = result["out"]
    assert tr is None and "not a regular file" in err
    for name in ("broken.json", "loop1.json"):
        tr, imp, err = load_trace_file(odd_dir / name)
        assert tr is None and "cannot open" in err
    tr, imp, err = load_trace_file(odd_dir / "good.json")
    assert err is None and len(tr.requests) == 3


def test_user_text_is_rendered_inert(tmp_path, monkeypatch):
    # A trace whose label, notes and device carry markdown image/link/HTML/color syntax:
    # the page shows the characters, never an <img> that fetches an outside URL.
    import json

    from tests.helpers import open_page
    doc = json.loads((DATA / "traces" / "chapter31_serial.json").read_text())
    evil = "![x](http://198.51.100.1/x.png) <img src=x onerror=alert(1)> :red[boo] [link](http://198.51.100.1)"
    doc["meta"].update(label=evil, notes=evil, source="measured", device=evil)
    (tmp_path / "evil.json").write_text(json.dumps(doc))
    monkeypatch.setenv("SERVING_EXPLORER_TRACES", str(tmp_path))
    at = open_page("replay", {"tr": "evil.json"})
    shown = [el.value for el in at.markdown] + [el.value for el in at.caption]
    hostile = [v for v in shown if "198.51.100.1" in v.replace("\\", "")]
    assert len(hostile) >= 2                                  # label and details are shown ...
    for v in hostile:                                         # ... with every special character escaped
        for token in (r"!\[", r"\]\(", r"<img", r":red\["):
            assert not re.search(r"(?<!\\)" + token, v), (token, v)   # only ever preceded by a backslash
