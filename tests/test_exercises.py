"""The Exercises page: the sources' reference numbers, links that open real views, checks."""
from urllib.parse import parse_qs, urlsplit

import pytest

import ui
from core.lessons.exercises import EXERCISES
from tests.conftest import ROOT
from tests.helpers import open_page

# Reference answers as the sources state them (chapter 31 section 31.10; the lesson's recall 10)
STATED = {"ch31-1": [180, 280, 200, 180], "ch31-2": [12, 12], "ch31-3": [0.5, 0.3, 0.7], "recall-10": [143]}


def test_six_exercises_and_ten_recall_questions():
    assert sum(e.key.startswith("ch31-") for e in EXERCISES) == 6
    assert sum(e.key.startswith("recall-") for e in EXERCISES) == 10


@pytest.mark.parametrize("key", list(STATED))
def test_computed_answers_match_the_sources(key):
    ex = next(e for e in EXERCISES if e.key == key)
    for n, stated in zip(ex.numeric, STATED[key], strict=True):
        assert n.check(stated), (n.label, n.value(), stated)
        assert not n.check(stated + 2 * n.tolerance + 0.01)


def test_every_link_opens_a_page_with_declared_parameters():
    app = (ROOT / "app.py").read_text()
    for ex in (e for e in EXERCISES if e.link):
        parts = urlsplit("/" + ex.link)
        page = parts.path.strip("/")
        assert f'url_path="{page}"' in app, ex.key
        for k in parse_qs(parts.query):
            assert k in ui.URL_KEYS and ui.URL_KEYS[k].page == page, (ex.key, k)


def test_page_checks_answers_and_hides_the_reference():
    at = open_page("exercises")
    assert len(at.subheader) == len(EXERCISES) == 23 and len(at.expander) == len(EXERCISES)
    at.number_input(key="ex_ch31-2_0").set_value(12.0).run()
    at.number_input(key="ex_ch31-2_1").set_value(12.0).run()
    assert [s.value for s in at.success] == ["All 2 correct"]     # the icon is the mark: not a second one
    at.number_input(key="ex_recall-10_0").set_value(100.0).run()
    assert any("1 of 1 entered not right" in e.value for e in at.error)
    ex = next(e for e in EXERCISES if e.key == "recall-10")
    wrong = next(e.value for e in at.error if "1 of 1 entered not right" in e.value)
    assert "counts" not in wrong and "✗" not in wrong                # issue 36, item 27
    assert f"right within ± {ex.numeric[0].tolerance:g}" in wrong and (not ex.numeric[0].unit or ex.numeric[0].unit
                                                                         in wrong)
    at.number_input(key="ex_ch31-1_0").set_value(1.0).run()
    ms = next(e.value for e in at.error if "A, serial" in e.value)
    assert "± 0.5 ms)" in ms


@pytest.mark.parametrize("ex", [e for e in EXERCISES if e.link], ids=lambda e: e.key)
def test_every_link_opens_its_view_without_a_notice(ex):
    """Issue 36, item 27: exercise 3's link opened the chapter's preset, not the exercise's p and q."""
    parts = urlsplit("/" + ex.link)
    params = {k: v if len(v) > 1 else v[0] for k, v in parse_qs(parts.query).items()}
    at = open_page(parts.path.strip("/"), params)
    assert not at.exception
    assert not [w.value for w in at.warning if "link" in w.value.lower() or "default" in w.value.lower()]
    if ex.key == "ch31-3":
        from core.lessons.exercises import EX3_P, EX3_Q
        table = next(d.value for d in at.dataframe if "accept min(1, p/q)" in d.value.columns)
        assert table["p"].tolist() == EX3_P and table["q"].tolist() == EX3_Q
