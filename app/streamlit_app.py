"""Fluxo lab page: the entry only routes (``streamlit run app/streamlit_app.py``)."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if (
    str(ROOT) not in sys.path
):  # `streamlit run` puts app/ on the path; pages import app.* and engine.*
    sys.path.insert(0, str(ROOT))

import streamlit as st  # noqa: E402
from streamlit import config as st_config  # noqa: E402

from app import i18n  # noqa: E402

# A pinned light theme: the charts are drawn for a white page, and a presenter whose OS is in dark
# mode must not get grey labels on black. (The theme is sent with each session's first message,
# so `streamlit run --theme.base light`, as the tests and `make lab` start it, pins it from the
# first load; this pins it for a page started any other way from its next run.)
if st_config.get_option("theme.base") is None:
    st_config.set_option("theme.base", "light")
st.set_page_config(page_title="Fluxo lab", page_icon=":material/waves:", layout="wide")
lang = (st.session_state.get("_url") or {}).get("lang") or st.query_params.get("lang", "en")
w = i18n.words(lang)
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
