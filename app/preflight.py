"""The Lessons page's pre-class check: this machine's last ``python -m engine.lesson all --live
--check --preflight`` beside each lesson (shows / weak / does not show, the measured size against
its bound, the load and what it came to here, what to do), and the presenter's button that runs a
new one in the background (engine/lab/preflight.py)."""

import subprocess
import sys
import time

import streamlit as st

from app import i18n
from engine.workloads.lessons import LESSONS_DIR, last_preflight

WORDS = {
    "en": {
        "preflight": "Pre-class check",
        "preflight_run": "Run the pre-class check",
        "preflight_help": "Runs every lesson's Live steps briefly on a second engine of this "
        "machine (`python -m engine.lesson all --live --check --preflight`) and says, per lesson, "
        "whether the class will see its effect, in about 5 minutes. Stop the live traffic first.",
        "preflight_running": "The pre-class check is running (started {s} s ago)…",
        "preflight_failed": "The pre-class check failed (exit {rc}): see the terminal.",
        "preflight_none": "Not checked on this machine yet.",
        "preflight_when": "{when}, load average {load}",
        "verdict": {
            "shows": "shows",
            "weak": "weak",
            "none": "does not show",
            "no_claim": "no Live claim",
        },
        "offered": "traffic: {load}x this engine's capacity = {rate} requests/s here",
        "bound": "{claim}: {v}x (bound {op} {{size}}x)",
    },
    "pt-BR": {
        "preflight": "Verificação antes da aula",
        "preflight_run": "Rodar a verificação",
        "preflight_help": "Roda rapidamente os passos ao vivo de cada aula num segundo motor "
        "desta máquina (`python -m engine.lesson all --live --check --preflight`) e diz, por aula, "
        "se a turma vai ver o efeito, em uns 5 minutos. Pare o tráfego ao vivo antes.",
        "preflight_running": "A verificação antes da aula está rodando (começou há {s} s)…",
        "preflight_failed": "A verificação antes da aula falhou (saída {rc}): veja o terminal.",
        "preflight_none": "Ainda não verificada nesta máquina.",
        "preflight_when": "{when}, carga média {load}",
        "verdict": {
            "shows": "aparece",
            "weak": "fraco",
            "none": "não aparece",
            "no_claim": "sem afirmação ao vivo",
        },
        "offered": "tráfego: {load}x a capacidade deste motor = {rate} requisições/s aqui",
        "bound": "{claim}: {v}x (limite {op} {{size}}x)",
    },
}


def view(number: int, presenter: bool, lang: str) -> None:
    """This lesson's line of the machine's last pre-class check, and (presenter only) the button
    that runs a new one in the background."""
    words = WORDS[lang]
    st.markdown(f"**{words['preflight']}**")
    job = st.session_state.get("preflight_job")
    if job is not None:
        rc = job["proc"].poll()
        if rc is None:
            st.info(words["preflight_running"].format(s=int(time.time() - job["t0"])))
        elif rc != 0:
            st.error(words["preflight_failed"].format(rc=rc))
    doc = last_preflight()
    p = (doc or {}).get("lessons", {}).get(str(number))
    if not p:
        st.caption(words["preflight_none"])
    else:
        loadavg = p.get("load", doc["load"])
        loadavg = loadavg.replace(".", ",") if lang == "pt-BR" else loadavg
        advice = p["advice_pt"] if lang == "pt-BR" else p["advice_en"]
        verdict = words["verdict"][p["verdict"]]
        icon = {"shows": ":green[●]", "weak": ":orange[●]"}.get(p["verdict"], ":red[●]")
        lines = [f"{icon} **{verdict}** · {advice}", *claim_lines(p, lang)]
        st.markdown("\n".join(lines))
        when = p.get("when", doc["when"])
        st.caption(words["preflight_when"].format(when=when, load=loadavg))
    if presenter and (job is None or job["proc"].poll() is not None):
        if st.button(words["preflight_run"], key="preflight_run", help=words["preflight_help"]):
            cmd = [sys.executable, "-m", "engine.lesson", "all", "--live", "--check", "--preflight"]
            proc = subprocess.Popen(cmd, cwd=LESSONS_DIR.parent)
            st.session_state["preflight_job"] = {"proc": proc, "t0": time.time()}
            st.rerun()


def claim_lines(p: dict, lang: str) -> list[str]:
    """A lesson's preflight claims and offered load, as Markdown list lines in ``lang``: each
    claim in its own words (a setting's name is the lesson's, in English), its ratio and bound."""
    words, lines = WORDS[lang], []
    for c in p["claims"]:
        op = {">": "≥", "<": "≤", "~": "±", "<=": "≤"}[c["op"]]
        v, size = i18n.num(c["min"], 2, lang), i18n.num(c["size"], 2, lang)
        claim = c.get("claim_pt" if lang == "pt-BR" else "claim_en") or c["metric"]
        bound = words["bound"].format(claim=claim, v=v, op=op)
        lines.append(f"- {bound.replace('{size}', size)}")
    o = p.get("offered") or {}
    if o.get("load") is not None and o.get("rate"):
        tenths = abs(o["load"] * 10 - round(o["load"] * 10)) < 1e-9  # 0.35 is not "0,3"
        load = i18n.num(o["load"], 1 if tenths else 2, lang)
        rate = i18n.num(o["rate"], 1, lang)
        lines.append("- " + words["offered"].format(load=load, rate=rate))
    return lines
