"""What the launcher says of the presenter token matches where the page listens (the teacher's
walkthrough, friction 11: "reachable beyond this machine" printed while bound to 127.0.0.1)."""

from __future__ import annotations

import pytest

from engine.lab.launcher import LOOPBACK, token_line


@pytest.mark.parametrize("host", LOOPBACK)
def test_a_loopback_lab_says_this_machine_only(host):
    line = token_line(host, "t0k")
    assert "this machine only" in line and "beyond" not in line and line.endswith("t0k")


def test_a_classroom_lab_says_beyond_this_machine():
    line = token_line("0.0.0.0", "t0k")
    assert "beyond this machine (0.0.0.0)" in line and line.endswith("t0k")
