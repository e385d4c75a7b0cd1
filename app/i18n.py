"""The page's words in English and Brazilian Portuguese, and numbers formatted for the language.

Every label, message and unit the pages and the browser view show comes from :data:`WORDS`, made
of the sidebar's words (``app/i18n_sidebar.py``), the pages' (``app/i18n_pages.py``), the
browser view's (``app/i18n_view.py``) and those of student policies (``app/i18n_policy.py``);
``tests/app/test_i18n.py`` checks both languages have every key and the same ``{fields}``.
Numbers: decimal comma and a dot for thousands in pt-BR (``1.234,5``), the reverse in English.
"""

from __future__ import annotations

import math
from typing import Any

from app.i18n_pages import PAGES
from app.i18n_policy import POLICY
from app.i18n_sidebar import SIDEBAR
from app.i18n_view import VIEW

LANGS = ("en", "pt-BR")

# key: (English, Portuguese), in the order the pages show them
_W: dict[str, tuple[str, str]] = {**SIDEBAR, **PAGES, **VIEW, **POLICY}
WORDS: dict[str, dict[str, str]] = {
    lang: {k: v[i] for k, v in _W.items()} for i, lang in enumerate(LANGS)
}
# The browser view's words (sent with its arguments).
VIEW_KEYS = tuple(k for k in _W if k.startswith(("v_", "m_", "over_", "chart_")))


def words(lang: str) -> dict[str, str]:
    return WORDS.get(lang, WORDS["en"])


def from_locale(locale: str | None) -> str:
    """The page's language for a browser locale (``navigator.language``): any Portuguese one
    (pt-BR, pt-PT, pt) reads pt-BR, everything else English. The switch in the sidebar stays."""
    return "pt-BR" if (locale or "").lower().split("-")[0] == "pt" else "en"


def num(x: Any, digits: int = 1, lang: str = "en", unit: str = "") -> str:
    """``1234.5`` -> ``1,234.5`` (en) or ``1.234,5`` (pt-BR); None / NaN -> a dash."""
    if (
        x is None
        or isinstance(x, bool)
        or not isinstance(x, (int, float))
        or math.isnan(x)
        or math.isinf(x)
    ):
        return "—" if not isinstance(x, str) else x
    text = f"{x:,.{digits}f}"
    if lang == "pt-BR":
        text = text.replace(",", "\0").replace(".", ",").replace("\0", ".")
    return f"{text}{unit}"


# How each metric reads: (scale, digits, unit). Fractions as %, seconds as ms, ratios as x.
UNITS: dict[str, tuple[float, int, str]] = {
    "throughput": (1, 1, ""),
    "decode_tput": (1, 1, ""),
    "ttft_p50": (1000, 0, " ms"),
    "itl_p50": (1000, 0, " ms"),
    "itl_p99": (1000, 0, " ms"),
    "itl_max": (1000, 0, " ms"),
    "running_itl_max": (1000, 0, " ms"),
    "running_itl_p99": (1000, 0, " ms"),
    "slot_utilization": (100, 0, "%"),
    "dead_slot_fraction": (100, 0, "%"),
    "kv_waste": (100, 0, "%"),
    "busy_fraction": (100, 0, "%"),
    "peak_running": (1, 0, ""),
    "steps": (1, 0, ""),
    "wall_s": (1, 1, " s"),
    "tokens_per_step": (1, 2, ""),
    "slot_steps_per_token": (1, 2, ""),
    # a policy's score on a trace (engine/lab/score.py)
    "goodput_rps": (1, 2, ""),
    "goodput_rps_without_heaviest": (1, 2, ""),
    "fairness": (1, 2, ""),
    "ttft_p99": (1000, 0, " ms"),
    "preemptions": (1, 0, ""),
    "policy_errors": (1, 0, ""),
}


def metric(name: str, value: Any, lang: str) -> str:
    """A metric's value with its unit, in the language's number format."""
    if name.endswith("_over_a"):
        return num(value, 2, lang, "×")
    scale, digits, unit = UNITS.get(name, (1, 3, ""))
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = value * scale
        # from 1,000 ms on, seconds with one decimal: "3,7 s" (a class read "3.723 ms" as 3 ms)
        if unit == " ms" and abs(value) >= 999.5:
            return num(value / 1000, 1, lang, " s")
    return num(value, digits, lang, unit)


def settings(config: dict[str, Any], lang: str) -> str:
    """A config as readable settings: ``policy static · slots 8 · KV blocks 40``."""
    w = words(lang)
    names = {
        "max_slots": w["slots"],
        "kv_blocks": w["kv_blocks"],
        "chunk_budget": w["chunk_budget"],
        "kv_layout": w["kv_layout"],
        "policy": w["policy"],
        "runner": w["runner"],
        "prefix_cache": w["prefix_cache"],
        "weights": w["roof_weights"],
        "fill_timeout_s": w["set_fill_timeout"],
        "host_work_ms": w["set_host_work"],
        "block_size": w["set_block_size"],
        "model": w["set_model"],
    }
    skip = ("device", "threads", "dtype")
    return (
        " · ".join(
            f"{names.get(k, k.replace('_', ' '))} {num(v, 1, lang) if isinstance(v, float) else v}"
            for k, v in config.items()
            if k not in skip
        )
        or "—"
    )
