"""The browser view's words, English then Brazilian Portuguese (sent with its arguments:
``app/i18n.py``'s ``VIEW_KEYS``), and those of the presenter keys' help overlay."""

from __future__ import annotations

# key: (English, Portuguese)
VIEW: dict[str, tuple[str, str]] = {
    # the browser view
    "v_chat": ("Chat", "Conversa"),
    "v_ask": ("Ask the model something…", "Pergunte algo ao modelo…"),
    "v_send": ("Send", "Enviar"),
    "v_max_tokens": ("max tokens", "máx. tokens"),
    "v_connected": (
        "connected to the engine as {client} · model {model}",
        "conectado ao motor como {client} · modelo {model}",
    ),
    "v_connecting": ("connecting to {url}", "conectando a {url}"),
    "v_via_relay": (" · through this page's address", " · pelo endereço desta página"),
    "v_unreachable": (
        "engine not reachable at {url}: {why}; retrying in {s} s",
        "motor inalcançável em {url}: {why}; nova tentativa em {s} s",
    ),
    "v_held": (
        "A comparison is running: the live engine is held until it ends, so the comparison "
        "measures only itself.",
        "Uma comparação está rodando: o motor ao vivo fica suspenso até ela terminar.",
    ),
    "v_no_steps": (
        "No steps yet: send a chat or start traffic.",
        "Nenhum passo ainda: converse ou inicie tráfego.",
    ),
    "v_step": ("step", "passo"),
    "v_queue": ("queue", "fila"),
    "v_of": ("of", "de"),
    "v_play": ("Play", "Tocar"),
    "v_pause": ("Pause", "Pausar"),
    "v_speed": ("speed", "velocidade"),
    "v_start": ("To the start", "Ao início"),
    "v_prev": ("Step back", "Passo atrás"),
    "v_next": ("Step forward", "Passo à frente"),
    "v_refused": ("refused", "recusada"),
    "v_failed": ("failed", "falhou"),
    "v_queued": ("queued, position {n}", "na fila, posição {n}"),
    "v_request": ("request", "requisição"),
    "v_tokens": ("tokens", "tokens"),
    # a chat's status line
    "v_st_sent": ("sent", "enviada"),
    "v_st_accepted": ("accepted", "aceita"),
    "v_st_queued": ("queued", "na fila"),
    "v_st_streaming": ("streaming", "gerando"),
    "v_st_finished": ("finished", "terminada"),
    "v_st_cancelled": ("cancelled", "cancelada"),
    "v_st_error": ("error", "erro"),
    "v_age": ("{ms} ms old at render", "desenhado {ms} ms depois do passo"),
    "v_foot": (
        "{n} steps buffered · {r} received, {s} skipped by the server · {k} renders (last {ms} "
        "ms, {c} rows changed)",
        "{n} passos guardados · {r} recebidos, {s} pulados pelo servidor · {k} desenhos (último "
        "{ms} ms, {c} linhas mudadas)",
    ),
    "v_not_connected": ("not connected to the engine", "sem conexão com o motor"),
    # keys (help overlay)
    "k_title": ("Presenter keys", "Teclas de apresentação"),
    "k_pgdn": (
        "next step (Step by step) · next section (Lessons)",
        "próximo passo (Passo a passo) · próxima seção (Aulas)",
    ),
    "k_pgup": ("previous step · previous section", "passo anterior · seção anterior"),
    "k_space": ("play / pause the replay", "toca / pausa a gravação"),
    "k_help": ("this help", "esta ajuda"),
    "k_close": ("Esc or ? closes", "Esc ou ? fecha"),
}
