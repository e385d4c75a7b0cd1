"""Every UI label a lesson text names is one the page shows in that text's language.

The convention the texts follow: a control, page, chart, metric or button of the page is named in
**bold**, exactly as the page writes it (in pt-BR: "página **Ao vivo**", "**Parar tráfego**"; in
English: "the **Live** page", "**Stop traffic**"); a chat placeholder may be quoted instead. The
page's words come from the tables the page itself renders: ``app/i18n.py`` (the pages' and the
browser view's words), the Lessons page's own ``WORDS`` (``app/i18n_lessons.py``), the charts'
titles (``app/charts/``) and their Portuguese (``app/browser_view.CHART_PT``, ``PHASE_PT``,
``KV_PT``), and the mode choices (``app/ui.CHOICES``, shown as they are in both languages).

A text fails when it
- puts in bold (or in quotes) a label that only the *other* language's page shows,
- puts in bold, right after a word such as page/chart/button (página/gráfico/botão), a name that
  no page of its language shows, or
- says "página Live" / "Aulas page" with the other language's page name in plain text.

Bold stays free for emphasis elsewhere ("**joelho**"). The tables written by ``python -m
engine.lesson N --save`` and ``--live --save`` (between ``<!-- measured -->`` / ``<!-- live -->``
marks) are the engine's and are left out.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LESSONS = sorted(p for p in (ROOT / "lessons").iterdir() if (p / "scenario.toml").exists())
LANGS = ("en", "pt-BR")
OTHER = {"en": "pt-BR", "pt-BR": "en"}
TEXTS = [
    (path, lang, name)
    for path in LESSONS
    for lang in LANGS
    for name in (f"{lang}.md", f"teacher.{lang}.md")
]

# words after which a bold name must be one of the page's labels
UI_NOUNS = {
    "en": r"page|pages|chart|charts|button|field|box|selector|metric|metrics|toggle|view|views|tab",
    "pt-BR": r"página|páginas|gráfico|gráficos|botão|campo|caixa|seletor|métrica|métricas|chave|"
    r"visão|visões|aba",
}
PAGE_NAMES = {"en": ("Live", "Step by step", "Compare", "Lessons")}
PAGE_KEYS = ("live_title", "step_title", "cmp_title", "lessons_title")
GENERATED = re.compile(
    r"<!-- (measured|live) -->.*?<!-- /\1 -->", re.DOTALL
)  # engine-written tables
BOLD = re.compile(r"\*\*([^*\n]+?)\*\*")
QUOTED = re.compile(r"[\"“]([^\"”\n]{2,80})[\"”]")


def _lessons_page_words() -> dict[str, dict[str, object]]:
    """``WORDS`` of the Lessons page (``app/i18n_lessons.py``: a plain table, no page run)."""
    from app.i18n_lessons import WORDS

    return WORDS


def _chart_titles() -> set[str]:
    titles = set()
    for f in (ROOT / "app" / "charts").glob("*.py"):
        titles |= set(re.findall(r'title: str = "([^"]+)"', f.read_text(encoding="utf-8")))
    return titles


def _clean(label: str) -> str:
    return label.replace("**", "").strip().rstrip(":").strip()


@cache
def labels(lang: str) -> frozenset[str]:
    """Every label the page shows in ``lang``."""
    from app import browser_view, i18n, ui

    out: set[str] = set()
    for value in i18n.words(lang).values():
        if "{" not in value:
            out.add(_clean(value))
    for value in _lessons_page_words()[lang].values():
        for v in value if isinstance(value, tuple) else (value,):
            if "{" not in v:
                out.add(_clean(v))
    titles = _chart_titles()
    legends = {**browser_view.PHASE_PT, **browser_view.KV_PT}
    if lang == "en":
        out |= titles | set(browser_view.CHART_PT) | set(legends)
    else:  # a chart word with no Portuguese shows in English on the pt-BR page too
        out |= {browser_view.CHART_PT.get(t, t) for t in titles}
        out |= set(browser_view.CHART_PT.values()) | set(legends.values())
    for choices in ui.CHOICES.values():
        out |= set(choices)
    return frozenset(s for s in out if s)


def page_names(lang: str) -> tuple[str, ...]:
    from app import i18n

    return tuple(i18n.words(lang)[k] for k in PAGE_KEYS)


def problems(text: str, lang: str) -> list[str]:
    """What is wrong with the labels ``text`` (a lesson text in ``lang``) names."""
    text = GENERATED.sub("", text)
    own, other = labels(lang), labels(OTHER[lang])
    found = []
    after_noun = re.compile(rf"(?:\b(?:{UI_NOUNS[lang]})\b)\s*$", re.IGNORECASE)
    for m in BOLD.finditer(text):
        name = _clean(m.group(1))
        if name in own:
            continue
        before = text[max(0, m.start() - 40) : m.start()]
        if name in other:
            found.append(f"**{name}** is the {OTHER[lang]} page's label")
        elif after_noun.search(before):
            found.append(f"**{name}** (after {before.split()[-1]!r}) is no label of the page")
    for m in QUOTED.finditer(text):
        name = _clean(m.group(1))
        if name in other and name not in own:
            found.append(f'"{name}" is the {OTHER[lang]} page\'s label')
    for name in page_names(OTHER[lang]):
        if name in page_names(lang):
            continue
        pattern = (
            rf"\bp[áa]gina\s+{re.escape(name)}\b"  # in bold, the check above finds it
            if lang == "pt-BR"
            else rf"(?<!\*\*)\b{re.escape(name)}\s+page\b"
        )
        for m in re.finditer(pattern, text):
            found.append(f"{m.group(0)!r} names the {OTHER[lang]} page")
    return found


def test_the_label_tables_are_read() -> None:
    for lang in LANGS:
        assert set(page_names(lang)) <= labels(lang)
    assert {"Parar tráfego", "Aulas", "Ao vivo", "Engasgos de admissão"} <= labels("pt-BR")
    assert {"Stop traffic", "Lessons", "Live", "Admission stalls"} <= labels("en")


@pytest.mark.parametrize(
    ("lang", "text", "bad"),
    [
        ("pt-BR", "Na página **Lessons**, clique em **Preparar este cenário**.", 1),
        ("pt-BR", "Olhe o gráfico **Admission stalls** e clique em **Stop traffic**.", 2),
        ("pt-BR", "Abra a página Live.", 1),
        ("pt-BR", "Na página **Ao vivo**, o gráfico **Engasgos de admisão**.", 1),  # a typo
        ("pt-BR", 'Digite na caixa ("Ask the model something…").', 1),
        ("pt-BR", "Na página **Aulas** (*Lessons*), **Parar tráfego**; o **joelho**.", 0),
        ("en", "On the **Aulas** page, press **Parar tráfego**.", 2),
        ("en", "Open the **Live** page and read **useful tokens/s**; the **knee**.", 0),
    ],
)
def test_the_check_can_fail(lang: str, text: str, bad: int) -> None:
    assert len(problems(text, lang)) == bad, problems(text, lang)


@pytest.mark.parametrize(("path", "lang", "name"), TEXTS, ids=lambda v: getattr(v, "name", v))
def test_every_label_a_lesson_names_is_the_pages(path: Path, lang: str, name: str) -> None:
    found = problems((path / name).read_text(encoding="utf-8"), lang)
    assert not found, f"{path.name}/{name}:\n  " + "\n  ".join(found)
