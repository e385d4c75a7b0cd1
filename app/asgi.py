"""The page as an ASGI app: Streamlit's own server for ``streamlit_app.py`` plus the engine's
websocket relayed on the page's origin (``app/relay.py``). ``make lab`` runs this file
(``streamlit run app/asgi.py``, which finds ``app`` below); the pages are the same."""

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `streamlit run` puts app/ on the path, not the project
    sys.path.insert(0, str(ROOT))

import streamlit as st  # noqa: E402
from starlette.routing import WebSocketRoute  # noqa: E402

from app.relay import PATH, relay  # noqa: E402

os.environ["FLUXO_RELAY_PATH"] = PATH  # the browser view offers the route (app/browser_view.py)

app = st.App(Path(__file__).with_name("streamlit_app.py"), routes=[WebSocketRoute(PATH, relay)])
