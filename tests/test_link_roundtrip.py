"""Links restore everything: on every page, each widget bound to the URL (ui.URL_KEYS; "*" keys on
every page) is set through the real UI in headless Chromium to a value other than its default; the
address the app then shows (page.url) is opened in a fresh browser context (no cookies, storage,
cache or session shared) and every one of those widgets must show the value that was set, with no
exception and no notice that a link value was invalid, and the view must show the same numbers
(its text, metrics, and its figures' titles and annotations) as before the reload. Query parameters that are not widgets
(the speculative page's sp_pq, the custom workload's wl) are not in URL_KEYS and not covered here."""
import math
import re
import time
from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit

import pytest
from google.protobuf.message import DecodeError
from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

pytestmark = pytest.mark.browser

VIEWPORT = {"width": 1400, "height": 1000}
TRACE = "shared_prefix_caching_on.json.gz"
# the app's notices for a link value it could not use (ui.choice_param, ui.drop_overlong_params, the
# speculative table and the custom workload table): each carries the link_off icon
FALLBACK = re.compile(r"link_off|showing the default|showing the preset|showing the example|Ignored the link")


@dataclass(frozen=True)
class Set:
    """One widget, set through the UI. `value`: number/text/select/segmented: the value to set;
    pills: the selection wanted; toggle: on or off; slider: the keys pressed on its thumb (the value
    expected back is the one the slider shows after them)."""
    key: str
    kind: str
    value: object


@dataclass(frozen=True)
class Case:
    """`phases`: the widgets set one after another; between two phases the page is reloaded from its own
    address in the same context (see ORDER below)."""
    id: str
    path: str                 # where the case starts: the page's url_path and any query it needs first
    phases: tuple[tuple[Set, ...], ...]

    @property
    def steps(self) -> list[Set]:
        return [s for phase in self.phases for s in phase]


PRESENT = Set("present", "toggle", True)   # "*": on every page; the sidebar's first widget, so set last


def num(key, v):
    return Set(key, "number", v)


def sel(key, v):
    return Set(key, "select", v)


