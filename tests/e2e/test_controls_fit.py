"""The Live page's Modes and Traffic controls fit a projector and a desktop: at 1280 and 1920 px,
in English and in Portuguese, projector mode too, no option label breaks mid-word and no button
label is cut ("continu/ous", "Start tr…", "Inici…" on a 1366 px projector before). Screenshots of
each width are kept under tests/artifacts/ to look at."""

from __future__ import annotations

import pytest

from .browsing import ARTIFACTS

# Each option's, button's and widget label's text in the Modes | Traffic block: how many lines it
# takes, whether a word of it sits on two lines, and whether a box that hides overflow cuts it.
MEASURE = r"""() => {
  const out = [];
  const range = (el) => { const r = document.createRange(); r.selectNodeContents(el); return r; };
  const lines = (el) => new Set([...range(el).getClientRects()].map(x => Math.round(x.top))).size;
  const split = (el) => {  // a word whose letters sit on two lines
    const walker = document.createTreeWalker(el, NodeFilter.SHOW_TEXT);
    for (let t = walker.nextNode(); t; t = walker.nextNode()) {
      const re = /\S+/g; let m;
      while ((m = re.exec(t.data))) {
        const r = document.createRange();
        r.setStart(t, m.index); r.setEnd(t, m.index + m[0].length);
        if (new Set([...r.getClientRects()].map(x => Math.round(x.top))).size > 1) return true;
      }
    }
    return false;
  };
  const clip = (el) => {  // the text's right edge past the box that hides its overflow
    const right = range(el).getBoundingClientRect().right;
    for (let a = el; a && a !== document.body; a = a.parentElement) {
      const s = getComputedStyle(a);
      if (s.overflowX !== 'visible' || s.textOverflow === 'ellipsis')
        if (right > a.getBoundingClientRect().right + 1 || a.scrollWidth > a.clientWidth + 1)
          return true;
    }
    return false;
  };
  const heading = [...document.querySelectorAll('h3')].find(h => /^(Modes|Modos)$/.test(
    h.textContent.trim()));
  const block = heading.closest('[data-testid="stHorizontalBlock"]');  // Modes | Traffic
  for (const el of block.querySelectorAll('[data-testid="stRadio"] label p, '
      + '[data-testid^="stBaseButton"] p, [data-testid="stCheckbox"] label p, '
      + '[data-testid="stWidgetLabel"] p')) {
    if (!el.offsetParent || !el.textContent.trim()) continue;
    out.push({text: el.textContent.trim(), lines: lines(el), cut: clip(el), split: split(el)});
  }
  return out;
}"""


@pytest.mark.browser
@pytest.mark.parametrize("width", [1280, 1920])
@pytest.mark.parametrize("lang", ["en", "pt-BR"])
@pytest.mark.parametrize("projector", [False, True])
def test_modes_and_traffic_fit(browser, lab, width, lang, projector):
    _, http_url, _ = lab
    ctx = browser.new_context(viewport={"width": width, "height": 1400})
    page = ctx.new_page()
    try:
        url = f"{http_url}/?lang={lang}" + ("&projector=1" if projector else "")
        page.goto(url, wait_until="domcontentloaded")
        start = "Start traffic" if lang == "en" else "Iniciar tráfego"
        page.get_by_role("button", name=start).wait_for(timeout=90_000)
        page.get_by_text("continuous", exact=True).first.wait_for(timeout=30_000)
        seen = page.evaluate(MEASURE)
        ARTIFACTS.mkdir(exist_ok=True)
        shot = f"controls-{width}-{lang}{'-projector' if projector else ''}.png"
        page.screenshot(path=str(ARTIFACTS / shot), full_page=True)
        labels = {s["text"] for s in seen}
        cache = "prefix cache" if lang == "en" else "cache de prefixo"
        assert {"continuous", "reserved", "paged", "lognormal", cache, start} <= labels, labels
        # a label may wrap between words ("load (x capacity: 1.0 keeps the engine 100 % busy)"),
        # never inside one: each word's own box stays on one line
        broken = [s for s in seen if s["cut"] or s["split"]]
        assert not broken, broken
    finally:
        ctx.close()
