"""The page against hostile data and hostile windows, in Chromium (no engine: the offline page):
a recording with HTML and markdown in every string field shows as text, a recording with HTML in a
typed field is refused with its reason, and a window of another origin that opened the lab cannot
hand the browser view arguments (its postMessage is ignored, the same message from the page
itself is obeyed). A script that runs sets ``top.__pwned``; none may."""

from __future__ import annotations

import http.server
import json
import threading
from pathlib import Path

import pytest
from servers import free_port

from app import recording

from .browsing import VIEW, view, wait

XSS = '<img src=x onerror="top.__pwned=(top.__pwned||0)+1">'
MD = "![beacon](http://127.0.0.1:9/b.png) **bold** [link](http://127.0.0.1:9/)"
LESSON = Path(recording.lesson_recordings()["02-oven-vs-flow"])


def hostile_recording(tmp: Path, typed_field: bool = False) -> Path:
    """The lesson's recording with every string field a reader may show turned into HTML and
    markdown (``typed_field``: one number turned into HTML, which must be refused)."""
    out = []
    for line in LESSON.read_text().splitlines():
        rec = json.loads(line)
        if rec["type"] == "recording":
            for k in ("lesson", "title_en", "title_pt", "model", "device", "when", "workload"):
                rec[k] = f"{XSS} {MD}"
        elif rec["type"] == "run":
            rec["label"] = f"{XSS} {MD}"
            rec["config"] = {**rec["config"], "note": XSS[:60]}
        elif rec["type"] == "request":
            rec["status"], rec["error"] = "failed", f"{XSS} {MD}"
        elif rec["type"] == "step":
            rec["events"] = [{"kind": XSS[:60], "changes": {"policy": XSS[:60]}}]
            rec["extra"] = XSS  # a field of no contract: dropped
            if typed_field:
                rec["queue_len"] = XSS
        out.append(json.dumps(rec))
    path = tmp / ("typed.jsonl" if typed_field else "strings.jsonl")
    path.write_text("\n".join(out) + "\n")
    return path


def test_recording_fields_are_checked_one_by_one(tmp_path):
    with pytest.raises(recording.BadRecording, match="queue_len must be an integer"):
        recording.parse(hostile_recording(tmp_path, typed_field=True).read_bytes())
    rec = recording.parse(hostile_recording(tmp_path).read_bytes())
    step = rec.run().steps[0]
    assert "extra" not in step and step["events"][0]["kind"] == XSS[:60]
    for bad in (
        {"policy": XSS},
        {"runner": "fast"},
        {"slots": [{"slot": 0, "request": "x", "phase": "decode", "tokens": 1}]},
        {"t_end": float("inf")},
    ):
        lines = LESSON.read_text().splitlines()
        first = next(i for i, ln in enumerate(lines) if '"type":"step"' in ln.replace(" ", ""))
        lines[first] = json.dumps({**json.loads(lines[first]), **bad})
        with pytest.raises(recording.BadRecording):
            recording.parse("\n".join(lines) + "\n")


def _upload(page, offline: str, path: Path):
    from playwright.sync_api import expect

    page.goto(f"{offline}/?src=rec&rec=upload")
    page.locator("input[type=file]").set_input_files(str(path))
    return expect


def test_a_recording_with_html_in_every_string_shows_as_text(offline, browser, tmp_path):
    page = browser.new_page(viewport={"width": 1500, "height": 1600})
    page.set_default_timeout(60_000)
    expect = _upload(page, offline, hostile_recording(tmp_path))
    frame = view(page)
    frame.wait_for_function("() => fluxo.mode === 'replay' && fluxo.all.length > 50")
    # the run's label reaches the view's status line as text
    expect(frame.locator("#fluxo-status-text")).to_contain_text("<img src=x", timeout=60_000)
    expect(page.get_by_text("<img src=x", exact=False).first).to_be_visible()
    for target in ("step", "compare"):
        page.goto(f"{offline}/{target}?src=rec&rec=upload")
        page.locator("input[type=file]").set_input_files(str(hostile_recording(tmp_path)))
        page.wait_for_timeout(3000)
    page.wait_for_timeout(1500)
    assert page.evaluate("() => top.__pwned") is None
    assert (
        page.evaluate(
            "() => [...document.querySelectorAll('img')].filter(i => /b\\.png|^x$/.test("
            "i.getAttribute('src') || '')).length"
        )
        == 0
    )
    page.close()


def test_a_recording_with_html_in_a_number_is_refused_with_its_reason(offline, browser, tmp_path):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.set_default_timeout(60_000)
    expect = _upload(page, offline, hostile_recording(tmp_path, typed_field=True))
    expect(page.get_by_text("queue_len must be an integer", exact=False)).to_be_visible()
    assert page.evaluate("() => top.__pwned") is None
    page.close()


ATTACKER = """<!doctype html><html><body><script>
const lab = window.open(%(lab)s);
const msg = {isStreamlitMessage: true, type: "streamlit:render", args: %(args)s};
window.shots = 0;
setInterval(() => {
  try { for (let i = 0; i < lab.frames.length; i++) { lab.frames[i].postMessage(msg, "*"); } }
  catch (e) {}
  window.shots++;
}, 200);
</script></body></html>"""


