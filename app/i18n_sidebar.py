"""The sidebar's words and those every page shares, English then Brazilian Portuguese (roles, the
presenter's sign-in, the engine's status, the source of the steps, projector mode, errors).
``app/i18n.py`` puts them together with the pages' (``app/i18n_pages.py``)."""

from __future__ import annotations

# key: (English, Portuguese)
SIDEBAR: dict[str, tuple[str, str]] = {
    # sidebar and shared
    "engine": ("Engine", "Motor"),
    "role": ("Role", "Papel"),
    "presenter": ("presenter (controls on)", "apresentador (controles ligados)"),
    "viewer": ("viewer (chat and watch)", "espectador (conversa e assiste)"),
    "token": ("Presenter token", "Token de apresentador"),
    "token_help": (
        "Students watch and chat; the presenter's token unlocks the controls.",
        "Alunos assistem e conversam; o token de quem apresenta libera os controles.",
    ),
    "signed_in": (
        "This browser presents until you sign out or the lab restarts.",
        "Este navegador apresenta até você sair ou o laboratório reiniciar.",
    ),
    "sign_out": ("Sign out", "Sair"),
    "token_wrong": (
        "That token does not unlock the controls.",
        "Esse token não libera os controles.",
    ),
    "locked": (
        "This page listens beyond loopback and holds no FLUXO_TOKEN: the controls are off for "
        "everyone. Start it with a presenter token (make lab does) to present.",
        "Esta página escuta além do loopback e não tem FLUXO_TOKEN: os controles estão desligados "
        "para todos. Inicie-a com um token de apresentador (make lab faz isso) para apresentar.",
    ),
    "model_line": ("model {model} · server {version}", "modelo {model} · servidor {version}"),
    "device_line": ("device {device} · {name}", "dispositivo {device} · {name}"),
    "weights_line": (
        "weights {weights} · kernels {kernels}",
        "pesos {weights} · kernels {kernels}",
    ),
    "browser_connected": ("your browser: connected", "seu navegador: conectado"),
    "browser_relay": (
        "your browser: connected through this page's address",
        "seu navegador: conectado pelo endereço desta página",
    ),
    "browser_disconnected": (
        "your browser cannot reach the engine ({url})",
        "seu navegador não alcança o motor ({url})",
    ),
    "status_connected": ("connected", "conectado"),
    "status_connecting": ("connecting", "conectando"),
    "status_disconnected": ("disconnected", "desconectado"),
    "language": ("idioma / language", "idioma / language"),
    "source": ("Source", "Fonte"),
    "src_live": ("live engine", "motor ao vivo"),
    "src_rec": ("recording", "gravação"),
    "recording": ("Recording", "Gravação"),
    "upload": ("Open a recording (.jsonl)", "Abrir uma gravação (.jsonl)"),
    "upload_help": (
        "The JSON lines export of this page (Live → Prepare telemetry export), or a lesson's "
        "recording.jsonl.",
        "A exportação em JSON lines desta página (Live → Preparar exportação), ou o "
        "recording.jsonl de uma aula.",
    ),
    "uploaded": ("uploaded file", "arquivo enviado"),
    "run": ("run", "execução"),
    "bad_recording": (
        "This file cannot be replayed: {message}",
        "Este arquivo não pode ser reproduzido: {message}",
    ),
    "no_recordings": (
        "No recording found: run `python -m engine.lab.recordings all`.",
        "Nenhuma gravação: rode `python -m engine.lab.recordings all`.",
    ),
    "fallback": (
        "The engine at `{url}` is not reachable: showing a recording instead (no engine needed). "
        "Pick the live engine under Source once it runs.",
        "O motor em `{url}` não responde: mostrando uma gravação (sem motor). Escolha o motor ao "
        "vivo em Fonte quando ele estiver rodando.",
    ),
    "rec_caption": (
        "Recorded {when} on {model} ({device}) · {steps} steps kept of {total} · no engine needed",
        "Gravado em {when} com {model} ({device}) · {steps} passos de {total} · sem motor",
    ),
    "projector": ("Projector mode", "Modo projetor"),
    "projector_help": (
        "Light theme, large type, one chart at a time if you pick one.",
        "Tema claro, letras grandes, um gráfico por vez se você escolher.",
    ),
    "chart_only": ("Full-screen chart", "Gráfico em tela cheia"),
    "all_charts": ("all charts", "todos"),
    "chart_slots": ("slots", "slots"),
    "chart_stalls": ("stalls", "engasgos"),
    "chart_kv": ("KV memory", "memória KV"),
    "chart_lanes": ("CPU / device", "CPU / dispositivo"),
    "chart_tokens": ("tokens per step", "tokens por passo"),
    "keys_hint": (
        "Keys: PgDn / PgUp step, space play/pause, ? help",
        "Teclas: PgDn / PgUp passo, espaço toca/pausa, ? ajuda",
    ),
    "error_said": (
        "The engine said **{code}**: {message}",
        "O motor respondeu **{code}**: {message}",
    ),
    "export_prep": ("Prepare telemetry export", "Preparar exportação da telemetria"),
    "export_jsonl": ("JSON lines", "JSON lines"),
    "export_chrome": ("Chrome trace", "Trace do Chrome"),
    "export_note": (
        "Each chart's ... menu saves it as PNG or SVG.",
        "O menu ... de cada gráfico salva PNG ou SVG.",
    ),
    "evidence": ("Evidence (CSV + JSON)", "Evidências (CSV + JSON)"),
    "evidence_help": (
        "The tables a course grades, per request, per step and per configuration, with the "
        "engine, weights, machine and settings: a zip that pandas reads. No prompt or answer is "
        "in it, and nobody's name. Check a hand-in: python -m app.evidence_check.",
        "As tabelas que um curso avalia, por requisição, por passo e por configuração, com o "
        "motor, os pesos, a máquina e os ajustes: um zip que o pandas lê. Nenhum prompt ou "
        "resposta vai nele, nem o nome de ninguém. Conferir uma entrega: "
        "python -m app.evidence_check.",
    ),
}
