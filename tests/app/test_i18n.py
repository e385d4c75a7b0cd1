"""The page's words in English and Portuguese (app/i18n.py): every key in both languages with the
same fields, every word the pages and the browser view ask for exists, numbers in the language's
format, the Compare table's values and configs readable."""

from __future__ import annotations

import re
import string
from pathlib import Path

import pytest

from app import browser_view, charts, i18n

APP = Path(__file__).resolve().parents[2] / "app"


def fields(text: str) -> set[str]:
    return {f for _, f, _, _ in string.Formatter().parse(text) if f}


def test_both_languages_have_every_word_with_the_same_fields():
    en, pt = i18n.WORDS["en"], i18n.WORDS["pt-BR"]
    assert en.keys() == pt.keys()
    for k in en:
        assert fields(en[k]) == fields(pt[k]), k
        assert pt[k].strip(), k


def test_every_word_the_page_asks_for_exists():
    used = set()
    for path in [*APP.glob("*.py"), *APP.glob("views/*.py")]:
        used |= set(re.findall(r"\bw\[\"([a-z0-9_]+)\"\]", path.read_text()))
    for path in APP.glob("component/**/*.js"):
        used |= set(re.findall(r"\bw\(\"([a-z0-9_]+)\"", path.read_text()))
    missing = used - set(i18n.WORDS["en"])
    assert not missing, missing
    view = set(i18n.VIEW_KEYS)
    js = set()
    for path in APP.glob("component/*.js"):
        js |= set(re.findall(r"\bw\(\"([a-z0-9_]+)\"", path.read_text()))
        js |= set(re.findall(r"\[\"(m_[a-z0-9]+)\"", path.read_text()))
    assert js <= view, js - view  # the browser view gets every word it shows


@pytest.mark.parametrize(
    "value, digits, en, pt",
    [
        (1234.5, 1, "1,234.5", "1.234,5"),
        (16.5884, 2, "16.59", "16,59"),
        (0, 0, "0", "0"),
        (1_000_000, 0, "1,000,000", "1.000.000"),
        (None, 1, "—", "—"),
        (float("nan"), 1, "—", "—"),
    ],
)
def test_numbers_in_the_language(value, digits, en, pt):
    assert i18n.num(value, digits, "en") == en and i18n.num(value, digits, "pt-BR") == pt


def test_metrics_read_with_units():
    assert i18n.metric("throughput", 16.5884, "pt-BR") == "16,6"
    assert i18n.metric("ttft_p50", 0.4567, "en") == "457 ms"
    # from 1,000 ms on, seconds (the walkthrough's "3.723 ms" read as 3 ms by students)
    assert i18n.metric("ttft_p50", 3.723, "pt-BR") == "3,7 s"
    assert i18n.metric("itl_p99", 0.999, "pt-BR") == "999 ms"
    assert i18n.metric("itl_p99", 0.9996, "en") == "1.0 s"
    assert i18n.metric("dead_slot_fraction", 0.375, "pt-BR") == "38%"
    assert i18n.metric("throughput_b_over_a", 2.3456, "pt-BR") == "2,35×"
    assert (
        i18n.metric("wall_s", 12.25, "pt-BR") == "12,2 s"
        or i18n.metric("wall_s", 12.25, "pt-BR") == "12,3 s"
    )


def test_configs_read_as_settings():
    config = {
        "device": "cpu",
        "max_slots": 8,
        "policy": "static",
        "kv_layout": "paged",
        "fill_timeout_s": 0.0,
    }
    assert (
        i18n.settings(config, "en")
        == "slots 8 · policy static · kv layout paged · batch wait (s) 0.0"
    )
    assert (
        i18n.settings(config, "pt-BR")
        == "slots 8 · política static · layout do KV paged · espera do lote (s) 0,0"
    )


def test_chart_words_in_portuguese_leave_the_data_alone():
    specs = charts.named_charts()
    pt = {n: browser_view.localize(s, "pt-BR") for n, s in specs.items()}
    en = {n: browser_view.localize(s, "en") for n, s in specs.items()}
    assert en == specs  # English is app/charts/'s own
    text = str(pt)
    assert "Ocupação dos slots" in text and "Memória KV" in text and "'field': 'phase'" in text
    assert "'field': 'fase'" not in text and "Slot occupancy" not in text
    big = browser_view.localize(specs["slots"], "en", 1.35)
    assert big["config"]["axis"]["labelFontSize"] == round(charts.FONT * 1.35)


def test_every_chart_word_has_its_portuguese():
    """Every title, subtitle and text of every chart, and every legend value, reads in pt-BR."""
    words: set[str] = set()

    def walk(node, inside: bool = False) -> None:
        if isinstance(node, list):
            for v in node:
                walk(v, inside)
        elif isinstance(node, dict):
            for k, v in node.items():
                if k not in ("data", "scale", "field", "expr"):
                    walk(v, inside or k in ("title", "text", "subtitle"))
        elif isinstance(node, str) and inside:
            words.add(node)

    walk(charts.named_charts(charts.BY_NAME))
    assert words and not words - browser_view.CHART_PT.keys()
    assert set(browser_view.KV_PT) == set(charts.KV_STATES)
    assert set(browser_view.PHASE_PT) == set(charts.PHASES)
    kv = str(browser_view.localize(charts.named_charts()["kv"], "pt-BR"))
    assert "alocados sem uso" in kv and "'field': 'state'" in kv
