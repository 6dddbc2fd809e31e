"""The sidebar's "Link to this view" carries every widget the view drew, with its value now: a value set
by code (a preset) or a default that follows another widget (the fixed window's end follows the
scenario; the tiles visited follow the tile size) reopens the same. Headless (AppTest): the link's
query is what ui.link_box shows (kept in the session as `_view_query`); it is opened in a new session
and every bound widget and every number on the page must be as before (issue 36, item 1)."""
import json
import re

import pytest

from tests.helpers import open_page
from ui import URL_KEYS

NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?")


def shown(at) -> list[str]:
    """The numbers of the view: text, metrics, tables and the charts' titles and annotations."""
    out = []
    for kind in ("markdown", "caption", "text", "metric", "info", "success", "warning"):
        for el in at.get(kind):
            out += NUMBER.findall(str(getattr(el, "value", "")) + " " + str(getattr(el, "label", "")))
    for df in at.dataframe:
        out += NUMBER.findall(df.value.to_csv(index=False))
    for el in at.get("plotly_chart"):
        spec = json.loads(el.proto.spec)
        lay = spec.get("layout", {})
        out += NUMBER.findall(json.dumps(lay.get("title", ""))
                              + json.dumps([a.get("text", "") for a in lay.get("annotations", [])]))
    return out


def widget_values(at, page) -> dict:
    """The bound widgets the view drew (those in its link) and their values."""
    drawn = {k for k, _ in at.session_state["_view_query"]}
    return {k: at.session_state[k] for k, u in URL_KEYS.items() if u.page in (page, "*") and k in drawn}


def reopen(at, page):
    query = {}
    for k, v in at.session_state["_view_query"]:
        query.setdefault(k, []).append(v)
    return open_page(page, {k: v if len(v) > 1 else v[0] for k, v in query.items()})


def burst5_after_chapter31(at):
    at.selectbox(key="sc").set_value("Burst 5").run()


def tiles_visited_1(at):
    at.slider(key="at_upto").set_value(1).run()


def small_tiles_then_upto(at):
    at.number_input(key="at_tile").set_value(1).run()
    at.slider(key="at_upto").set_value(2).run()


def kv_cursor(at):
    at.selectbox(key="pg_wl").set_value("burst5").run()
    s = at.slider(key="pg_cursor")
    s.set_value(s.min + 3).run()


@pytest.mark.parametrize("page,act", [("schedules", burst5_after_chapter31), ("tiles", tiles_visited_1),
                                      ("tiles", small_tiles_then_upto), ("kv", kv_cursor)],
                         ids=["schedules-burst5", "tiles-upto-1", "tiles-small-upto-2", "kv-cursor"])
def test_the_link_reopens_the_same_view(page, act):
    at = open_page(page)
    act(at)
    assert not at.exception
    before_w, before_n = widget_values(at, page), shown(at)
    again = reopen(at, page)
    assert widget_values(again, page) == before_w
    assert shown(again) == before_n


def test_the_schedules_link_keeps_the_fixed_window_and_its_throughput():
    at = open_page("schedules")
    burst5_after_chapter31(at)
    assert ("w1", "400.0") in at.session_state["_view_query"]
    again = reopen(at, "schedules")
    assert again.number_input(key="w1").value == 400.0
