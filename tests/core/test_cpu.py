"""Engine cores and threads: parsing, the lab's split of a machine, and pinning a real process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from engine.core import cpu
from engine.core.config import EngineConfig
from engine.core.errors import InvalidConfig


def test_parse_core_lists():
    assert cpu.parse("1") == (1,) and cpu.parse("0,2-3") == (0, 2, 3) and cpu.parse(" ") is None
    for bad in ("a", "1-", "-1", "2,x"):
        with pytest.raises(InvalidConfig):
            cpu.parse(bad)


def test_lab_split_leaves_cores_to_the_page():
    assert cpu.lab_split([0], pin=True) == cpu.Split((0,), 1, (), False)
    two = cpu.lab_split([0, 1], pin=True)
    assert (
        two.engine_cpus == (1,) and two.engine_threads == 1 and two.page_cpus == (0,) and two.pinned
    )
    eight = cpu.lab_split(list(range(8)), pin=False)
    assert (
        eight.engine_cpus == tuple(range(2, 8)) and eight.engine_threads == 6 and not eight.pinned
    )
    assert "page and browser" in two.describe()


def test_config_validates_threads_and_cpus():
    for bad in (
        dict(threads=0),
        dict(threads=True),
        dict(cpus=()),
        dict(cpus=(-1,)),
        dict(cpus=[1]),
    ):
        with pytest.raises(InvalidConfig):
            EngineConfig(model="tiny", **bad)


@pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity") or len(cpu.available()) < 2,
    reason="needs 2 cores and affinity",
)
def test_apply_pins_every_thread_and_sets_torch_threads():
    code = (
        "import json, os, threading, torch\n"
        "from engine.core import cpu\n"
        "threading.Thread(target=lambda: None).start()\n"
        "cpu.apply(None, (1,))\n"
        "t = threading.Thread(target=lambda: print(json.dumps(\n"
        "    [sorted(os.sched_getaffinity(0)), torch.get_num_threads()])))\n"
        "t.start(); t.join()\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))),
    )
    affinity, threads = json.loads(out.stdout.strip().splitlines()[-1])
    assert affinity == [1] and threads == 1
    with pytest.raises(InvalidConfig):
        cpu.pin_process((10_000,))
