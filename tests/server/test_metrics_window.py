"""A subscriber's own headline window (``subscribe``'s ``window_s``): the live checks read two
settings in short alternating windows on one server (engine/lab/live_steps.py), while the page's
other subscribers keep the server's window. A student may not ask for one: each window is one
more summary a second."""

from __future__ import annotations

import asyncio

from server_client import open_client, url
from student_client import student

from engine.server.connection import Limits


def test_each_subscriber_reads_its_own_window_and_a_student_may_not_choose(serve):
    server = serve("tiny", limits=Limits(metrics_window_s=30.0))

    async def main():
        short, page = await open_client(url(server)), await open_client(url(server))
        await short.send({"type": "subscribe", "history": 0, "window_s": 2})
        await page.send({"type": "subscribe", "history": 0})
        await short.chat("Say hi.", 8)

        def metrics(useful: bool):
            return lambda m: (
                m["type"] == "metrics" and bool(m["summary"]["useful_tokens"]) == useful
            )

        mine = await short.until(metrics(True), timeout=10)  # the chat, in the last 2 s
        theirs = await page.until(metrics(True), timeout=10)
        assert mine["window_s"] == 2 and theirs["window_s"] == 30
        # a few seconds on, the short window has forgotten the chat, the server's has not
        assert (await short.until(metrics(False), timeout=10))["window_s"] == 2
        await page.drain(0.2)
        assert (await page.until(lambda m: m["type"] == "metrics", timeout=10))["summary"][
            "useful_tokens"
        ]
        for bad in (0.5, 601, "ten"):  # out of its range: a coded error, nothing changed
            await short.send({"type": "subscribe", "history": 0, "window_s": bad})
            err = await short.until(lambda m: m["type"] == "error", timeout=10)
            assert err["code"] == "bad_field", err
        s = await student(url(server))
        await s.send({"type": "subscribe", "history": 0, "window_s": 2})
        err = await s.until(lambda m: m["type"] == "error", timeout=10)
        assert err["code"] == "forbidden" and "window_s" in err["message"], err
        await s.send({"type": "subscribe", "history": 0})  # without it: the server's window
        assert (await s.until(lambda m: m["type"] == "metrics", timeout=10))["window_s"] == 30

    asyncio.run(main())
