"""The class predicts (app/predictions.py): every lesson asks at least one question in en and
pt-BR whose engine answer is a number of its stored run; the board keeps one answer per session,
editable until locked, refuses a flood with a code, and shows no session's identity."""

from __future__ import annotations

import tomllib

import pytest

from app import predictions
from app.predictions import Board, Locked, RateLimited, Refused
from engine.workloads.lessons import lesson_dirs

LESSONS = lesson_dirs()


@pytest.mark.parametrize("folder", LESSONS, ids=lambda p: p.name[:2])
def test_every_lesson_asks_and_its_stored_run_answers(folder):
    scenario = tomllib.loads((folder / "scenario.toml").read_text())
    qs = predictions.questions(scenario)
    assert qs, f"{folder.name}: no [[predict]]"
    for q in qs:
        assert q.text["en"].endswith("?") and q.text["pt-BR"].endswith("?")
        stored = predictions.stored_answer(folder, q)
        assert stored is not None, f"{q.key}: {q.answer} is not in measured.json"
        # the slider can hold the engine's answer: a student may predict it exactly
        assert q.lo <= stored["lo"] <= stored["hi"] <= q.hi, (q.key, stored)


def _q(lo: float = 0.0, hi: float = 10.0) -> predictions.Question:
    return predictions.Question(
        "1:t", 1, {"en": "?", "pt-BR": "?"}, "x", lo, hi, 0.1, "live:check0"
    )


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_one_answer_per_session_editable_until_locked():
    clock = Clock()
    b, q = Board(clock), _q()
    for i, session in enumerate(("s1", "s2", "s3")):
        b.answer(q, session, 2.0 + i)
    clock.t = 5.0
    b.answer(q, "s1", 7.0)  # a change replaces, not adds
    seen = b.view(q.key, "s2")
    assert seen["count"] == 3 and seen["values"] == [3.0, 4.0, 7.0] and seen["mine"] == 3.0
    assert seen["median"] == 4.0 and not seen["locked"] and seen["revealed"] is None
    assert "s1" not in repr(seen) and "s3" not in repr(seen)  # nobody's identity
    b.lock(q.key)
    clock.t = 10.0
    with pytest.raises(Locked) as exc:
        b.answer(q, "s2", 1.0)
    assert exc.value.code == "prediction_locked"
    b.reveal(q.key, 3.5)
    seen = b.view(q.key, "s1")
    assert seen["revealed"] == 3.5 and seen["locked"] and seen["mine"] == 7.0
    b.reset(q.key)
    assert b.view(q.key)["count"] == 0


def test_a_flood_from_one_session_is_refused_with_a_code():
    clock = Clock()
    b, q = Board(clock), _q()
    b.answer(q, "s", 1.0)
    with pytest.raises(RateLimited) as exc:  # the same second
        b.answer(q, "s", 2.0)
    assert exc.value.code == "rate_limited"
    for i in range(1, predictions.MAX_EDITS):
        clock.t = float(i)
        b.answer(q, "s", 1.0 + i / 10)
    clock.t = 1000.0
    with pytest.raises(RateLimited):
        b.answer(q, "s", 5.0)
    assert b.view(q.key, "s")["mine"] == pytest.approx(1.0 + (predictions.MAX_EDITS - 1) / 10)
    b.answer(q, "other", 5.0)  # another student is not held to it
    assert b.view(q.key)["count"] == 2


@pytest.mark.parametrize("value", [-1.0, 11.0, float("nan"), float("inf"), "3", True, None])
def test_an_answer_outside_the_slider_is_refused(value):
    with pytest.raises(Refused) as exc:
        Board().answer(_q(), "s", value)
    assert exc.value.code == "bad_field"


def test_a_question_must_say_its_range_and_answer():
    bad = {"lesson": {"number": 3}, "predict": [{"id": "x", "en": "?", "pt": "?", "min": 2,
                                                 "max": 1, "answer": "live:check0"}]}  # fmt: skip
    with pytest.raises(ValueError, match="min < max"):
        predictions.questions(bad)
    bad["predict"][0].update(min=0, answer="somewhere")
    with pytest.raises(ValueError, match="answer"):
        predictions.questions(bad)


def test_a_compare_run_answers_its_own_question():
    """Each Compare preset (and the trace comparison) asks a question in both languages; the run's
    measured ratio answers it; a ratio the run did not measure answers nothing."""
    assert set(predictions.COMPARE_QUESTIONS) == {"batching", "stall", "memory", "overlap", "trace"}
    for name, q in predictions.COMPARE_QUESTIONS.items():
        assert (
            q.key == f"cmp:{name}" and q.text["en"].endswith("?") and q.text["pt-BR"].endswith("?")
        )
        part, _, key = q.answer.partition(":")
        assert predictions.measured(q, {part: {key: 2.25}}) == 2.25
        for bad in (float("nan"), True, "2", None):
            assert predictions.measured(q, {part: {key: bad}}) is None
        assert predictions.measured(q, {}) is None


def test_the_lessons_recorded_comparisons_fit_the_compare_sliders():
    """A student can predict what a lesson's recorded comparison measured: its ratio lies on the
    Compare question's slider."""
    from app import recording

    checked = 0
    for path in recording.lesson_recordings().values():
        meta = recording.load(path).meta
        q = predictions.COMPARE_QUESTIONS.get(meta.get("workload"))
        value = q and predictions.measured(q, meta)
        if value is not None:
            assert q.lo <= value <= q.hi, (path, q.key, value)
            checked += 1
    assert checked >= 3


def test_the_presenter_s_page_asks_and_earlier_reveals_are_kept():
    b, q = Board(Clock()), _q()
    assert b.asked("compare") is None
    b.ask("compare", "cmp:stall")
    assert b.asked("compare") == "cmp:stall"
    b.reveal(q.key, 2.0)
    assert b.view(q.key)["earlier"] == []  # the one shown now is not an earlier one
    b.reset(q.key)
    b.reveal(q.key, 3.0)
    assert b.view(q.key)["earlier"] == [2.0] and b.view(q.key)["revealed"] == 3.0
    b.reset(q.key)
    assert b.view(q.key)["earlier"] == [2.0, 3.0]


def test_a_nickname_reaches_the_presenter_and_no_student():
    """A student who chose a nickname is named to the presenter beside their answer; the other
    students see the same anonymous values as before; clearing the name makes it anonymous."""
    b, q = Board(Clock()), _q()
    b.answer(q, "s1", 2.0)
    b.answer(q, "s2", 3.0)
    assert b.name("s1", "  Ana \t Clara ") == "Ana Clara"  # blanks folded, as shown
    presenter = b.view(q.key, "teacher", presenter=True)
    assert presenter["named"] == [("Ana Clara", 2.0)] and presenter["count"] == 2
    for session in ("s1", "s2"):  # a student, even the named one, gets no names
        seen = b.view(q.key, session)
        assert seen["named"] == [] and "Ana" not in repr({**seen, "nickname": ""})
    assert b.view(q.key, "s1")["nickname"] == "Ana Clara"  # their own box keeps it
    assert b.view(q.key, "s2")["nickname"] == ""
    b.name("s1", "   ")
    assert b.view(q.key, "teacher", presenter=True)["named"] == []


@pytest.mark.parametrize("name", ["x" * (predictions.MAX_NAME + 1), "a\x00b", "bell\x07", 7])
def test_a_bad_nickname_is_refused_with_a_code(name):
    b = Board(Clock())
    with pytest.raises(Refused) as exc:
        b.name("s1", name)
    assert exc.value.code == "bad_field"
    assert b.view("1:t", "teacher", presenter=True)["named"] == []
