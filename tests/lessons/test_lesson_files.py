"""Every lesson's files and scenario, checked fast (no real model): the student and teacher
texts in both languages, the scenario's runs, checks, comparisons and traffic as the engine, the
server and the page take them, and the `compare` replay on the tiny model.

The lessons' claims, replayed on SmolLM2: test_lessons.py.
"""

from __future__ import annotations

import math
import re

import pytest

from engine.core.config import LIVE_FIELDS, EngineConfig
from engine.core.errors import FluxoError
from engine.lab.scenario import (
    CONFIG_FIELDS,
    OPS,
    RATIO_KEYS,
    engine_config,
    load,
)
from engine.lab.specs import SPECS, WORKLOADS, build_workload
from engine.workloads.lessons import compares, lesson_dirs

LESSONS = lesson_dirs()
REQUIRED = {
    "00-anatomy-of-a-request",
    "01-why-batches",
    "02-oven-vs-flow",
    "03-admission-stalls",
    "04-memory-is-the-stage",
    "05-cpu-and-accelerator",
    "06-where-the-gain-comes-from",
    "07-saturation-and-targets",
    "08-ragged-vs-padded",
    "09-hiding-host-work",
}
# The `traffic` message's vocabulary (docs/protocol.md), `action` aside.
TRAFFIC_FIELDS = {"rate", "load", "prompts", "lengths", "median", "sigma", "max_tokens", "seed"}
CHARTS = {
    "Slot occupancy",
    "Admission stalls",
    "KV memory",
    "CPU / device timeline",
}  # app/charts.py's titles
# The teacher's part (presenter only) must hold each of these; the student's part none of its
# answers.
TEACHER_SECTIONS = {
    "en": (
        "## Learning objectives",
        "## Predict before you click",
        "## Answer key",
        "## Common misconceptions",
        "## Expected numbers on the Live page",
        "## Timing",
        "## Figure for slides",
        "<!-- measured -->",
    ),
    "pt-BR": (
        "## Objetivos de aprendizagem",
        "## Preveja antes de clicar",
        "## Gabarito",
        "## Concepções erradas comuns",
        "## Números esperados na página Ao vivo",
        "## Tempo",
        "## Figura para os slides",
        "<!-- measured -->",
    ),
}
STUDENT_SECTIONS = {
    "en": (
        "## Predict before you click",
        "## On the page",
        "## Questions for the class",
        "## References",
    ),
    "pt-BR": (
        "## Preveja antes de clicar",
        "## Na página",
        "## Perguntas para a turma",
        "## Referências",
    ),
}
REFERENCES = (
    "usenix.org/conference/osdi22/presentation/yu",
    "arxiv.org/abs/2309.06180",
    "arxiv.org/abs/2403.02310",
    "anyscale.com/blog/continuous-batching-llm-inference",
    "huggingface.co/blog/continuous_async",
)
# Brazilian CS vocabulary (scheduling is escalonamento; tokens are amostrados; memory is
# compartilhada).
NOT_PT_BR = ("agendamento", "agendador", "sorteados", "dividindo", "marcador de lugar")


