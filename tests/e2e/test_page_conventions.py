"""Streamlit's own conventions on the projected page (app/.streamlit/config.toml, read beside the
script however the page starts): the language follows the browser's locale (the switch and a
?lang= link still win), no developer toolbar (Deploy, Rerun) even on localhost, the light theme
whatever the OS prefers."""

from __future__ import annotations

import pytest

from .browsing import wait


def _open(browser, url: str, **context):
    ctx = browser.new_context(**context)
    page = ctx.new_page()
    page.goto(url, wait_until="domcontentloaded")
    return ctx, page


def _nav_text(page) -> str:
    return page.locator('[data-testid="stSidebarNav"]').inner_text(timeout=60_000)


@pytest.mark.parametrize(
    ("locale", "live"), [("pt-BR", "Ao vivo"), ("pt-PT", "Ao vivo"), ("en-US", "Live")]
)
def test_the_language_follows_the_browsers_locale(browser, offline, locale, live):
    ctx, page = _open(browser, offline, locale=locale)
    try:
        assert wait(lambda: live in _nav_text(page), 60)
    finally:
        ctx.close()


def test_a_lang_link_wins_over_the_locale(browser, offline):
    ctx, page = _open(browser, offline + "/?lang=en", locale="pt-BR")
    try:
        assert wait(lambda: "Live" in _nav_text(page), 60)
        assert "Ao vivo" not in _nav_text(page)
    finally:
        ctx.close()


def test_no_developer_toolbar_and_a_light_page_in_dark_mode(browser, offline):
    ctx, page = _open(browser, offline, locale="en-US", color_scheme="dark")
    try:
        assert wait(lambda: "Live" in _nav_text(page), 60)
        assert page.locator('[data-testid="stAppDeployButton"]').count() == 0
        assert page.get_by_text("Deploy", exact=True).count() == 0
        bg = page.evaluate(
            "getComputedStyle(document.querySelector('[data-testid=\"stApp\"]')).backgroundColor"
        )
        rgb = [int(x) for x in bg[bg.index("(") + 1 : bg.index(")")].split(",")[:3]]
        assert min(rgb) >= 230, f"the page is not light in a dark-mode browser: {bg}"
    finally:
        ctx.close()
