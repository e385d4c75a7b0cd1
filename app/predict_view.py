"""The Lessons page's prediction: every browser answers the lesson's ``[[predict]]`` question
before the run, the presenter watches the answers arrive (how many, the median, a histogram),
locks, runs the lesson and reveals the engine's answer; each student then sees their answer
against the class and the engine (``app/predictions.py``). A fragment refreshes every 2 s, so
answers, the lock and the reveal reach every session without a click."""

from __future__ import annotations

from pathlib import Path

import streamlit as st
from streamlit.runtime.scriptrunner import get_script_run_ctx

from app import i18n, predictions

WORDS = {
    "en": {
        "predict": "Predict before you click",
        "send": "Send my answer",
        "sent": "Your answer: **{v}**. You can change it until the presenter locks.",
        "class": "{n} answers · median {m}",
        "class_1": "1 answer · median {m}",
        "engine_alone": "The engine's answer: **{v}** ({src}).",
        "locked": "Answers are locked.",
        "engine": "The engine's answer: **{v}** ({src}); stored runs {lo}-{hi} "
        "({runs} runs, {when})",
        "machine": "this machine's pre-class check, {when}",
        "run": "measured by the comparison the class watched",
        "earlier_runs": "earlier comparisons on this page",
        "typed": "read off the page by the presenter",
        "yours": "You said **{v}**.",
        "lock": "Lock the answers",
        "unlock": "Unlock",
        "reveal": "Reveal the engine's answer",
        "value": "The engine's answer to reveal",
        "clear": "Clear the answers",
        "refused": "Refused ({code}): {message}",
        "nick": "Nickname (optional: only the presenter sees it)",
        "named": "By name: {names}",
    },
    "pt-BR": {
        "predict": "Preveja antes de clicar",
        "send": "Enviar minha resposta",
        "sent": "Sua resposta: **{v}**. Dá para mudar até quem apresenta travar.",
        "class": "{n} respostas · mediana {m}",
        "class_1": "1 resposta · mediana {m}",
        "engine_alone": "A resposta do motor: **{v}** ({src}).",
        "locked": "As respostas estão travadas.",
        "engine": "A resposta do motor: **{v}** ({src}); execuções guardadas {lo}-{hi} "
        "({runs} execuções, {when})",
        "machine": "a verificação antes da aula desta máquina, {when}",
        "run": "medida pela comparação que a turma viu",
        "earlier_runs": "comparações anteriores nesta página",
        "typed": "lida na página por quem apresenta",
        "yours": "Você disse **{v}**.",
        "lock": "Travar as respostas",
        "unlock": "Destravar",
        "reveal": "Revelar a resposta do motor",
        "value": "A resposta do motor a revelar",
        "clear": "Apagar as respostas",
        "refused": "Recusada ({code}): {message}",
        "nick": "Apelido (opcional: só quem apresenta vê)",
        "named": "Com nome: {names}",
    },
}


@st.cache_resource
def board() -> predictions.Board:
    """One board for the page process: every session's answers."""
    return predictions.Board()


def _session() -> str:
    ctx = get_script_run_ctx()
    return ctx.session_id if ctx is not None else "local"


def view(folder: Path, scenario: dict, presenter: bool, lang: str) -> None:
    for q in predictions.questions(scenario):
        _question(folder, q, presenter, lang)


def _fmt(q: predictions.Question, v: float | None, lang: str) -> str:
    decimals = 0 if q.step >= 1 else 2
    return "—" if v is None else f"{i18n.num(v, decimals, lang)}{q.unit}"


@st.fragment(run_every=2.0)
def _question(folder: Path, q: predictions.Question, presenter: bool, lang: str) -> None:
    _body(folder, q, presenter, lang)


def compare(q: predictions.Question, presenter: bool, lang: str) -> None:
    """Compare's question before its run. The presenter's page asks it; every session on Compare
    shows the question the presenter's page asks (a student's own preset widgets do not move)."""
    if presenter:
        board().ask("compare", q.key)
    _compare(q.key, presenter, lang)


@st.fragment(run_every=2.0)
def _compare(own: str, presenter: bool, lang: str) -> None:
    key = own if presenter else (board().asked("compare") or own)
    q = next(q for q in predictions.COMPARE_QUESTIONS.values() if q.key == key)
    _body(None, q, presenter, lang)


def lock(q: predictions.Question) -> None:
    """The run starts: the answers are final."""
    board().lock(q.key)


def reveal(q: predictions.Question, result: dict) -> float | None:
    """The run ended: its measured ratio is the engine's answer, shown to every session."""
    value = predictions.measured(q, result)
    if value is not None:
        board().reveal(q.key, value)
    return value


def _body(folder: Path | None, q: predictions.Question, presenter: bool, lang: str) -> None:
    words, b = WORDS[lang], board()
    seen = b.view(q.key, _session(), presenter)
    if folder is not None:  # once a run (cached by measured.json's mtime)
        stored = predictions.stored_answer(folder, q)
    else:  # Compare: the earlier comparisons' answers on this page
        earlier = seen["earlier"]
        when = words["earlier_runs"]
        stored = earlier and {"lo": min(earlier), "hi": max(earlier), "runs": len(earlier)}
        stored = {**stored, "when": when} if stored else None
    box = f"predict_{q.number}" if folder is not None else f"predict_{q.key.replace(':', '_')}"
    with st.container(border=True, key=box):
        st.markdown(f"**{words['predict']}** · {q.text[lang]}")
        if not seen["locked"]:
            _answer_form(q, b, words, lang, seen)
        elif seen["mine"] is not None:
            st.markdown(words["yours"].format(v=_fmt(q, seen["mine"], lang)))
        if presenter or seen["locked"]:  # students see the class once answers are final
            said = words["class_1" if seen["count"] == 1 else "class"]
            st.caption(said.format(n=seen["count"], m=_fmt(q, seen["median"], lang)))
            if seen["named"]:  # the presenter's alone (Board.view): a student never gets names
                names = " · ".join(f"{n}: {_fmt(q, v, lang)}" for n, v in seen["named"])
                st.caption(words["named"].format(names=names))
            _histogram(q, seen, stored)
        if seen["revealed"] is not None:
            _engine_line(q, seen, stored or {}, words, lang)
        elif seen["locked"]:
            st.caption(words["locked"])
        if presenter:
            _presenter_controls(q, b, words, seen, typed=folder is not None)