# ORDER. A widget that moves to another position in the page (an element above it appeared or went
# away in the last rerun) sometimes stops writing its value to the address bar, so the link misses
# it. Found while writing this test: on the KV page, after switching the model preset between
# "Custom" and a model (kv.py shows "Beside the weights" only for a model), 3 of 26 edits of the
# fork demo's prompt tokens (fk_prompt) never reached the address bar (0 of 24 after switching the
# dtype or GPU, which move nothing); the same happened to sched_to after the scenario changed. Our
# best guess: Streamlit's frontend mounts the widget again at its new position, and the copy left at
# the old position, unmounted later, removes the URL binding they share. It is timing-dependent, so
# it cannot be a strict xfail here; to check what a link restores rather than hit that race, the
# widgets that change a page's layout (scenario, policies, step-time model kind, model preset,
# example, workload, trace) are set in a first phase, the page is reloaded from its own address, and
# the rest are set from the bottom of the page up, so that none is set after the layout above it
# changed.
CASES = [
    # Burst 5's preset sets the policies, max seqs, chunk and the constant step model; every widget is
    # then moved off both its default and the preset's value. The schedules are named in the order of
    # the policies picked (continuous, then serial): the pickers' defaults are the first (sched_pick,
    # sched_from) and the last (sched_to)
    Case("schedules-constant", "schedules", (
        (sel("sc", "Burst 5"), Set("pol", "pills", ["serial", "continuous"]), Set("s_kind", "segmented", "constant")),
        (sel("sched_to", "simulated continuous"), sel("sched_from", "simulated serial"),
         sel("sched_pick", "simulated serial"), num("w1", 30), num("w0", 5), num("usd", 3.5), num("s_step", 2.5),
         num("bs", 8), num("kb", 40), num("ch", 3), num("tb", 64), num("ms", 2), PRESENT))),
    # the features step model shows the affine model's fields (s_base, s_pp, s_pd) and three more
    Case("schedules-features", "schedules", (
        (Set("pol", "pills", ["static"]), Set("s_kind", "segmented", "features")),
        (num("s_pch", 0.125), num("s_pdk", 0.0625), num("s_ppk", 0.03125), num("s_pd", 0.25), num("s_pp", 0.5),
         num("s_base", 7), PRESENT))),
    Case("schedules-roofline", "schedules", (
        (Set("s_kind", "segmented", "roofline"),),
        (sel("s_gpu", "H100-SXM"), sel("s_model", "Llama-3-8B"), num("s_base", 3), PRESENT))),
    # the custom model's layers, KV heads and head dim are enabled only for the "Custom" preset; the
    # time cursor's range follows the paging settings, so it is set after them (nothing above it moves)
    Case("kv-custom", "kv", (
        (sel("kv_model", "Custom"),),
        (num("fk_bs", 8), num("fk_samples", 2), num("fk_prompt", 7), Set("px_b", "text", "1,2,4"),
         Set("px_a", "text", "1,2,3"), Set("pg_salt", "toggle", False), Set("pg_pc", "toggle", False),
         num("pg_ms", 4), num("pg_pool", 128), num("pg_bs", 8), sel("pg_wl", "burst5"),
         Set("pg_cursor", "slider", ["ArrowLeft"]), num("kv_seqs", 3), num("kv_tokens", 4096), num("kv_hd", 96),
         num("kv_heads", 4), num("kv_layers", 40), sel("kv_gpu", "H100-SXM"), sel("kv_dtype", "fp8"), PRESENT))),
    # the CPU tier lesson (each change simulates the lesson's workload with and without the tier)
    Case("kv-tiers", "kv", (
        (sel("kt_pol", "arc"), num("kt_pool", 300), num("kt_cpu", 2000), num("kt_gbps", 10),
         sel("kt_model", "Llama-2-7B")),)),
    # the tiles visited: its range follows the tile size, set before it
    Case("tiles-chapter", "tiles", (
        (num("at_bq2", 64), sel("at_dt", "4"), sel("at_hd", "64"), Set("at_causal", "toggle", False),
         num("at_bk", 32), num("at_bq", 64), num("at_T", 256), num("at_tile", 1),
         Set("at_upto", "slider", ["ArrowLeft"]), PRESENT),)),
    # the random example's fields are shown only with at_preset=random
    Case("tiles-random", "tiles", (
        (Set("at_preset", "segmented", "random"),),
        (num("at_scale", 1.5), num("at_seed", 7), num("at_tile_r", 8), num("at_n", 32),
         Set("at_upto", "slider", ["ArrowLeft"]), PRESENT))),
    Case("speculative", "speculative", (
        (num("sp_verify", 1.5), Set("sp_gamma", "slider", ["ArrowRight"]), num("sp_seed", 5),
         num("sp_draws", 20_000), Set("sp_preset", "segmented", "three"), Set("sp_alpha", "slider", ["ArrowRight"]),
         PRESENT),)),
    Case("roofline", "roofline", (
        (num("rf_prompt", 512), num("rf_batch", 64), sel("rf_dtype", "1.0"), sel("rf_model", "Mistral-7B"),
         sel("rf_gpu", "H100-SXM"), PRESENT),)),
    # the workload, loop, loads and policies make the options of the inspected point (ld_pt, ld_px);
    # closed loops of 16 and 64 clients keep each rerun's sweep short
    Case("load", "load", (
        (sel("ld_wl", "Shared prefix 200"), Set("ld_kind", "segmented", "closed"), Set("ld_loads", "text", "16,64"),
         Set("ld_pol", "pills", ["static", "chunked"])),
        (sel("ld_px", "16"), sel("ld_pt", "static"), Set("ld_att", "slider", ["ArrowLeft"]),
         num("ld_e2e", 20_000), num("ld_tpot", 40), num("ld_ttft", 400), num("ld_pd", 0.06), num("ld_pp", 0.03),
         num("ld_base", 4), num("ld_kb", 5000), num("ld_ch", 256), num("ld_tb", 4096), num("ld_ms", 16),
         num("ld_seed", 3), PRESENT))),
    # the capacity search on the Load page: its grid, load, policy and price (a link never runs it)
    Case("load-search", "load", (
        (num("ld_s_rate", 12), sel("ld_s_pol", "continuous"), num("ld_s_usd", 3), Set("ld_s_ms", "text", "16,64"),
         Set("ld_s_tb", "text", "8192"), Set("ld_s_kb", "text", "none,6000")),)),
    # on a trace with steps and KV events, named in the starting address (the trace picker is set
    # through the UI in the next case)
    Case("replay-cursor", f"replay?tr={TRACE}", (
        (sel("rp_cmp", "chapter31_continuous.json"), Set("rp_speed", "segmented", "2×"),
         Set("rp_cursor", "slider", ["ArrowRight"]), PRESENT),)),
    # a file of several runs (guidellm's three benchmarks): the run picked
    Case("replay-run", "replay?tr=guidellm+0.8.1+against+our+server%3A+concurrency+1%2C+2%2C+4", (
        (sel("rp_run", "concurrent@2"), PRESENT),)),
    # Play moves the cursor by itself, so the cursor is not compared in this case; a three-request
    # trace keeps the play's reruns (every 0.8 s) short, and the switch is set before play starts
    Case("replay-play", "replay", (
        (sel("tr", "chapter31_serial.json"),),
        (PRESENT, Set("rp_play", "toggle", True)))),
    # the Fleet page: disaggregated with a drain (the P/D fields show only with fl_dis on), then the
    # whole-replica count, then each experiment tab's own widgets (they are drawn only in their tab)
    Case("fleet-pd", "fleet", (
        (sel("fl_wl", "Burst 5"), Set("fl_dis", "toggle", True), Set("fl_drain", "toggle", True)),
        (num("fl_pd", 0.3), num("fl_pp", 0.06), num("fl_base", 4), num("fl_dt", 20), num("fl_dr", 2),
         sel("fl_model", "Llama-3-8B"), num("fl_min", 8), num("fl_lat", 0.1), num("fl_gbps", 10), num("fl_kb", 500),
         Set("fl_pc", "toggle", False), num("fl_stale", 5), sel("fl_pol", "least-requests"), num("fl_d", 2),
         num("fl_p", 2), Set("fl_load", "slider", ["ArrowLeft"]), PRESENT))),
    Case("fleet-stale", "fleet", (
        (sel("fl_wl", "Burst 5"), Set("fl_bal", "toggle", False), Set("fl_tab", "tab", "Stale router")),
        (Set("fl_n", "slider", ["ArrowLeft"]), Set("fl_s_max", "slider", ["ArrowLeft"]),
         Set("fl_s_pol", "pills", ["round-robin"])))),
    Case("fleet-pd-split", "fleet", (
        (sel("fl_wl", "Burst 5"), Set("fl_tab", "tab", "P:D split")),
        (Set("fl_tpot", "slider", ["ArrowLeft"]), Set("fl_ttft", "slider", ["ArrowLeft"]),
         Set("fl_t", "slider", ["ArrowRight"])))),
    Case("fleet-measured", "fleet", (
        (Set("fl_tab", "tab", "Measured"),),
        (sel("fl_measured", "gpu_runner fleet: prefix prefix aware"),))),
    # Prediction vs measurement: another run predicted, fitted on another (the log fit: instant)
    Case("calibration", "calibration", (
        (sel("cal_run", "run9_poisson2_p64_o128"),),
        (Set("cal_fit", "pills", ["run4_poisson8_p128_o32"]), Set("cal_speed", "toggle", True), PRESENT))),
    # the fit method: the spans fit of the default run (run1, the quickest: ~20 s, once per server)
    Case("calibration-spans", "calibration", ((Set("cal_method", "segmented", "spans"),),)),
    # a fleet trace: one replica picked
    Case("replay-replica", "replay?tr=fleet_two.json.gz", ((sel("rp_replica", "replica 1 (both)"),),)),
    # the pages whose only bound widget is the presentation switch
    *[Case(path or "home", path, ((PRESENT,),)) for path in ("", "pathologies", "exercises")],
]


