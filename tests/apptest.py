"""Helpers for reading Streamlit AppTest results."""
import base64
import json

import numpy as np
from streamlit.testing.v1 import AppTest

from tests.conftest import ROOT


def open_page(page, params=None):
    """The page as the server runs it: through app.py (page config, link checks, navigation);
    pages rerun themselves through app.py when started on their own (ui.ensure_app_frame)."""
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=120)
    at.switch_page(f"pages/{page}.py")
    for k, v in (params or {}).items():
        at.query_params[k] = v
    at.run()
    assert not at.exception, at.exception
    return at


def charts(at):
    """Plotly figures on the page as dicts (st.plotly_chart appears as an unknown element)."""
    return [json.loads(el.proto.spec) for el in at.get("plotly_chart")]


def arr(v):
    """Plotly 7 may store arrays as base64 'bdata'."""
    if isinstance(v, dict) and "bdata" in v:
        return np.frombuffer(base64.b64decode(v["bdata"]), dtype=np.dtype(v["dtype"])).tolist()
    return v
