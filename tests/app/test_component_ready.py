"""The browser views tell Streamlit they are ready from their last script, and only there.

Streamlit sends a component's arguments once it says ``streamlit:componentReady``. Scripts load one
after another, and a message can be handled between two of them, so a ready sent by an earlier
script lets the first arguments reach a view whose later scripts have not run: the replay view
took the recording's key before ``FluxoPlayer`` existed and stayed empty at step 0 (the projector
test failed about one run in two that way).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

COMPONENT = Path(__file__).resolve().parents[2] / "app" / "component"
READY = "streamlit:componentReady"


def _scripts(index: Path) -> list[Path]:
    """The view's own scripts in the order index.html loads them (not the vendored Vega)."""
    names = re.findall(r'<script src="([^"]+)"></script>', index.read_text())
    return [index.parent / n for n in names if not n.startswith("vendor/")]


@pytest.mark.parametrize("index", [COMPONENT / "index.html", COMPONENT / "keys" / "index.html"])
def test_ready_is_posted_by_the_last_script_only(index):
    scripts = _scripts(index)
    assert scripts, f"{index} loads no script of its own"
    posting = [s.name for s in scripts if READY in s.read_text()]
    assert posting == [scripts[-1].name], (
        f"{index.relative_to(COMPONENT.parent)}: {READY} is posted by {posting}; "
        f"only the last script ({scripts[-1].name}) may post it"
    )
    last = scripts[-1].read_text()
    # and after everything else the last script sets up
    assert last.rindex(READY) > last.rindex("addEventListener")
