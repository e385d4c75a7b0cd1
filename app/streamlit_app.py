"""Fluxo lab page: the entry only routes (``streamlit run app/streamlit_app.py``)."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if (
    str(ROOT) not in sys.path
):  # `streamlit run` puts app/ on the path; pages import app.* and engine.*
    sys.path.insert(0, str(ROOT))

import streamlit as st  # noqa: E402

from app import i18n, state  # noqa: E402

# The theme (light: the charts are drawn for a white page), the viewer toolbar and the upload
# size are in app/.streamlit/config.toml, beside this script, which Streamlit reads however the
# page is started.
st.set_page_config(page_title="Fluxo lab", page_icon=":material/waves:", layout="wide")
if "lang" not in state.url():
    # a session's first run without ?lang=: the browser's own language (the switch stays)
    state.put("lang", i18n.from_locale(st.context.locale))
w = i18n.words(state.get("lang"))
if state.get("src") != "rec":  # an engine Fluxo only watches (engine/observe): say so on every page
    from app import observed, ui

    line = observed.banner(ui.client().state, state.get("lang"))
    if line:
        st.info(line, icon=":material/visibility:")
# Not "pages/": Streamlit would also auto-discover that folder as a legacy multipage app, and a
# direct link such as /lessons would open the page outside this entry (no wide layout, odd menu).
HERE = Path(__file__).parent / "views"
st.navigation(
    [
        st.Page(HERE / "live.py", title=w["live_title"], icon=":material/sensors:", default=True),
        st.Page(
            HERE / "step.py", title=w["step_title"], icon=":material/footprint:", url_path="step"
        ),
        st.Page(
            HERE / "compare.py", title=w["cmp_title"], icon=":material/compare:", url_path="compare"
        ),
        st.Page(
            HERE / "lessons.py",
            title=w["lessons_title"],
            icon=":material/school:",
            url_path="lessons",
        ),
    ]
).run()
