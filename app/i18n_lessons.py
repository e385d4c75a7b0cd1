"""The Lessons page's words, English then Brazilian Portuguese (``app/views/lessons.py``)."""

# Every word this page shows, in both languages (the lesson texts name these exact labels).
WORDS = {
    "en": {
        "title": "Lessons",
        "title_key": "Lessons",
        "caption": "Each lesson sets up a scenario on the live engine and says what to watch.",
        "none": "No lessons found in `{path}` yet.",
        "lesson": "lesson",
        "scenario": "Scenario",
        "setup": "Set up this scenario",
        "setup_ok": "Scenario running: open the Live page.",
        "compare": "Run this lesson's comparison",
        "compare_help": "Replays the lesson's workload under its two configurations on fresh "
        "engines; live traffic is held meanwhile.",
        "compare_wait": "Replaying comparison {i} of {n} on the real engine…",
        "compare_ok": "Comparison done: the measured ratios are below.",
        "presenter_only": "Only the presenter sets up scenarios and runs comparisons.",
        "watch": "What to watch",
        "results": "This lesson's comparison, as measured now",
        "teacher": "Teacher's notes (presenter only)",
        "figure": "The lesson's figure (from its own run: {src})",
        "no_figure": "No saved run yet for the lesson's figure: "
        "`python -m engine.lesson {n} --save` draws it here.",
        "no_text": "(no {lang} text for this lesson)",
        "cols": ("workload", "A", "B", "metric", "A value", "B value", "B / A", "scale"),
        "replay": "Replay this lesson's recording",
        "replay_help": "Its recorded comparison in the Live, Step by "
        "step and Compare views: no engine, no model.",
        "simulated": "host_work_ms = {ms:g}: **simulated host work**, {ms:g} ms of host-side "
        "delay added to every step (a teaching setting, not real work).",
    },
    "pt-BR": {
        "title": "Aulas",
        "title_key": "Aulas",
        "caption": "Cada aula prepara um cenário no motor ao vivo e diz o que observar.",
        "none": "Nenhuma aula em `{path}` ainda.",
        "lesson": "aula",
        "scenario": "Cenário",
        "setup": "Preparar este cenário",
        "setup_ok": "Cenário rodando: abra a página Ao vivo.",
        "compare": "Rodar a comparação desta aula",
        "compare_help": "Repete a carga da aula nas duas configurações, em motores novos; "
        "o tráfego ao vivo fica suspenso enquanto isso.",
        "compare_wait": "Repetindo a comparação {i} de {n} no motor real…",
        "compare_ok": "Comparação concluída: as razões medidas estão abaixo.",
        "presenter_only": "Só quem apresenta prepara cenários e roda comparações.",
        "watch": "O que observar",
        "results": "A comparação desta aula, medida agora",
        "teacher": "Notas para quem ensina (só para quem apresenta)",
        "figure": "A figura da aula (da execução da própria aula: {src})",
        "no_figure": "A figura da aula ainda não tem execução salva: "
        "`python -m engine.lesson {n} --save` a desenha aqui.",
        "no_text": "(esta aula ainda não tem texto em {lang})",
        "cols": ("carga", "A", "B", "métrica", "valor A", "valor B", "B / A", "escala"),
        "replay": "Reproduzir a gravação desta aula",
        "replay_help": "A comparação gravada nas visões Ao vivo, "
        "Passo a passo e Comparar: sem motor, sem modelo.",
        "simulated": "host_work_ms = {ms:g}: **trabalho de host simulado**, {ms:g} ms de atraso "
        "do lado do host somados a cada passo (um ajuste didático, não trabalho de verdade).",
    },
}
