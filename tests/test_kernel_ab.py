"""``python -m engine.bench kernels`` (engine/lab/kernel_ab.py): a git revision's CPU kernels read
back as the translation unit the working tree compiles, a bad revision refused clearly, and the two
builds timed in turn on SmolLM2's q4 decode step."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from engine.lab import bench, kernel_ab
from kernels import cpu_quant, cpu_quant_build

ROOT = cpu_quant_build.HERE.parent


def _git_checkout() -> bool:
    if shutil.which("git") is None:
        return False
    proc = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--is-inside-work-tree"],
        capture_output=True,
        text=True,
    )
    return proc.returncode == 0 and proc.stdout.strip() == "true"


pytestmark = pytest.mark.skipif(not _git_checkout(), reason="not a git checkout of Fluxo")


def test_head_source_is_the_tree_source_when_the_kernels_are_committed() -> None:
    names = [f"kernels/{n}" for n in cpu_quant_build.NAMES]
    dirty = subprocess.run(
        ["git", "-C", str(ROOT), "diff", "--quiet", "HEAD", "--", *names]
    ).returncode
    same = kernel_ab.source_at("HEAD") == cpu_quant_build.tree_source()
    assert same is (dirty == 0)


def test_a_revision_git_cannot_read_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="cannot read kernels/cpu_quant.cpp at 'no-such-rev'"):
        kernel_ab.source_at("no-such-rev")


@pytest.mark.skipif(not cpu_quant.available(), reason="the quantized CPU kernels cannot build here")
def test_the_command_refuses_a_bad_revision_with_a_clear_error(monkeypatch) -> None:
    monkeypatch.setattr(bench, "load_model", lambda *a: (None, None))  # no model needed to refuse
    with pytest.raises(SystemExit, match="error: cannot read kernels/cpu_quant.cpp at 'no-such'"):
        bench.main(["kernels", "--against", "no-such"])


@pytest.mark.skipif(not cpu_quant.available(), reason="the quantized CPU kernels cannot build here")
def test_two_builds_in_turn_on_the_q4_decode_step_and_a_prompt(smollm2, monkeypatch) -> None:
    # The base: HEAD's kernels with a comment added, so it is a library of its own (another file,
    # the same machine code) and the swap between two loaded builds really happens.
    head = kernel_ab.source_at("HEAD")
    source = head + "\n// timed against itself\n"
    monkeypatch.setattr(kernel_ab, "source_at", lambda rev: source)
    assert cpu_quant_build.load(source, strict=False)._name != cpu_quant.library()._name
    result = kernel_ab.compare(smollm2[0], "HEAD", rows=(1, 3), pairs=4, prompts=(37,))
    assert [p["rows"] for p in result["points"]] == [1, 3, 37]
    for p in result["points"]:
        assert p["base_ms"] > 0 and p["tree_ms"] > 0
        assert p["ratio_p25"] <= p["ratio_median"] <= p["ratio_p75"]
        if head == cpu_quant_build.tree_source():  # the same kernels: the same logits, bit for bit
            assert p["identical"]
    assert set(result["ratios"]) == {
        "tree_over_base_step_1_rows",
        "tree_over_base_step_3_rows",
        "tree_over_base_prefill_37_rows",
    }
    assert "tree/base" in kernel_ab.table(result)
