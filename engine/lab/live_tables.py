"""The teacher's table of a lesson's Live steps (``python -m engine.lesson N --live``): what the
page's headline showed at each ``[[live]]`` setting, and each ``[[live_check]]`` claim's sizes over
the runs, in English and Portuguese. Measuring is ``engine.lab.live_steps``'s."""

from __future__ import annotations

from typing import Any

from engine.lab.live_steps import SETTLE_S


def checks_markdown(
    checks: list[dict[str, Any]], lang: str, names: dict[str, str] | None = None
) -> str:
    """One line per claim: its words, then b / a over the runs as min-max, and whether it held;
    ``names`` gives each setting's name in ``lang``."""
    names = names or {}
    lines = []
    for c in checks:
        text = c.get("claim_pt" if lang == "pt-BR" else "claim_en") or c["metric"]
        lo, hi = (_cell(v, 1, 2, "", lang) for v in (c["min"], c["max"]))
        bound = {">": "≥ ", "<": "≤ ", "~": "within ", "<=": "≤ "}[c["op"]] + _cell(
            c.get("size"), 1, 2, "x", lang
        )
        if lang == "pt-BR":
            bound = bound.replace("within", "dentro de")
        runs = len(c["ratios"])
        b, a = names.get(c["b"], c["b"]), names.get(c["a"], c["a"])
        if "over_metric" in c:  # two figures of the page's headline, maybe of one setting
            b, a = f"{b}: {_metric(c['metric'], lang)}", f"{a}: {_metric(c['over_metric'], lang)}"
        if lang == "pt-BR":
            held = f"{runs} execuções; limite {bound}; manteve: {'sim' if c['ok'] else 'não'}"
        else:
            held = f"{runs} runs; bound {bound}; held: {'yes' if c['ok'] else 'no'}"
        lines.append(f"- {text}: {b} / {a} = {lo}-{hi}x ({held})")
    return "\n".join(lines)


# -- the teacher's table ---------------------------------------------------------------------------
MARK_START, MARK_END = "<!-- live -->", "<!-- /live -->"
COLUMNS = (  # key, scale, decimals, unit
    ("throughput", 1, 1, ""),
    ("ttft_p50", 1000, 0, " ms"),
    ("itl_p50", 1000, 0, " ms"),
    ("itl_p99", 1000, 0, " ms"),
    ("slot_utilization", 100, 0, " %"),
    ("dead_slot_fraction", 100, 0, " %"),
    ("kv_waste", 100, 0, " %"),
    ("busy_fraction", 100, 0, " %"),
)
WORDS = {
    "en": {
        "head": (
            "setting|useful tokens/s|TTFT p50|ITL p50|ITL p99|"
            "slot utilization|dead-slot fraction|KV waste|device busy"
        ).split("|"),
        "row": "Each row: the page's headline over the {s:.0f} s after switching to that setting, "
        "in the order of the lesson's steps (so a backlog left by one setting shows in the next). ",
        "row_alt": "Each row: the page's headline over {s:.0f} s of that setting, in windows that "
        "alternated with the other settings' (below). ",
        "how": "Measured by `python -m engine.lesson {n} --live{flag}` on {when}, load average "
        "{load}: the engine started as {started} ({weights} weights, {threads} torch"
        " thread(s){on}). A loaded machine shows longer times; the counts (slots, waste) move"
        " less.",
        "alt": " The settings alternated, as a neighbour's pressure drifts: {r} windows of"
        " {w:.0f} s (A B, B A, ...) after one as long to warm up, each read {settle} s after its"
        " switch; a row is the mean of its windows.",
        "on": " on core(s) {c}",
        "pinned": "`make lab` starts it",
        "free": "`python -m engine.lab --no-pin` starts it, on every core",
        "none": "not measured yet: `python -m engine.lesson {n} --live --save`",
    },
    "pt-BR": {
        "head": (
            "ajuste|tokens úteis/s|TTFT p50|ITL p50|ITL p99|"
            "uso dos slots|slots mortos|desperdício de KV|dispositivo ocupado"
        ).split("|"),
        "row": "Cada linha: o topo da página nos {s:.0f} s depois de mudar para aquele ajuste, na "
        "ordem dos passos da aula (uma fila deixada por um ajuste aparece no seguinte). ",
        "row_alt": "Cada linha: o topo da página em {s:.0f} s daquele ajuste, em janelas "
        "alternadas com as dos outros ajustes (abaixo). ",
        "how": "Medido por `python -m engine.lesson {n} --live{flag}` em {when}, carga média "
        "{load}: o motor iniciado como {started} (pesos {weights}, {threads} thread(s) do "
        "torch{on}). Uma máquina com carga mostra tempos maiores; as contagens (slots, "
        "desperdício) mudam menos.",
        "alt": " Os ajustes se alternaram, porque a pressão de um vizinho varia: {r} janelas de"
        " {w:.0f} s (A B, B A, ...) depois de uma igual de aquecimento, cada uma lida {settle} s"
        " depois da troca; uma linha é a média das suas janelas.",
        "on": " no(s) núcleo(s) {c}",
        "pinned": "`make lab` o inicia",
        "free": "`python -m engine.lab --no-pin` o inicia, em todos os núcleos",
        "none": "ainda não medido: `python -m engine.lesson {n} --live --save`",
    },
}


