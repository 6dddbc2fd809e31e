"""The app, headless (Streamlit AppTest): every page runs and shows the reference numbers."""
from streamlit.testing.v1 import AppTest

from tests.conftest import ROOT


def run_app():
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=60)
    return at.run()


def test_home_shows_chapter_numbers():
    at = run_app()
    assert not at.exception
    values = [m.value for m in at.metric]
    assert values == ["16.667 tok/s", "30.000 tok/s"]
    serial, continuous = (t.value for t in at.dataframe)
    assert serial["TTFT ms"].tolist() == [100, 240, 320]
    assert continuous["TTFT ms"].tolist() == [100, 130, 140]
    assert serial["TPOT ms"].tolist() == ["40", "40", "—"]      # C has no TPOT: shown as missing
    assert continuous["TPOT ms"].tolist() == ["50", "50", "—"]
    text = " ".join(m.value for m in at.markdown)
    assert "given" in text
