"""A presenter session that lasts (issue 36): once a browser session has shown the presenter
token, it stays presenter across page changes, reloads and reconnects until it signs out or the
lab restarts.

Two things keep it, and neither is the token on the browser's side:

- **Page changes** (the sidebar's links, no reload): the token lives under a plain session key.
  The token box is a widget, and Streamlit forgets a widget's value when another page's script
  runs (the teacher's walkthrough: presenter -> viewer on every page change, box empty).
- **Reloads and reconnects** (a new Streamlit session): once the session is confirmed presenter,
  the page issues it a random session secret (32 bytes), keeps only the secret's SHA-256 and the
  token in this process's memory, and the keys component stores the secret as a session cookie
  (``SameSite=Strict``, no expiry: it goes when the browser closes). A new session's first run
  reads it back (``st.context.cookies``: the cookies of the page's websocket handshake). The token
  never reaches the browser, the URL or any storage a student could read; a secret is good for
  this page process only (a restarted lab forgets every one), for at most ``TTL_S``, and signing
  out revokes it and clears the cookie.
"""

from __future__ import annotations

import hashlib
import secrets
import time

import streamlit as st

COOKIE = "fluxo_presenter"  # and the page's port: cookies ignore ports, two labs on one host
KEY = "_presenter"  # session state: {"token": str, "secret": str | None}
CLEAR = "_presenter_clear"  # session state: the cookie is to be cleared (signed out, stale)
TTL_S = 12 * 3600  # a school day: a secret issued in the morning still holds in the evening
MAX_SECRETS = 64  # a lab has one presenter, maybe a few tabs and devices; the oldest go first


@st.cache_resource(show_spinner=False)
def _issued() -> dict[str, tuple[str, float]]:
    """SHA-256 of each live secret -> (the token it stands for, when it was issued)."""
    return {}


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def cookie_name() -> str:
    """This page's cookie (a browser sends a host's cookies to each of its ports)."""
    return f"{COOKIE}_{st.get_option('server.port')}"


def _from_cookie() -> dict | None:
    secret = st.context.cookies.get(cookie_name())
    if not isinstance(secret, str) or not secret:  # none (AppTest has no browser: no cookies)
        return None
    found = _issued().get(_digest(secret))
    if found is None or time.time() - found[1] > TTL_S:
        st.session_state[CLEAR] = True  # a secret of a previous lab, or an old one
        return None
    return {"token": found[0], "secret": secret}


def token() -> str | None:
    """The presenter token this browser session holds: typed on any page, or restored from its
    session secret on a reload."""
    held = st.session_state.get(KEY)
    if held is None and KEY not in st.session_state:
        held = st.session_state[KEY] = _from_cookie()
    return held["token"] if held else None


def typed(box_key: str) -> None:
    """The token box's ``on_change``: the session holds what was typed (an empty box: nothing)."""
    value = (st.session_state.get(box_key) or "").strip()
    _revoke()
    st.session_state[KEY] = {"token": value, "secret": None} if value else None


def confirm() -> None:
    """This session is presenter with its token: issue its session secret once."""
    held = st.session_state.get(KEY)
    if not held or held.get("secret"):
        return
    issued = _issued()
    now = time.time()
    for digest, (_, when) in list(issued.items()):
        if now - when > TTL_S:
            del issued[digest]
    while len(issued) >= MAX_SECRETS:
        del issued[min(issued, key=lambda d: issued[d][1])]
    secret = secrets.token_urlsafe(32)
    issued[_digest(secret)] = (held["token"], now)
    held["secret"] = secret
    st.session_state[CLEAR] = False


def _revoke() -> None:
    held = st.session_state.get(KEY)
    if held and held.get("secret"):
        _issued().pop(_digest(held["secret"]), None)
        st.session_state[CLEAR] = True


def sign_out() -> None:
    """Forget the token, revoke the session secret and clear the cookie (a button's callback)."""
    _revoke()
    st.session_state[KEY] = None
    st.session_state[CLEAR] = True


def reject() -> None:
    """The token held does not unlock the controls (a wrong one, or the lab's token changed)."""
    sign_out()


def cookie() -> dict | None:
    """What the keys component writes to this page's cookie this run: ``{"name", "value"}`` (the
    secret, or ``""`` to clear it), or None to leave it as it is."""
    held = st.session_state.get(KEY)
    if held and held.get("secret"):
        value = held["secret"]
    elif st.session_state.get(CLEAR):
        value = ""
    else:
        return None
    return {"name": cookie_name(), "value": value}
