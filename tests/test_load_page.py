"""The Load & SLOs page (AppTest) and core.capacity, against hand computations."""
import pytest

from core.capacity import exercise6, parse_loads
from core.errors import InputError
from tests.apptest import arr, charts, open_page


def test_exercise6_by_hand():
    rows = {r["schedule"]: r for r in exercise6()}
    plain, chunked = rows["no chunking"], rows["chunks of 32, 48-token budget"]
    # No chunking, affine 5 ms + 0.2/prefill token + 0.5/decoding sequence: step 1 prefills the
    # eight 16-token prompts (5 + 25.6 = 30.6 ms, 8 tokens); step 2 prefills long0 (arrived at
    # 20) beside 8 decodes (5 + 80 + 4 = 89 ms -> 119.6, 9 tokens); step 3 prefills the five
    # long prompts that arrived by then (2,000 tokens) beside 9 decodes: 409.5 ms -> 529.1, past
    # the 400 ms window. So 17 tokens in [0, 400], and long1 (arrived 35) waits until 529.1.
    assert plain["window_tokens"] == 17 and plain["window_tok_per_s"] == pytest.approx(17 / 0.4)
    assert plain["ttft_max_ms"] == pytest.approx(529.1 - 35) and plain["contract_holds"]
    assert chunked["window_tokens"] > 10 * plain["window_tokens"]
    assert chunked["over_bound"] > 0 and chunked["ttft_max_ms"] > 500 and not chunked["contract_holds"]


def test_parse_loads():
    assert parse_loads("20, 5,10 ,5", "open") == [5.0, 10.0, 20.0]
    for text, kind, msg in (("", "open", "expected comma-separated"), ("5,x", "open", "'x' is not a number"),
                            ("0", "open", "a rate > 0"), ("2.5", "closed", "whole number of clients"),
                            (",".join(str(i) for i in range(1, 30)), "open", "at most 24")):
        with pytest.raises(InputError, match=msg):
            parse_loads(text, kind)


def test_load_page_default_sweep():
    at = open_page("load")
    (fig,) = charts(at)
    titles = [a["text"] for a in fig["layout"]["annotations"]]
    assert titles[:4] == ["TTFT (ms)", "TPOT (ms)", "E2E (ms)", "tokens / s"]
    assert "SLO 500 ms" in titles and "SLO 50 ms" in titles              # the default bounds drawn
    assert fig["layout"]["height"] <= 900
    policies = {t["legendgroup"] for t in fig["data"] if t.get("legendgroup")}
    assert policies == {"continuous", "continuous + chunked prefill"}
    xs = arr(next(t for t in fig["data"] if t.get("name") == "continuous p99")["x"])
    assert xs == [5, 10, 15, 20, 25, 30]
    text = " ".join(m.value for m in at.markdown)
    assert "capacity" in text and ":orange-badge[simulated]" in text
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["L: mean requests in system"] == metrics["λ·W"]      # Little's law, drain window
    ex6 = at.dataframe[-1].value
    assert ex6["contract"].tolist() == ["holds", "FAILED"]
    assert "has **not** improved" in text


def test_load_page_closed_loop_and_bad_input():
    at = open_page("load", {"ld_kind": "closed", "ld_loads": "1,8", "ld_pol": "continuous"})
    (fig,) = charts(at)
    assert arr(fig["data"][0]["x"]) == [1, 8]
    assert fig["layout"]["xaxis3"]["title"]["text"] == "clients in a closed loop"
    at = open_page("load", {"ld_loads": "5,abc"})
    assert [e.value for e in at.error] == ["loads: 'abc' is not a number"] and not charts(at)
