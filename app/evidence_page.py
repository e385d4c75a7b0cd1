"""The page's evidence button: one click downloads the tables of what the page shows
(``app/evidence.py``), built only when clicked. Anyone may press it, a student included: the
zip holds the records' numbers, no prompt, no answer, no client's name."""

from __future__ import annotations

from collections.abc import Callable

import streamlit as st

from app import evidence, i18n


def button(make: Callable[[], dict], key: str, lang: str) -> None:
    """``make`` returns the evidence document (``evidence.build`` and its friends)."""
    w = i18n.words(lang)
    st.download_button(
        w["evidence"],
        lambda: evidence.to_zip(make()),
        "fluxo-evidence.zip",
        "application/zip",
        key=f"{key}_evidence",
        icon=":material/table_view:",
        help=w["evidence_help"],
        on_click="ignore",
    )


def live(client, key: str, lang: str) -> None:
    """Live's buffer as it is when clicked: one run named ``live``, the engine's configuration."""

    def make() -> dict:
        snap = client.snapshot()
        config = dict(snap.state.get("config") or {})
        requests = evidence.window(snap.steps, snap.requests)
        src = evidence.Source("live", config, snap.steps, requests)
        return evidence.build("live", [src], {"weights": config.get("weights")})

    button(make, key, lang)
