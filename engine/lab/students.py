"""A class of students answering a lesson's prediction, spoken in Streamlit's own protocol.

A class of 40-60 students opens the Lessons page on their own laptops and answers the lesson's
prediction (app/predict_view.py) while the engine serves traffic. Their browsers are elsewhere;
their sessions are not: every one runs in the teacher's page process, which reruns the question's
fragment every 2 s per student (``st.fragment(run_every=2.0)``). ``python -m engine.bench page``
uses this to measure what that costs the engine (its ``quiet`` / ``class`` phases), and what a
student waits.

Each simulated student is one Streamlit session spoken to in Streamlit's own protocol (the
``/_stcore/stream`` websocket, ``BackMsg`` and ``ForwardMsg`` protobufs), doing what the browser
does: open the page (a full script run), send an answer (the number input's value and the send
button's trigger, as widget states), then rerun the fragments the server asks for
(``auto_rerun``) at their interval. Nothing is simulated on the page's side: its script runs for
each of them as for a browser. The client runs on the page's cores (the bench pins itself there):
its own protobuf parsing lands on the page's core, so the waits it reports are a pessimistic bound.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

LESSON = "01-why-batches"  # its question: tokens/s at 8 slots over 1


@dataclass
class Student:
    """One session of the Lessons page, as one browser holds it."""

    url: str  # the page's http://host:port
    query: str  # the page's query string (lang, lesson)
    rng: random.Random
    page: str = "lessons"  # the page's url path ("": the navigation's default, Live)
    ws: Any = None
    widgets: dict[str, Any] = field(default_factory=dict)  # key fragment -> element
    texts: list[str] = field(default_factory=list)  # markdown of the last run
    fragments: dict[str, float] = field(default_factory=dict)  # fragment id -> interval (s)
    waits: dict[str, list[float]] = field(default_factory=dict)  # what -> seconds

    async def open(self) -> None:
        from websockets.asyncio.client import connect

        stream = self.url.replace("http", "ws", 1) + "/_stcore/stream"
        self.ws = await connect(
            stream, subprotocols=["streamlit"], origin=self.url, max_size=None, open_timeout=60
        )
        await self.rerun("open")

    async def rerun(
        self, what: str, states: list | None = None, fragment: str = "", auto: bool = False
    ) -> None:
        """One script run (a fragment's, where ``fragment``) with these widget states, as the
        browser sends it; waits for its end and keeps how long that took under ``what``."""
        from streamlit.proto.BackMsg_pb2 import BackMsg

        msg = BackMsg()
        cs = msg.rerun_script
        cs.query_string, cs.page_name = self.query, self.page
        cs.fragment_id, cs.is_auto_rerun = fragment, auto
        cs.widget_states.widgets.extend(states or [])
        t0 = time.monotonic()
        if not fragment:
            self.texts.clear()
        await self.ws.send(msg.SerializeToString())
        await self._until_finished()
        self.waits.setdefault(what, []).append(time.monotonic() - t0)

    async def _until_finished(self) -> None:
        from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

        while True:
            fwd = ForwardMsg()
            fwd.ParseFromString(await asyncio.wait_for(self.ws.recv(), 120))
            kind = fwd.WhichOneof("type")
            if kind == "delta" and fwd.delta.WhichOneof("type") == "new_element":
                self._keep(fwd.delta.new_element, fwd.delta.fragment_id)
            elif kind == "auto_rerun":
                self.fragments[fwd.auto_rerun.fragment_id] = fwd.auto_rerun.interval
            elif kind == "script_finished" and fwd.script_finished != fwd.FINISHED_EARLY_FOR_RERUN:
                return  # (a run ended early for a rerun: the rerun's end is the one awaited)

    def _keep(self, element: Any, fragment: str) -> None:
        kind = element.WhichOneof("type")
        if kind == "markdown":
            self.texts.append(element.markdown.body)
        elif kind == "exception":  # the page raised: said in the failure, not lost
            self.texts.append(f"exception: {element.exception.message}")
        elif kind in ("number_input", "button"):
            widget = getattr(element, kind)
            self.widgets[f"{kind}:{widget.id}"] = (widget, fragment)

    def _widget(self, kind: str, *parts: str) -> tuple[Any, str]:
        """The widget whose id holds ``parts`` (its key), and the fragment it was drawn in."""
        for key, (w, fragment) in self.widgets.items():
            if key.startswith(kind) and all(p in w.id for p in parts):
                return w, fragment
        said = [t for t in self.texts if t.startswith("exception")] or self.texts[-3:]
        raise RuntimeError(f"no {kind} {parts} on the page (did the question render?) {said}")

    async def answer(self) -> float:
        """The student's answer: a value in the question's range, and the send button (a rerun
        of the fragment that holds them, as the browser sends a click inside a fragment)."""
        from streamlit.proto.WidgetStates_pb2 import WidgetState

        (box, fragment), (send, _) = (
            self._widget("number_input", "pred_"),
            self._widget("button", "pred_", "_send"),
        )
        value = round(self.rng.uniform(box.min, box.max), 2)
        states = [WidgetState(id=box.id, double_value=value), WidgetState(id=send.id)]
        states[1].trigger_value = True
        self.texts.clear()
        await self.rerun("answer", states, fragment=fragment)
        return value

    async def follow(self, until: float) -> None:
        """The fragments' auto-reruns at their interval, as the browser's timer sends them."""
        every = min(self.fragments.values(), default=2.0)
        while time.monotonic() + every < until:
            await asyncio.sleep(every * self.rng.uniform(0.9, 1.1))
            for fragment in list(self.fragments):
                await self.rerun("fragment", fragment=fragment, auto=True)

    async def close(self) -> None:
        if self.ws is not None:
            await self.ws.close()


async def class_window(url: str, query: str, n: int, seconds: float, seed: int) -> dict:
    """``n`` students open the page at once, answer, follow their fragments, then leave."""
    until = time.monotonic() + seconds
    students = [Student(url, query, random.Random(seed + i)) for i in range(n)]

    failed: list[str] = []

    async def one(s: Student) -> bool:
        try:
            await s.open()
            value = await s.answer()
            shown = f"{value:.2f}".replace(".", ",") if "pt-BR" in query else f"{value:.2f}"
            seen = any(shown in t for t in s.texts)  # "sent: 2.50x" on the student's own page
            await s.follow(until)
            return seen
        except (RuntimeError, OSError, TimeoutError) as exc:  # counted and said, not raised:
            failed.append(f"{type(exc).__name__}: {exc}")  # one student's failure is a result
            return False
        finally:
            await s.close()

    acked = await asyncio.gather(*(one(s) for s in students))
    waits: dict[str, list[float]] = {}
    for s in students:
        for what, w in s.waits.items():
            waits.setdefault(what, []).extend(w)
    return {
        "students": n,
        "answers_shown": sum(acked),
        "failed": len(failed),
        "first_failure": failed[0][:300] if failed else None,
        **{f"{k}_p50_s": statistics.median(v) for k, v in waits.items() if v},
        **{f"{k}_max_s": max(v) for k, v in waits.items() if v},
        "fragment_reruns": len(waits.get("fragment", [])),
    }
