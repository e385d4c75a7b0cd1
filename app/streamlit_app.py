"""Fluxo lab page: the entry only routes (``streamlit run app/streamlit_app.py``)."""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `streamlit run` puts app/ on the path; pages import app.* and engine.*
    sys.path.insert(0, str(ROOT))

import streamlit as st  # noqa: E402

st.set_page_config(page_title="Fluxo lab", page_icon=":material/waves:", layout="wide")
# Not "pages/": Streamlit would also auto-discover that folder as a legacy multipage app, and a
# direct link such as /lessons would open the page outside this entry (no wide layout, odd menu).
HERE = Path(__file__).parent / "views"
st.navigation([
    st.Page(HERE / "live.py", title="Live", icon=":material/sensors:", default=True),
    st.Page(HERE / "step.py", title="Step by step", icon=":material/footprint:"),
    st.Page(HERE / "compare.py", title="Compare", icon=":material/compare:"),
    st.Page(HERE / "lessons.py", title="Lessons", icon=":material/school:"),
]).run()
