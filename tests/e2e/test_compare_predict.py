"""A Compare run carries its question (issue 41), in Chromium: a student's browser shows the
question the presenter's Compare page asks, answers it before the run; the presenter's run locks
the answers and its measured ratio is revealed to both, with no typing. The screenshot is
tests/artifacts/15-compare-predict-student-pt-BR.png."""

from __future__ import annotations

import pytest

from app import predictions

from .browsing import ARTIFACTS
from .test_presenter_session import _nav, _sign_in, token_lab  # noqa: F401 - the fixture

BOX = ".st-key-predict_cmp_batching"


@pytest.mark.browser
def test_the_compare_run_answers_the_class(browser, token_lab):  # noqa: F811
    from playwright.sync_api import expect

    http_url, _ = token_lab
    made = [browser.new_context(viewport={"width": 1366, "height": 900}) for _ in range(2)]
    try:
        teacher = _sign_in(made[0].new_page(), http_url)
        _nav(teacher, "Comparar")
        expect(teacher.locator(BOX)).to_be_visible(timeout=60_000)
        student = made[1].new_page()
        student.goto(f"{http_url}/compare?lang=pt-BR")
        box = student.locator(BOX)
        expect(box).to_be_visible(timeout=60_000)
        q = predictions.COMPARE_QUESTIONS["batching"]
        expect(box.get_by_text(q.text["pt-BR"])).to_be_visible()
        field = box.locator("input[type='number']").first
        field.fill("2.5")
        field.press("Enter")
        box.get_by_role("button", name="Enviar minha resposta").click()
        expect(box.get_by_text("Sua resposta:")).to_be_visible(timeout=60_000)
        # the teacher's page sees the answer arrive, and runs: no reveal to type
        expect(teacher.locator(BOX).get_by_text("1 resposta · mediana 2,50x")).to_be_visible(
            timeout=60_000
        )
        assert (
            teacher.locator(BOX).get_by_role("button", name="Revelar a resposta do motor").count()
            == 0
        )
        teacher.get_by_role("button", name="Rodar a comparação").click()
        for page in (teacher, student):
            line = page.locator(BOX).get_by_text("A resposta do motor:")
            expect(line).to_be_visible(timeout=300_000)
            expect(
                page.locator(BOX).get_by_text("medida pela comparação que a turma viu")
            ).to_be_visible()
        expect(box.get_by_text("Você disse")).to_be_visible()
        student.screenshot(
            path=str(ARTIFACTS / "15-compare-predict-student-pt-BR.png"), full_page=True
        )
        teacher.locator(BOX).get_by_role("button", name="Apagar as respostas").click()
    finally:
        for ctx in made:
            ctx.close()
