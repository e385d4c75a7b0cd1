"""The page's shareable state: what the URL holds, and the source of the steps (engine or
recording).

The URL's query string holds the language, the source (``src=live`` or ``rec``), the recording
(a lesson's folder, ``rec=02-oven-vs-flow``), its run, the replay position (``at``, a step
number) and speed, the lesson shown, projector mode and the single full-screen chart; the path
holds the view (``/step``, ``/compare``, ``/lessons``). A copied link reopens the same picture:
on a session's first run the query string seeds the widgets, and every run writes it back.

Widgets of one page are forgotten by Streamlit when another page runs, so the values live in a
plain session dict (``_url``) as well, and each widget is seeded from it when it is drawn.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import streamlit as st

from app import recording

# name in the URL -> how to read it back from the query string
PARAMS: dict[str, Callable[[str], Any]] = {
    "lang": str,
    "src": str,
    "rec": str,
    "run": str,
    "at": int,
    "speed": float,
    "lesson": str,
    "projector": lambda v: v in ("1", "true", "on"),
    "chart": str,
}
DEFAULTS = {"lang": "en", "projector": False, "chart": "all", "speed": 1.0}


def url() -> dict[str, Any]:
    """The session's shareable state, seeded once from the query string."""
    state = st.session_state.get("_url")
    if state is None:
        state = {}
        for name, value in st.query_params.items():
            try:
                if name in PARAMS:
                    state[name] = PARAMS[name](value)
            except ValueError:
                pass  # a hand-edited link with a bad number: ignore that part
        st.session_state["_url"] = state
    return state


def get(name: str, default: Any = None) -> Any:
    return url().get(name, DEFAULTS.get(name, default))


def put(name: str, value: Any) -> None:
    url()[name] = value


def _keep(name: str, key: str) -> None:
    url()[name] = st.session_state[key]


def widget(
    name: str,
    key: str,
    draw: Callable[..., Any],
    *args: Any,
    options: Sequence | None = None,
    **kw: Any,
) -> Any:
    """Draw a widget whose value is shareable: seeded from the URL state, written back after.

    Always seeded: a widget drawn by a page script is a new widget on another page (Streamlit
    keeps its key but not its value), and a user's change reaches the state first (on_change)."""
    saved = url().get(name, DEFAULTS.get(name))
    if saved is not None and (options is None or saved in options):
        st.session_state[key] = saved
    kw = {"on_change": _keep, "args": (name, key), **kw}
    value = (
        draw(*args, options, key=key, **kw) if options is not None else draw(*args, key=key, **kw)
    )
    url()[name] = value
    return value


def query() -> str:
    """The query string of the state (defaults left out, so links stay short)."""
    state = {
        k: v for k, v in url().items() if k in PARAMS and v is not None and DEFAULTS.get(k) != v
    }
    params = {k: ("1" if v is True else str(v)) for k, v in state.items() if v is not False}
    return urlencode(params)


def write_url() -> None:
    """Put the state in the browser's address bar. The page's keys component writes it there
    (``history.replaceState``): Streamlit's own ``st.query_params`` written during the first run
    after a page switch left that page's widgets undrawn (Streamlit 1.67), and the browser sends
    its query string with every rerun, so the server reads it back as ``st.query_params``."""
    from app import browser_view, presenter_session

    browser_view.keys(url().get("_words", {}), query(), presenter_session.cookie())


def recording_title(name: str) -> str:
    return f"{name[:2]} · {name[3:].replace('-', ' ')}" if name[:2].isdigit() else name


@st.cache_data(show_spinner=False, max_entries=32)
def _load_cached(path: str, mtime: float) -> recording.Recording:
    return recording.load(Path(path))


UPLOAD_MAX_BYTES = 16 << 20  # an upload: ~15,000 steps, more than a class produces in an hour


def _parse_upload(data: bytes) -> recording.Recording:
    """An uploaded recording, parsed once per session and kept for that session alone (one file:
    a session that opens another forgets the first), never in a cache the whole page shares."""
    if len(data) > UPLOAD_MAX_BYTES:
        raise recording.BadRecording(
            f"the file has {len(data) >> 20} MB; an upload holds at most "
            f"{UPLOAD_MAX_BYTES >> 20} MB"
        )
    digest = hashlib.sha256(data).hexdigest()
    kept = st.session_state.get("_upload")
    if kept is None or kept[0] != digest:
        kept = (digest, recording.parse(data, source="upload"))
        st.session_state["_upload"] = kept
    return kept[1]


def choose_recording(w: dict[str, str], uploads: bool = True) -> recording.Recording | None:
    """Sidebar: a lesson's recording or (``uploads``) an uploaded file; a bad file gets its
    message, not a crash."""
    recs = recording.lesson_recordings()
    options = [*recs, "upload"] if uploads else list(recs)
    if not options:
        return None
    if url().get("rec") not in options and url().get("lesson") in recs:
        put("rec", url()["lesson"])
    name = widget(
        "rec",
        "rec",
        st.selectbox,
        w["recording"],
        options=options,
        format_func=lambda n: w["upload"] if n == "upload" else recording_title(n),
    )
    try:
        if name == "upload":
            file = st.file_uploader(
                w["upload"], type=["jsonl", "json", "txt"], key="rec_file", help=w["upload_help"]
            )
            return _parse_upload(file.getvalue()) if file is not None else None
        path = recs[name]
        return _load_cached(str(path), path.stat().st_mtime)
    except recording.BadRecording as exc:
        st.error(w["bad_recording"].format(message=exc.message), icon=":material/error:")
        return None


def choose_run(rec: recording.Recording, w: dict[str, str]) -> recording.Run:
    runs = list(rec.runs)
    if len(runs) == 1:
        return rec.runs[runs[0]]
    name = widget(
        "run",
        "run",
        st.selectbox,
        w["run"],
        options=runs,
        format_func=lambda k: f"{k.upper()}: {rec.runs[k].label}",
    )
    return rec.runs[name]