def _render_args(marker: str) -> dict:
    step = {
        "step": XSS,
        "queue_len": XSS,
        "policy": XSS,
        "runner": XSS,
        "t_start": 0,
        "t_end": 1,
        "slots": [],
        "spans": [],
        "kv": {"blocks_total": 1},
        "tokens": {},
        "admitted": [],
        "finished": [],
        "preempted": [],
        "events": [],
    }
    return {"mode": "static", "data_key": marker, "steps": [step], "caption": marker}


def test_a_window_of_another_origin_cannot_drive_the_view(offline, browser):
    args = _render_args("FROM-ELSEWHERE")
    html = ATTACKER % {
        "lab": json.dumps(f"{offline}/?src=rec&rec=02-oven-vs-flow"),
        "args": json.dumps(args),
    }

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the stdlib's name
            body = html.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    port = free_port()
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", port), Page)  # another origin: port
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    ctx = browser.new_context(viewport={"width": 1400, "height": 1200})
    try:
        attacker = ctx.new_page()
        with ctx.expect_page(timeout=60_000) as opened:
            attacker.goto(f"http://127.0.0.1:{port}/")
        lab = opened.value
        lab.set_default_timeout(60_000)
        frame = view(lab)
        frame.wait_for_function("() => fluxo.mode === 'replay' && fluxo.all.length > 50")
        # What the view took: its own listener runs first, this one (added later) after it.
        frame.evaluate(
            "() => { window.__took = []; window.addEventListener('message', () =>"
            " __took.push(fluxo.args && fluxo.args.caption)); }"
        )
        # >= 3 s of posting from now: the attacker posts from the moment the lab opened, and on a
        # loaded machine it had posted more than 15 before the listener above was in place
        since = attacker.evaluate("() => window.shots")
        wait(lambda: attacker.evaluate("() => window.shots") > since + 15, 60)
        took = frame.evaluate("() => __took")
        assert took and "FROM-ELSEWHERE" not in took, took[-3:]
        assert lab.evaluate("() => top.__pwned") is None
        # The same message from the page that holds the view is taken (Streamlit's next render
        # replaces it at once: the page renders the view again many times a second).
        lab.evaluate(
            f"""() => {{
              const f = document.querySelector("{VIEW}");
              f.contentWindow.postMessage({{isStreamlitMessage: true, type: "streamlit:render",
                args: Object.assign({{}}, f.contentWindow.fluxo.args,
                                     {json.dumps(_render_args("FROM-THE-PAGE"))})}},
                location.origin);
            }}"""
        )
        frame.wait_for_function("() => __took.includes('FROM-THE-PAGE')")
        # Whatever reaches the view's step line shows as text.
        crafted = json.dumps(_render_args("x")["steps"][0])
        frame.evaluate(f"() => {{ fluxo.buffer = [{crafted}]; fluxo.dirty = true; }}")
        frame.wait_for_function(
            "() => document.getElementById('fluxo-last-step').textContent.includes('<img src=x')"
        )
        lab.wait_for_timeout(1000)
        assert frame.evaluate("() => document.querySelectorAll('#fluxo-last-step img').length") == 0
        assert lab.evaluate("() => top.__pwned") is None
    finally:
        ctx.close()
        httpd.shutdown()


def test_on_a_shared_page_exports_and_uploads_are_the_presenters(tmp_path, monkeypatch):
    """The page listening beyond loopback (here only said so: AppTest runs the scripts in this
    process) with no FLUXO_TOKEN has no presenter: nobody's session may ask the engine for an
    export or hand the page process a file. On loopback the same page offers both."""
    from servers import start_engine, stop
    from streamlit import config as st_config
    from streamlit.testing.v1 import AppTest

    app = Path(__file__).resolve().parents[2] / "app" / "views"
    engine, url = start_engine(tmp_path, "--no-calibrate")
    monkeypatch.setenv("FLUXO_ENGINE_URL", url)
    monkeypatch.delenv("FLUXO_TOKEN", raising=False)
    before = st_config.get_option("server.address")
    try:
        seen = {}
        for address in ("127.0.0.1", "0.0.0.0"):
            st_config.set_option("server.address", address)
            live = AppTest.from_file(str(app / "live.py"), default_timeout=60).run()
            assert not live.exception, [e.value for e in live.exception]
            rec = AppTest.from_file(str(app / "live.py"), default_timeout=60)
            rec.query_params.update({"src": "rec"})
            rec.run()
            assert not rec.exception, [e.value for e in rec.exception]
            seen[address] = (
                live.button(key="live_prep").disabled,
                any("Open a recording" in o for o in rec.selectbox(key="rec").options),
            )
        assert seen == {"127.0.0.1": (False, True), "0.0.0.0": (True, False)}, seen
    finally:
        st_config.set_option("server.address", before)
        stop(engine)