# ---- driving the widgets ---------------------------------------------------------------------------

IDLE = """([skeletons]) => !!document.querySelector("[data-testid='stApp'][data-test-script-state='notRunning']")
                          && !(skeletons && document.querySelector("[data-testid='stSkeleton']"))"""


class Runs:
    """Counts the script runs the server reports finished to one page (ForwardMsg.script_finished): a
    quick run can leave the page's script-state attribute unchanged, the message is always sent."""

    def __init__(self, page):
        self.done = 0
        page.on("websocket", lambda ws: ws.on("framereceived", self._frame))

    def _frame(self, payload):
        if isinstance(payload, bytes) and len(payload) < 256:     # the finish message is a few bytes
            msg = ForwardMsg()
            try:
                msg.ParseFromString(payload)
            except DecodeError:
                return
            if msg.WhichOneof("type") == "script_finished":
                self.done += 1


def runs_done(page) -> int:
    return page.link_runs.done


def settle(page, after: int | None = None, skeletons=False, timeout_s=90):
    """Wait for a script run to finish after the first `after` runs and the app to be idle; without
    `after`, for the app to be idle on two polls in a row. `skeletons`: also for every element to be
    drawn (a page's first load fetches the code of each kind of element, plotly's for seconds)."""
    deadline = time.time() + timeout_s
    if after is not None:
        while runs_done(page) <= after:
            assert time.time() < deadline, "no script run finished"
            page.wait_for_timeout(25)
        if page.evaluate(IDLE, [skeletons]):
            return
    calm = 0
    while calm < 2:
        calm = calm + 1 if page.evaluate(IDLE, [skeletons]) else 0
        assert time.time() < deadline, "the app did not settle"
        page.wait_for_timeout(50)


