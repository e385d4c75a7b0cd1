"""``engine.serve --policy-file``: a real server process on the tiny model loads the example
policies at start, lists them in its state beside the built-ins, switches to one live on a
presenter's ``control`` and keeps serving; a bad file stops the start with a coded line; the lab
launcher passes the flag through."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

from server_client import open_client

from engine.core import cpu
from engine.lab import launcher
from tests.servers import ROOT, start_engine, stop

EXAMPLES = ROOT / "examples" / "policies"


def test_a_loaded_policy_switches_live(tmp_path):
    files = ("--policy-file", str(EXAMPLES / "fair_share.py"))
    files += ("--policy-file", str(EXAMPLES / "shortest_prompt_first.py"))
    proc, url = start_engine(tmp_path, "--no-calibrate", *files)
    try:

        async def main():
            c = await open_client(url)
            await c.send({"type": "control", "policy": "fair-share", "max_slots": 2})
            st = await c.until(
                lambda m: m["type"] == "state" and m["config"]["policy"] != "continuous"
            )
            assert st["config"]["policy"] == "fair-share"
            assert st["policies"] == [
                "static",
                "continuous",
                "chunked",
                "fair-share",
                "shortest-first",
            ]
            clients = [await open_client(url) for _ in range(4)]
            answers = await asyncio.gather(
                *(k.chat(f"hello {i}", 6) for i, k in enumerate(clients))
            )
            assert [done["status"] for _, _, done, _ in answers] == ["finished"] * 4
            await c.send({"type": "control", "policy": "nobody"})
            err = await c.until(lambda m: m["type"] == "error")
            assert err["code"] == "unknown_mode" and "shortest-first" in err["message"]

        asyncio.run(main())
    finally:
        stop(proc)
    assert (
        "policies loaded from files: fair-share, shortest-first"
        in next(tmp_path.glob("*.log")).read_text()
    )


def test_a_bad_policy_file_stops_the_start(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("x = 1\n")
    run = subprocess.run(
        [sys.executable, "-m", "engine.serve", "--model", "tiny", "--policy-file", str(bad)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode != 0
    assert "error [invalid_policy]" in run.stderr and "no subclass" in run.stderr


def test_the_launcher_passes_policy_files_to_the_engine(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = launcher.parse_args(
        ["--policy-file", "mine.py", "--policy-file", str(EXAMPLES / "fair_share.py")]
    )
    split = cpu.Split(engine_cpus=(), page_cpus=(), engine_threads=1, pinned=False)
    engine_cmd, _ = launcher.commands(args, split, None)
    paths = [engine_cmd[i + 1] for i, a in enumerate(engine_cmd) if a == "--policy-file"]
    assert paths == [str(tmp_path / "mine.py"), str(EXAMPLES / "fair_share.py")]
    assert Path(paths[0]).is_absolute()
