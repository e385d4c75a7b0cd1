"""The size rule of issue 11: no tracked .py or .js file over 350 lines, and no Python function
(tests included) over 50 lines, so every part of Fluxo reads in one sitting.

A function's size is its ``def`` line to its last line (decorators not counted), as ``ast`` gives
it; nested functions count on their own and inside the function holding them. The failure names
every file and function over, with its size.
"""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_FILE_LINES = 350
MAX_FUNCTION_LINES = 50
# Third-party code kept as shipped (ruff excludes the same folder): not ours to split.
VENDORED = ("app/component/vendor/",)
# Cohesive units that stand whole, each with its reason (issue 27: the size rule serves concepts):
# "path" (a file) or "path:function" -> why. An entry that no longer needs its exception fails.
ALLOWED: dict[str, str] = {
    "app/ui.py": "what every page shares: roles, the sidebar, mode toggles and exports",
    "engine/core/engine.py": "the engine's thread-safe face and its whole step recipe: the sync "
    "and async loops beside the stages they run, with no callback interface (issue 39 item 3)",
    "kernels/cpu_quant.py": "the kernels' Python face: one function per C entry point, each "
    "with its shape checks, beside the older builds' decode step that A/B timings still call",
    "app/views/step.py:engine_controls": "the presenter's pause / step / resume row",
    "engine/server/server.py": "the websocket server: connections, roles, origins and limits "
    "meet at the handshake, and the engine-thread hand-off lives beside them",
    "engine/server/openai_shapes.py": "every OpenAI body field, its checks and its error shape",
    "engine/server/http_api.py": "the HTTP/1.1 loop, its dispatch and its per-address limits",
    "engine/server/http_api.py:_connection": "one connection's whole life: deadline, limits, close",
    "engine/server/http_api.py:_dispatch": "one table of routes, methods and their answers",
    "tests/server/test_hostile.py": "one probe per finding of the classroom security review",
    "tests/server/test_http_errors.py": "every HTTP error code, one request each",
    "tests/server/test_hostile.py:"
    "test_a_page_of_another_origin_or_host_is_refused_and_the_lab_page_presents": "the H1 probe "
    "and its counter-probes, in the order the review ran them",
    "tests/e2e/test_hostile_page.py:test_a_window_of_another_origin_cannot_drive_the_view": "one "
    "browser scene: an attacker window, the page's own message, and what the view did",
}


def tracked() -> list[str]:
    """The repository's .py and .js files, as git tracks them (vendored code aside)."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the tracked files are unknown")
    out = subprocess.run(
        ["git", "ls-files", "-z", "--", "*.py", "*.js"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [f for f in out.split("\0") if f and not f.startswith(VENDORED) and (ROOT / f).exists()]


def long_functions(source: str) -> list[tuple[str, int, int]]:
    """``(name, first line, lines)`` of every function of ``source`` over the limit."""
    return [
        (node.name, node.lineno, node.end_lineno - node.lineno + 1)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]


def _check(over: list[tuple[str, str]], what: str) -> None:
    """``over``: (allow-list key, description) of everything over the limit."""
    kind = [k for k in ALLOWED if (":" in k) == (what == "function")]
    stale = [k for k in kind if k not in {key for key, _ in over}]
    assert not stale, f"allowed but no longer over the {what} limit: {stale}"
    bad = [text for key, text in over if key not in ALLOWED]
    assert not bad, f"{len(bad)} {what}(s) over the limit:\n" + "\n".join(bad)


def test_no_file_over_350_lines() -> None:
    over = []
    for f in tracked():
        n = len((ROOT / f).read_bytes().splitlines())
        if n > MAX_FILE_LINES:
            over.append((f, f"{f}: {n} lines (limit {MAX_FILE_LINES})"))
    _check(over, "file")


def test_no_function_over_50_lines() -> None:
    over = []
    for f in tracked():
        if f.endswith(".py"):
            for name, line, n in long_functions((ROOT / f).read_text()):
                text = f"{f}:{line} {name}: {n} lines (limit {MAX_FUNCTION_LINES})"
                over.append((f"{f}:{name}", text))
    _check(over, "function")


def test_the_measure_counts_from_def_to_last_line() -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES - 1))
    fits = f"@decorator\ndef fits():\n{body}"  # def + 49 lines: exactly the limit
    over = f"async def over():\n{body}    return 1\n"
    assert long_functions(fits) == []
    assert long_functions(over) == [("over", 1, MAX_FUNCTION_LINES + 1)]
    inner = "".join(f"        x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    nested = f"def outer():\n    def inner():\n{inner}"  # inner: 51 lines, outer: 52
    assert [(name, n) for name, _, n in long_functions(nested)] == [("outer", 52), ("inner", 51)]
