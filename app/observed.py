"""The line a page shows when its engine is not Fluxo's but one Fluxo watches (``python -m
engine.observe``, docs/observe.md): which engine and version, that the page cannot drive it, the
tier of data its step records carry, its ranks, and where its chats go. Read from the server's
``state.observed``; absent on Fluxo's own engine."""

from __future__ import annotations

from typing import Any

ENGINES = {"vllm": "vLLM"}
# What each tier of records can say (docs/observe.md, "What an observed step can say").
TIERS = {
    "scheduler": (
        "scheduler: each step's exact batch from vLLM's scheduler; no cost model, no policy"
        " decisions, lanes assigned by Fluxo",
        "escalonador: o lote exato de cada passo, do escalonador do vLLM; sem modelo de custo,"
        " sem decisões de política, raias atribuídas pelo Fluxo",
    ),
}
WORDS = {
    "observed": ("observed, read-only", "observado, somente leitura"),
    "tier": ("data tier", "nível dos dados"),
    "ranks": ("data-parallel ranks", "ranks de paralelismo de dados"),
    "chats": ("chats and traffic go to its OpenAI API", "chats e tráfego vão à sua API OpenAI"),
    "missed": ("records missed", "registros perdidos"),
}


def _w(key: str, lang: str, table: dict = WORDS) -> str:
    en, pt = table[key]
    return pt if lang == "pt-BR" else en


def short_version(version: str) -> str:
    """``0.32.0`` -> ``0.32``: the release line the observer was read against."""
    return ".".join(str(version).split(".")[:2])


def banner(state: dict[str, Any], lang: str = "en") -> str | None:
    """Markdown for the page's top, or None on Fluxo's own engine."""
    obs = state.get("observed")
    if not isinstance(obs, dict):
        return None
    name = ENGINES.get(obs.get("engine"), str(obs.get("engine", "?")))
    head = f"**{name} {short_version(obs.get('version', '?'))}, {_w('observed', lang)}**"
    tier = obs.get("tier", "?")
    parts = [head, f"{_w('tier', lang)}: " + (_w(tier, lang, TIERS) if tier in TIERS else tier)]
    ranks = max(len(obs.get("ranks") or []), obs.get("data_parallel_size") or 1)
    if ranks > 1:
        parts.append(f"{ranks} {_w('ranks', lang)}")
    if obs.get("missed"):
        parts.append(f"{obs['missed']} {_w('missed', lang)}")
    if obs.get("http_url"):
        parts.append(f"{_w('chats', lang)}: `{obs['http_url']}/v1`")
    return " · ".join(parts)
