"""The app in a real browser: headless Chromium against `streamlit run app.py`."""
import pytest

from tests.browser import SHOTS, browser_page, require_browser, streamlit_server, wait_idle

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def server():
    require_browser()
    with streamlit_server() as url:
        yield url


def test_home_renders_without_exception(server):
    from playwright.sync_api import expect
    with browser_page() as page:
        page.goto(server)
        wait_idle(page)
        expect(page.get_by_text("Serving Explorer").first).to_be_visible()
        expect(page.get_by_text("16.667 tok/s")).to_be_visible()
        expect(page.get_by_text("30.000 tok/s")).to_be_visible()
        assert page.locator("[data-testid='stException']").count() == 0
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / "home.png"), full_page=True)