def widget(page, key):
    return page.locator(f".st-key-{key}").first


def set_widget(page, s: Set):
    """Set one widget as a user would, and wait for the rerun it starts."""
    w = widget(page, s.key)
    w.scroll_into_view_if_needed()
    if s.kind != "slider" and same(read_widget(page, s), expected(s)):   # (waits for it to be drawn)
        return      # already so: a preset set it (Burst 5's constant step model)
    before = runs_done(page)
    if s.kind in ("number", "text"):
        box = w.locator("input").first
        box.fill(str(s.value))
        box.press("Enter")
    elif s.kind == "select":
        pick_option(page, w, str(s.value))
    elif s.kind == "segmented":
        w.get_by_role("radio", name=str(s.value), exact=True).click()
    elif s.kind == "pills":
        for b in w.locator("button[aria-pressed]").all():
            if (b.inner_text().strip() in s.value) != (b.get_attribute("aria-pressed") == "true"):
                b.click()
                settle(page, before)
                before = runs_done(page)
        return
    elif s.kind == "toggle":
        if w.get_by_role("switch").is_checked() == s.value:
            return
        w.locator("label").first.click()
    elif s.kind == "tab":
        w.get_by_role("tab", name=str(s.value), exact=True).click()
    elif s.kind == "slider":
        w.get_by_role("slider").focus()
        for k in s.value:
            page.keyboard.press(k)
        settle(page, before)
        return settle(page)        # the presses may start more than one run
    else:
        raise ValueError(s.kind)
    settle(page, before)


def pick_option(page, w, value, tries=3):
    """Choose `value` in a selectbox: open it, type the value (the list then holds only the options
    that match, so the one wanted is drawn even in a long, virtualised list) and click it. Under load
    the list sometimes opens and closes before the click lands; then it is opened again."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    box = w.get_by_role("combobox")
    for attempt in range(tries):
        box.click()
        box.fill(value)
        option = page.get_by_role("option", name=value, exact=True)
        try:
            option.wait_for(state="visible", timeout=20_000)
            option.click(timeout=20_000)
            return
        except PlaywrightTimeout:
            if attempt == tries - 1:
                raise
            page.keyboard.press("Escape")


# the element of each kind of widget that holds its value (absent while the widget is a skeleton)
VALUE_OF = {"number": "input", "text": "input", "select": "[role=combobox]", "segmented": "[role=radio]",
            "pills": "button[aria-pressed]", "toggle": "[role=switch]", "slider": "input[type=range]",
            "tab": "[role=tab]"}


def read_widget(page, s: Set):
    w = widget(page, s.key)
    w.locator(VALUE_OF[s.kind]).first.wait_for(state="attached")
    if s.kind == "number":
        return float(w.locator("input").first.input_value())
    if s.kind in ("text", "select"):
        return w.locator(VALUE_OF[s.kind]).first.input_value()
    if s.kind == "segmented":
        on = w.locator("[role=radio][aria-checked=true]")
        return on.inner_text().strip() if on.count() else None
    if s.kind == "pills":
        return sorted(b.inner_text().strip() for b in w.locator("button[aria-pressed=true]").all())
    if s.kind == "toggle":
        return w.get_by_role("switch").is_checked()
    if s.kind == "tab":
        return w.locator("[role=tab][aria-selected=true]").first.inner_text().strip()
    return float(w.locator("input[type=range]").input_value())


def expected(s: Set):
    if s.kind == "number":
        return float(s.value)
    if s.kind == "pills":
        return sorted(s.value)
    return s.value


def same(a, b):
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)
    return a == b


NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?")


def numbers_shown(page) -> list[str]:
    """Every number the view shows: in the main block's text (metrics, captions, markdown, table
    headers drawn as HTML) and in its figures' titles and annotations (drawn in SVG), in order."""
    text = page.evaluate("""() => {
      const main = document.querySelector("[data-testid='stMainBlockContainer']") || document.body;
      const svg = [...main.querySelectorAll('.gtitle, .annotation-text')].map(t => t.textContent);
      return main.innerText + '\\n' + svg.join('\\n'); }""")
    return NUMBER.findall(text)


