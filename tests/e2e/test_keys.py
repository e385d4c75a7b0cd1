"""The presenter's keys in a real browser, with no engine (the page replays a shipped recording):
Page Down / Page Up walk a lesson's sections, and on Step by step a burst of presses faster than
the page's runs moves exactly as many steps as were pressed (each press waits for the previous
press's run: a press that interrupted a run used to be lost)."""

from __future__ import annotations

import re

from .browsing import at_step

LESSON = "02-oven-vs-flow"


def heading_at_top(page) -> str:
    """The text of the lesson heading nearest the top of the page's content (under its header)."""
    return page.evaluate(
        """() => {
          const hs = Array.from(document.querySelectorAll(
            "[data-testid='stMain'] h2, [data-testid='stMain'] h3"));
          const bar = document.querySelector("header[data-testid='stHeader']");
          const line = bar ? bar.getBoundingClientRect().bottom : 0;
          const y = h => Math.abs(h.getBoundingClientRect().top - line);
          return hs.sort((a, b) => y(a) - y(b))[0].textContent.trim();
        }"""
    )


def keys_ready(page) -> None:
    page.wait_for_function("() => window.__fluxoKeysReady === true")
    page.wait_for_timeout(1000)  # the page's keys frame settles (Streamlit may replace it)


def test_page_down_and_up_walk_a_lessons_sections(offline, browser):
    from playwright.sync_api import expect

    page = browser.new_page(viewport={"width": 1300, "height": 800})
    page.set_default_timeout(60_000)
    expect.set_options(timeout=60_000)
    page.goto(f"{offline}/lessons?lang=en&lesson={LESSON}")
    expect(page.get_by_role("heading", name="The idea")).to_be_visible()
    keys_ready(page)
    page.locator("h1").first.click()  # focus on the page, not in a text box
    seen = []
    for _ in range(3):
        page.keyboard.press("PageDown")
        page.wait_for_timeout(300)
        seen.append(heading_at_top(page))
    assert len(set(seen)) == 3, seen  # three different sections, one per press
    page.keyboard.press("PageUp")
    page.wait_for_timeout(300)
    assert heading_at_top(page) == seen[1], (seen, heading_at_top(page))
    page.close()


def test_a_burst_of_presses_moves_as_many_steps(offline, browser):
    from playwright.sync_api import expect

    page = browser.new_page(viewport={"width": 1300, "height": 1200})
    page.set_default_timeout(60_000)
    expect.set_options(timeout=60_000)
    at = 20
    page.goto(f"{offline}/step?lang=en&rec={LESSON}&at={at}")
    expect(page.get_by_role("heading", name=re.compile(rf"^Step {at} ·"))).to_be_visible()
    keys_ready(page)
    page.locator("h1").first.click()
    for key in ["PageDown"] * 4 + ["PageUp"] + ["PageDown"] * 2:  # no waiting between presses
        page.keyboard.press(key)
    end = at + 4 - 1 + 2
    expect(page.get_by_role("heading", name=re.compile(rf"^Step {end} ·"))).to_be_visible()
    page.wait_for_function(at_step(end))
    page.wait_for_function("() => !window.__fluxoKeyQueue || !window.__fluxoKeyQueue.dirs.length")
    page.wait_for_timeout(1500)  # nothing more arrives: no press was applied twice
    expect(page.get_by_role("heading", name=re.compile(rf"^Step {end} ·"))).to_be_visible()
    page.close()
