"""The observer on the real vLLM (issue 38, item 7): start vLLM from .venv-vllm with the observer,
send 32 chats, and hold the records to vLLM's own answers and counters.

vLLM's own counters are its Prometheus page (a stable interface): ``vllm:generation_tokens_total``
and ``vllm:iteration_tokens_total`` (a histogram observed once per engine step that produced
output, in vLLM's front end). The records' ``step`` is vLLM's ``Scheduler.current_step``
(internal). Measured on the 2-core lab machine: see docs/observe.md. Skips where .venv-vllm is
absent or the platform has no vLLM wheel, with the install command.
"""

from __future__ import annotations

import json
import os
import platform
import re
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import zmq

from engine.observe import launch
from engine.observe.translate import Translator

pytestmark = [pytest.mark.slow, pytest.mark.model]  # a real vLLM serving SmolLM2
N, MAX_TOKENS = 32, 16
# Half the chats share a system prompt of ~330 tokens (over two 128-token blocks): prefix hits.
SHARED = "You are a patient teacher of the lab. " * 40

if (platform.system(), platform.machine()) != ("Linux", "x86_64"):
    pytest.skip(
        f"vLLM has no CPU wheel for {platform.system()} {platform.machine()}",
        allow_module_level=True,
    )
if not (launch.VENV / "bin" / "python").exists():
    pytest.skip(f"no {launch.VENV}: install it with {launch.INSTALL}", allow_module_level=True)


def chat(url: str, i: int) -> dict:
    messages = [{"role": "user", "content": f"Count to ten, then greet student {i}."}]
    if i % 2:
        messages.insert(0, {"role": "system", "content": SHARED})
    body = {"model": "smollm2", "messages": messages, "max_tokens": MAX_TOKENS}
    body |= {"temperature": 0, "ignore_eos": i % 4 != 0}  # a quarter may stop at EOS
    req = urllib.request.Request(
        url + "/v1/chat/completions",
        json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=600) as r:  # noqa: S310 - the local vLLM
        return json.loads(r.read())


def metric(text: str, name: str) -> float:
    return sum(float(v) for v in re.findall(rf"^{re.escape(name)}{{[^}}]*}} (\S+)$", text, re.M))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """vLLM started with the observer, 32 chats answered, every record received."""
    tmp = tmp_path_factory.mktemp("vllm")
    addr, port = f"tcp://127.0.0.1:{launch.free_port()}", launch.free_port()
    sock = zmq.Context.instance().socket(zmq.PULL)
    sock.bind(addr)
    raw: list[bytes] = []
    done = threading.Event()

    def pull() -> None:
        while not done.is_set():
            if sock.poll(100):
                raw.append(sock.recv())

    puller = threading.Thread(target=pull, daemon=True)
    puller.start()
    t0 = time.monotonic()
    proc = launch.start_vllm(port, addr, log_path=tmp / "vllm.log")
    try:
        url = f"http://127.0.0.1:{port}"
        launch.wait_ready(url, proc)
        started = time.monotonic() - t0
        with ThreadPoolExecutor(N) as pool:
            answers = list(pool.map(lambda i: chat(url, i), range(N)))
        time.sleep(1.0)  # the last step's record is on its way
        with urllib.request.urlopen(url + "/metrics", timeout=10) as r:  # noqa: S310
            metrics = r.read().decode()
    finally:
        launch.stop(proc)
        done.set()
        puller.join(5)
        sock.close(0)
    records = [json.loads(r) for r in raw]
    if os.environ.get("FLUXO_OBSERVE_CAPTURE"):  # refresh tests/observe/fixtures with this run
        Path(os.environ["FLUXO_OBSERVE_CAPTURE"]).write_bytes(b"\n".join(raw) + b"\n")
    completion = sum(a["usage"]["completion_tokens"] for a in answers)
    print(f"vLLM ready in {started:.0f} s; {len(records)} records, {completion} tokens")
    return {"answers": answers, "records": records, "metrics": metrics}


def test_every_request_ends_exactly_once(run):
    ended = [name for r in run["records"] for name in (*r["finished"], *r["aborted"])]
    assert len(ended) == len(set(ended)) == N
    translator = Translator(epoch=run["records"][0]["t"][0])
    requests = [req for r in run["records"] for req in translator.feed(r)[1]]
    assert sorted(q["id"] for q in requests) == list(range(1, N + 1))
    assert {q["status"] for q in requests} == {"finished"}


def test_decode_tokens_add_up_to_the_completion_tokens(run):
    completion = sum(a["usage"]["completion_tokens"] for a in run["answers"])
    translator = Translator(epoch=run["records"][0]["t"][0])
    steps, requests = [], []
    for r in run["records"]:
        step, ended = translator.feed(r)
        steps.append(step)
        requests += ended
    decode = sum(s["tokens"]["decode"] for s in steps)
    # each answer's first token comes from its prefill step, every other one from a decode row
    assert decode + N == completion
    assert sum(q["output_tokens"] for q in requests) == completion
    assert metric(run["metrics"], "vllm:generation_tokens_total") == completion


def test_step_count_matches_vllms_iteration_counter(run):
    records = run["records"]
    assert [r["step"] for r in records] == list(range(1, len(records) + 1))
    with_output = sum(1 for r in records if r["out"])
    assert with_output == metric(run["metrics"], "vllm:iteration_tokens_total_count")


def test_no_record_dropped(run):
    records = run["records"]
    assert [r["seq"] for r in records] == list(range(1, len(records) + 1))
    assert records[-1]["dropped"] == 0
    cached = sum(v["cached"] for r in records for v in r["new"].values())
    assert cached > 0  # the shared system prompt was found in the prefix cache
