"""The simulated class of ``bench page`` (engine/lab/students.py) does what a browser does, and the
page answers it as it answers a browser: real processes (``engine.serve --model tiny`` and
``streamlit run app/asgi.py``), Streamlit's own websocket protocol, lesson 1's question."""

from __future__ import annotations

import asyncio
import random

import pytest
from servers import engine_and_page

from engine.lab import students


@pytest.fixture(scope="module")
def page_url(tmp_path_factory):
    with engine_and_page(tmp_path_factory.mktemp("students")) as (_, http_url):
        yield http_url


def test_a_class_answers_and_each_student_sees_their_own_answer(page_url):
    query = f"lang=en&lesson={students.LESSON}"
    out = asyncio.run(students.class_window(page_url, query, 3, 6.0, seed=7))
    assert out["students"] == 3 and out["answers_shown"] == 3
    # every student's fragment came back at the interval the page asked for (2 s): 6 s, 3 each
    assert out["fragment_reruns"] >= 3
    assert out["open_p50_s"] > 0 and out["answer_p50_s"] > 0


def test_the_class_count_reaches_another_session(page_url):
    """A later session (loopback, no token: a presenter) reads the class's answers: they went
    into the page's board, not only into each student's own reply."""
    query = f"lang=en&lesson={students.LESSON}"

    async def class_then_look() -> list[str]:
        await students.class_window(page_url, query, 2, 1.0, seed=11)
        s = students.Student(page_url, query, random.Random(0))
        await s.open()
        await s.close()
        return s.texts

    texts = asyncio.run(class_then_look())
    counts = [int(t.split()[0]) for t in texts if " answers · median " in t]
    assert counts and counts[0] >= 2, texts


def test_a_missing_question_is_said_not_guessed(page_url):
    """On a page without the question (the Live page has none), answering fails with its reason."""

    async def answer() -> None:
        s = students.Student(page_url, "lang=en", random.Random(0))
        s.page = ""  # the navigation's default page: Live
        await s.open()
        try:
            await s.answer()
        finally:
            await s.close()

    with pytest.raises(RuntimeError, match="no number_input"):
        asyncio.run(answer())