def _answer_form(
    q: predictions.Question, b: predictions.Board, words: dict, lang: str, seen: dict
) -> None:
    key = f"pred_{q.key}"
    start = seen["mine"] if seen["mine"] is not None else (q.lo + q.hi) / 2
    row = st.container(horizontal=True)
    value = row.number_input(
        q.unit, q.lo, q.hi, float(start), q.step, key=key, label_visibility="collapsed"
    )
    nick = row.text_input(
        words["nick"],
        seen["nickname"],
        predictions.MAX_NAME,
        key=f"{key}_nick",
        placeholder=words["nick"],
        label_visibility="collapsed",
        width=300,
    )
    if row.button(words["send"], key=f"{key}_send"):
        try:
            b.answer(q, _session(), value)
            b.name(_session(), nick)
            st.session_state.pop(f"{key}_refused", None)
        except predictions.Refused as exc:
            st.session_state[f"{key}_refused"] = words["refused"].format(
                code=exc.code, message=exc.message
            )
    refused = st.session_state.get(f"{key}_refused")
    if refused:
        st.warning(refused, icon=":material/block:")
    mine = b.view(q.key, _session())["mine"]
    if mine is not None:
        st.caption(words["sent"].format(v=_fmt(q, mine, lang)))


def _histogram(q: predictions.Question, seen: dict, stored: dict | None) -> None:
    """The class's answers (anonymous), the engine's stored range, the reveal and your answer."""
    if not seen["values"]:
        return
    x = {"type": "quantitative", "scale": {"domain": [q.lo, q.hi]}, "title": q.unit}
    bins = {"maxbins": 20, "extent": [q.lo, q.hi]}
    layers: list[dict] = [
        {
            "data": {"values": [{"v": v} for v in seen["values"]]},
            "mark": {"type": "bar", "color": "#8a8f98"},
            "encoding": {
                "x": {"field": "v", "bin": bins, **x},
                "y": {
                    "aggregate": "count",
                    "type": "quantitative",
                    "title": None,
                    "axis": {"tickMinStep": 1, "format": "d"},
                },
            },
        }
    ]
    if stored and seen["revealed"] is not None:  # the stored runs' range, behind the reveal
        layers.append(
            {
                "data": {"values": [{"v": stored["lo"], "v2": stored["hi"]}]},
                "mark": {"type": "rect", "color": "#d62728", "opacity": 0.15},
                "encoding": {"x": {"field": "v", **x}, "x2": {"field": "v2"}},
            }
        )
    for value, color in ((seen["revealed"], "#d62728"), (seen["mine"], "#1f77b4")):
        if value is not None:
            layers.append(
                {
                    "data": {"values": [{"v": value}]},
                    "mark": {"type": "rule", "color": color, "strokeWidth": 3},
                    "encoding": {"x": {"field": "v", **x}},
                }
            )
    st.vega_lite_chart({"layer": layers, "height": 140}, width="stretch")


def _engine_line(q: predictions.Question, seen: dict, stored: dict, words: dict, lang: str) -> None:
    machine = predictions.machine_answer(q)
    from_machine = machine is not None and machine["value"] == seen["revealed"]
    src = words["run"] if q.answer.startswith(("ratios:", "score_ratios:")) else words["typed"]
    if from_machine and machine:
        src = words["machine"].format(when=machine["when"])
    if not stored:  # no stored runs (a first comparison on this page): no empty range
        st.markdown(words["engine_alone"].format(v=_fmt(q, seen["revealed"], lang), src=src))
        return
    st.markdown(
        words["engine"].format(
            v=_fmt(q, seen["revealed"], lang),
            src=src,
            lo=_fmt(q, stored.get("lo"), lang),
            hi=_fmt(q, stored.get("hi"), lang),
            runs=stored.get("runs", 0),
            when=stored.get("when", "—"),
        )
    )


def _presenter_controls(
    q: predictions.Question, b: predictions.Board, words: dict, seen, typed: bool = True
) -> None:
    """Lock / unlock, reveal (this machine's pre-class value, or what the page showed; not on
    Compare, where the run reveals its own answer), clear."""
    machine = predictions.machine_answer(q)
    row = st.container(horizontal=True)
    if not seen["locked"] and row.button(words["lock"], key=f"lock_{q.key}"):
        b.lock(q.key)
        st.rerun(scope="fragment")
    final = seen["locked"] and seen["revealed"] is None
    if final and row.button(words["unlock"], key=f"un_{q.key}"):
        b.lock(q.key, False)
        st.rerun(scope="fragment")
    if typed and seen["revealed"] is None:
        default = machine["value"] if machine else (q.lo + q.hi) / 2
        value = row.number_input(words["value"], value=float(default), key=f"rv_{q.key}")
        if row.button(words["reveal"], key=f"reveal_{q.key}", type="primary"):
            b.reveal(q.key, value)
            st.rerun(scope="fragment")
    if row.button(words["clear"], key=f"clear_{q.key}"):
        b.reset(q.key)
        st.rerun(scope="fragment")