def _metric(key: str, lang: str) -> str:
    """A headline metric as the claim names it (English) or as ``lang``'s table head names it."""
    names = dict(zip((k for k, *_ in COLUMNS), WORDS[lang]["head"][1:], strict=True))
    return key if lang == "en" else names.get(key, key)


def _cell(v: float | None, scale: float, decimals: int, unit: str, lang: str) -> str:
    if v is None:
        return "-"
    text = f"{v * scale:,.{decimals}f}"
    if lang == "pt-BR":  # 1,234.5 -> 1.234,5
        text = text.replace(",", "\0").replace(".", ",").replace("\0", ".")
    return text + unit


def alternated(live: dict, lang: str) -> str:
    """How the windows alternated (``live_rounds``), in ``lang``."""
    n, settle = live["rounds"], f"{SETTLE_S:g}"
    settle = settle.replace(".", ",") if lang == "pt-BR" else settle
    windows = n * len(live["rows"])
    return WORDS[lang]["alt"].format(r=windows, w=live["seconds"] / n, settle=settle)


def live_markdown(live: dict | None, number: int, lang: str) -> str:
    """The teacher's table of what the Live page showed at each of the lesson's settings."""
    w = WORDS[lang]
    if not live:
        return w["none"].format(n=number)
    lines = ["| " + " | ".join(w["head"]) + " |", "|" + "---|" * len(w["head"])]
    for row in live["rows"]:
        name = row.get(f"name_{lang}") or row["name"]
        cells = (_cell(row["summary"].get(k), *spec, lang) for k, *spec in COLUMNS)
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    engine = live["rows"][0]["engine"] if live["rows"] else {}
    cpus = live.get("engine_cpus")
    load_avg = live["load"].replace(".", ",") if lang == "pt-BR" else live["load"]
    lines += [
        "",
        w["row_alt" if live.get("rounds", 1) > 1 else "row"].format(s=live["seconds"])
        + w["how"].format(
            n=number,
            when=live["when"],
            load=load_avg,
            weights=engine.get("weights", "?"),
            threads=live["engine_threads"],
            on=w["on"].format(c=",".join(map(str, cpus))) if cpus else "",
            started=w["pinned"] if cpus else w["free"],
            flag="" if cpus else " --no-pin",
        )
        + (alternated(live, lang) if live.get("rounds", 1) > 1 else ""),
    ]
    if live.get("checks"):
        named = {r["name"]: r.get(f"name_{lang}") or r["name"] for r in live["rows"]}
        lines += ["", checks_markdown(live["checks"], lang, named)]
    return "\n".join(lines)