def test_every_lesson_is_there() -> None:
    assert REQUIRED <= {p.name for p in LESSONS}


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.name)
def test_student_and_teacher_parts(path) -> None:
    """Each language has a student text (no answers) and a teacher's part the page shows the
    presenter only."""
    for lang in ("pt-BR", "en"):
        student = (path / f"{lang}.md").read_text()
        teacher = (path / f"teacher.{lang}.md").read_text()
        for section in STUDENT_SECTIONS[lang]:
            assert section in student, (path.name, lang, section)
        for section in TEACHER_SECTIONS[lang]:
            assert section in teacher, (path.name, lang, section)
        for section in TEACHER_SECTIONS[lang][
            2:4
        ]:  # the answer key and the misconceptions stay out of it
            assert section not in student, (path.name, lang, section)
        for link in REFERENCES:
            assert link in student, (path.name, lang, link)
        if lang == "pt-BR":
            for word in NOT_PT_BR:
                assert word not in (student + teacher).lower(), (path.name, word)
            # decimal commas in Portuguese prose: "0.5 s" or "1.07x" style numbers are English
            prose = "\n".join(
                line
                for line in (student + teacher).splitlines()
                if not line.startswith(
                    ("|", "`", "    ", "- Yu", "- Kwon", "- Agrawal", "- Daniel")
                )
            )
            found = [
                m
                for m in re.findall(r"(?<![\w./=-])(\d+\.\d+) ?(?:s|ms|x|%|GB|tok)", prose)
                if not re.fullmatch(r"[1-9]\d{0,2}\.\d{3}", m)
            ]  # 2.000 is two thousand in Portuguese
            assert not found, (path.name, found[:5])


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.name)
def test_lesson_files_and_scenario(path, tiny) -> None:
    for lang in ("pt-BR", "en"):
        text = (path / f"{lang}.md").read_text()
        assert len(text) > 1500 and "MEASURED_" not in text, (
            f"{path.name}/{lang}.md is missing or unfinished"
        )
    sc = load(path / "scenario.toml")
    assert sc["lesson"]["number"] == int(path.name[:2])
    # [engine] is sent as-is in a `control` message: every live field (a set-up never inherits
    # the lesson before's, e.g. lesson 3's prefix cache off), and valid.
    assert set(sc["engine"]) == set(LIVE_FIELDS), set(LIVE_FIELDS) ^ set(sc["engine"])
    EngineConfig(**sc["engine"])
    # [workload] restates the canonical workload the page's `compare` replays: they must not drift.
    wl = sc["workload"]
    assert {k: v for k, v in wl.items() if k not in ("name", "short_scale")} == {
        "groups": SPECS[wl["name"]]["groups"]
    }
    assert 0 < wl["short_scale"] <= 1
    engine_config(
        sc["engine"], sc.get("short", {})
    )  # the short replay's config: live fields, valid
    _, tok = tiny
    assert build_workload(SPECS[wl["name"]], tok, wl["short_scale"])
    names = set()
    for r in sc["run"]:
        assert r.get("workload", wl["name"]) in WORKLOADS
        engine_config(sc["engine"], {k: v for k, v in r.items() if k in CONFIG_FIELDS})
        assert set(r) <= {"name", "workload", "scale", "peer", "alternate", *CONFIG_FIELDS}
        if "alternate" in r:  # one live field switched between two values every few steps
            assert r["alternate"]["field"] in LIVE_FIELDS and len(r["alternate"]["values"]) == 2
        names.add(r["name"])
    for c in sc["check"]:
        assert c["run"] in names and c.get("over", c["run"]) in names and c["op"] in OPS
        assert c.get("mode", "ratio") in ("ratio", "diff", "ceiling") and c["claim"]
        assert c["claim_pt"] and c.get("against") in (None, "expected")  # the step costs' promise
    # Every [compare] is what the page sends as one `compare` message: a workload the server knows,
    # live config fields only, a scale the server accepts, and a ratio the answer carries.
    assert compares(sc), path.name
    ratios = {f"{k}_b_over_a" for k in RATIO_KEYS}
    for cmp_ in compares(sc):
        assert cmp_["workload"] in WORKLOADS and cmp_["ratio"] in ratios
        assert 0.05 <= cmp_.get("scale", 1.0) <= 1.0
        for side in ("a", "b"):
            assert set(cmp_[side]) <= set(LIVE_FIELDS)
            engine_config(SPECS[cmp_["workload"]]["engine"], cmp_[side])
    fig = sc["figure"]
    assert set(fig["runs"]) <= names and fig["title_en"] and fig["title_pt"]
    assert sc["watch"]["chart"] in CHARTS and sc["watch"]["en"] and sc["watch"]["pt-BR"]
    assert set(sc["traffic"]) <= TRAFFIC_FIELDS and "load" in sc["traffic"]  # x capacity, any CPU


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.name)
def test_traffic_is_what_the_server_accepts(path) -> None:
    """The page starts a lesson's [traffic] with one `traffic` message; the server accepts it."""
    from engine.workloads.traffic import TrafficParams

    traffic = load(path / "scenario.toml")["traffic"]
    params = TrafficParams.from_message({"type": "traffic", "action": "start", **traffic})
    assert {k: getattr(params, k) for k in traffic} == traffic