def page_problems(page) -> list[str]:
    out = [f"exception: {e.inner_text()[:300]}" for e in page.locator("[data-testid='stException']").all()]
    out += [f"link notice: {a.inner_text()[:300]}" for a in page.locator("[data-testid='stAlert']").all()
            if FALLBACK.search(a.inner_text())]
    return out


# ---- the round trip --------------------------------------------------------------------------------

def open_page(context, url, drawn=False):
    """A new page (a new session) at `url`, its first run finished; `drawn`: every element drawn."""
    page = context.new_page()
    page.set_default_timeout(60_000)
    page.link_runs = Runs(page)
    page.goto(url)
    settle(page, 0, skeletons=drawn)
    return page


def reload(page):
    before = runs_done(page)
    page.goto(page.url)
    settle(page, before)


def roundtrip(browser, user, server, case: Case):
    """Set the case's widgets in a page of the context `user` and open the address the app wrote in a
    fresh context. Returns (link, {key: (value set, value shown after the reload)} for each widget
    that differs, the problems shown after the reload)."""
    page = open_page(user, f"{server}/{case.path}")
    try:
        for i, phase in enumerate(case.phases):
            if i:
                reload(page)
            for s in phase:
                set_widget(page, s)
                got = read_widget(page, s)
                assert s.kind == "slider" or same(got, expected(s)), f"could not set {s.key}: it shows {got!r}"
        settle(page, skeletons=True)
        # every widget as it is now (a slider: the value its keys gave it)
        shown = {s.key: read_widget(page, s) for s in case.steps}
        changed = {s.key: (expected(s), shown[s.key]) for s in case.steps
                   if s.kind != "slider" and not same(shown[s.key], expected(s))}
        assert not changed, f"a later step changed these widgets (wanted, shown): {changed}"
        assert page_problems(page) == [], page_problems(page)
        link = page.url
        before_numbers = numbers_shown(page)
    finally:
        page.close()
    query = parse_qs(urlsplit(link).query)
    missing = [s.key for s in case.steps if s.key not in query]
    assert not missing, f"not in the link {link}: {missing}"

    fresh = browser.new_context(viewport=VIEWPORT)    # no cookies, storage, cache or session shared
    try:
        page = open_page(fresh, link, drawn=True)
        after = {s.key: read_widget(page, s) for s in case.steps}
        wrong = {k: (shown[k], after[k]) for k in shown if not same(after[k], shown[k])}
        # and the view shows the same numbers (issue 28: a widget restored but a number different
        # would be a link that does not reproduce what was shared)
        numbers = numbers_shown(page)
        playing = any(s.key == "rp_play" and s.value for s in case.steps)     # Play moves the view on its own
        if numbers != before_numbers and not playing:
            import difflib
            diff = [d for d in difflib.ndiff(before_numbers, numbers) if d[:1] in "+-"][:20]
            wrong["displayed numbers"] = (f"{len(before_numbers)} numbers", f"{len(numbers)}; changed: {diff}")
        return link, wrong, page_problems(page)
    finally:
        fresh.close()


@pytest.fixture(scope="module")
def user(browser):
    """The context whose pages set the widgets (a new page, so a new session, per case; the cache
    shared spares a download of the app's scripts per case)."""
    context = browser.new_context(viewport=VIEWPORT)
    yield context
    context.close()


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_a_link_restores_every_bound_widget(server, browser, user, case):
    link, wrong, problems = roundtrip(browser, user, server, case)
    assert not wrong, f"{link}: key: (set, after reload) {wrong}"
    assert not problems, f"{link}: {problems}"


def test_every_page_and_every_bound_key_has_a_round_trip():
    """A page or a URL key added later needs its case here."""
    from tests.conftest import ROOT
    from ui import URL_KEYS
    pages = {""} | set(re.findall(r'url_path="([^"]*)"', (ROOT / "app.py").read_text()))
    covered = {p: {s.key for c in CASES if c.path.split("?")[0] == p for s in c.steps} for p in pages}
    missing = {(p, k) for p in pages for k, u in URL_KEYS.items() if u.page in (p, "*") and k not in covered[p]}
    assert missing == set()
