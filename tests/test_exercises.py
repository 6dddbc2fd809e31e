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
    assert len(at.subheader) == 16 and len(at.expander) == 16
    at.number_input(key="ex_ch31-2_0").set_value(12.0).run()
    at.number_input(key="ex_ch31-2_1").set_value(12.0).run()
    assert [s.value for s in at.success] == ["✓ all 2 correct"]
    at.number_input(key="ex_recall-10_0").set_value(100.0).run()
    assert any("1 of 1 entered not right" in e.value for e in at.error)