def test_bad_scenario_config_is_refused() -> None:
    with pytest.raises(FluxoError):
        engine_config({"policy": "oven"}, {})
    with pytest.raises(FluxoError):
        engine_config({}, {"block_size": 8})  # not live: a lesson cannot set it


def test_compare_replays_a_workload_under_two_configs(tiny) -> None:
    """What the server's `compare` message calls: both runs, their records, and the ratios."""
    from engine.lab.scenario import compare

    out = compare(
        *tiny,
        "uniform",
        {"policy": "static", "dtype": "float64"},
        {"policy": "continuous", "dtype": "float64"},
        scale=0.2,
    )
    assert out["workload"] == "uniform" and out["a"]["config"]["policy"] == "static"
    for side in (
        "a",
        "b",
    ):  # "uniform" scales its lengths: 24 answers of round(32 x 0.2) = 6 tokens
        assert (
            out[side]["summary"]["useful_tokens"] == 24 * 6
            and out[side]["steps"]
            and out[side]["requests"]
        )
    assert math.isfinite(out["ratios"]["throughput_b_over_a"])
    with pytest.raises(FluxoError):
        compare(*tiny, "nope", {}, {}, 1.0)
    with pytest.raises(FluxoError):
        compare(*tiny, "uniform", {"policy": "oven"}, {}, 1.0)


REPEATED_REPORT = ("long", "mixed")  # prompt sets whose long prompts repeat one report


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.name)
def test_prefill_is_never_hidden_by_the_prefix_cache(path) -> None:
    """Every long prompt of the lessons repeats one report, so with the prefix cache on all but
    the first are read from it and never prefilled (bench stall, 2026-12-01: 384 of 384 tokens
    cached). Outside lesson 10, which is about that cache, a run or Live traffic with long
    prompts has the cache off, and so does the page's compare of a workload with them."""
    sc = load(path / "scenario.toml")
    if sc["lesson"]["number"] == 10:
        return
    for r in sc["run"]:
        spec = SPECS[r.get("workload", sc["workload"]["name"])]
        if any(g["prompts"] in REPEATED_REPORT for g in spec["groups"]) and "peer" not in r:
            config = engine_config(sc["engine"], {k: v for k, v in r.items() if k in CONFIG_FIELDS})
            assert config["prefix_cache"] is False, f"{path.name} run {r['name']}"
    if sc["traffic"]["prompts"] in REPEATED_REPORT and not sc.get("live"):
        assert sc["engine"]["prefix_cache"] is False, f"{path.name} [traffic]"
    for s in sc.get("live") or []:
        if sc["traffic"]["prompts"] in REPEATED_REPORT or s.get("traffic", {}).get("prompts") in (
            REPEATED_REPORT
        ):
            on = s.get("prefix_cache", sc["engine"]["prefix_cache"])
            assert on is False, f"{path.name} live step {s['name']}"
    for cmp_ in compares(sc):
        if any(g["prompts"] in REPEATED_REPORT for g in SPECS[cmp_["workload"]]["groups"]):
            for side in ("a", "b"):
                on = cmp_[side].get(
                    "prefix_cache", SPECS[cmp_["workload"]]["engine"].get("prefix_cache")
                )
                assert on is False, f"{path.name} [compare] {cmp_['workload']} {side}"
