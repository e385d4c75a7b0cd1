"""A page switch is never lost to a view's report (issue 36: in a loaded CI run the presenter
clicked Aulas on Ao vivo and stayed on Ao vivo for 60 s).

Streamlit 1.67 sends a component's value with the page the browser still shows, and folds it
into a page switch not yet started: the newer request's page wins, so the old page runs again.
Ao vivo's view sends values on its own (its connection's status, the engine's new settings), so
a click on another page could be undone by a message that happened to land a moment after it.
The view now holds its values while a switch is under way (app/component/fluxo.js)."""

from __future__ import annotations

import pytest

from .browsing import VIEW, view

# Both in one task of the page, as a report landing just after the click does.
CLICK_THEN_REPORT = """([title, selector]) => {
  const link = [...document.querySelectorAll("[data-testid='stSidebarNav'] a")]
    .find(a => a.textContent.includes(title));
  link.click();
  const fluxo = document.querySelector(selector).contentWindow.fluxo;
  const value = {browser: fluxo.browser || null, engine: "after the click"};
  fluxo.post("streamlit:setComponentValue", {value: value, dataType: "json"});
}"""


@pytest.mark.browser
def test_a_report_after_a_click_does_not_undo_the_switch(lab, browser):
    _, http_url, _ = lab
    ctx = browser.new_context(viewport={"width": 1366, "height": 768})
    try:
        page = ctx.new_page()
        page.goto(f"{http_url}/?lang=en")
        frame = view(page)
        frame.wait_for_function("() => fluxo.status === 'connected'", timeout=60_000)
        page.wait_for_timeout(2_000)  # the connection's own report has landed and run
        page.evaluate(CLICK_THEN_REPORT, ["Lessons", VIEW])
        page.get_by_role("heading", name="Lessons").first.wait_for(timeout=60_000)
        # and it stays there: the held report is not sent from a page that is gone
        page.wait_for_timeout(3_000)
        assert page.get_by_role("heading", name="Lessons").first.is_visible()
        assert "/lessons" in page.url
    finally:
        ctx.close()
