"""The words of student policies on the page, English then Brazilian Portuguese: the Live page's
switch (a loaded policy marked as such) and the presenter's notice of refused decisions (the
browser view's ``v_`` words), Step by step's "which hook decided", and Compare on a trace with its
score table. ``app/i18n.py`` puts them together with the other tables."""

from __future__ import annotations

# key: (English, Portuguese)
POLICY: dict[str, tuple[str, str]] = {
    # Live: the policy switch
    "policy_loaded": ("{name} (loaded)", "{name} (carregada)"),
    # Live: the presenter's notice (drawn by the browser view)
    "v_perr_title": (
        "Loaded policy refused by the engine's checks",
        "Política carregada recusada pelas verificações do motor",
    ),
    "v_perr_line": (
        "{policy} · {hook} · [{code}] {error} · {n}× · last at step {step}",
        "{policy} · {hook} · [{code}] {error} · {n}× · a última no passo {step}",
    ),
    "v_perr_note": (
        "Each refused step was decided by continuous instead; no request failed. Only the "
        "presenter sees this notice.",
        "Cada passo recusado foi decidido pelo continuous; nenhuma requisição falhou. Só quem "
        "apresenta vê este aviso.",
    ),
    "v_perr_more": ("and {n} other kinds of refusal", "e mais {n} tipos de recusa"),
    "v_perr_dismiss": ("Dismiss", "Dispensar"),
    # Step by step: which hook decided
    "hook_token_budget": ("the step's token budget", "o orçamento de tokens do passo"),
    "hook_prefill_tokens": (
        "the prompt tokens each request computes (the tokens column)",
        "os tokens de prompt que cada requisição calcula (a coluna tokens)",
    ),
    "hook_preempt": ("the preemption victim", "a vítima da preempção"),
    "hook_admit": ("the admission order", "a ordem de admissão"),
    "decided_head": ("Who decided: {policy} (loaded)", "Quem decidiu: {policy} (carregada)"),
    "decided_line": (
        "`{hook}` of {policy} decided {what}.",
        "`{hook}` de {policy} decidiu {what}.",
    ),
    "decided_none": (
        "{policy} decided nothing itself this step: continuous's defaults did.",
        "{policy} não decidiu nada neste passo: decidiram os padrões do continuous.",
    ),
    "decided_refused": (
        "The engine refused `{hook}` of {policy} ([{code}] {error}); from there on, this step "
        "was decided by continuous.",
        "O motor recusou o `{hook}` de {policy} ([{code}] {error}); dali em diante, este passo "
        "foi decidido pelo continuous.",
    ),
    "why_loaded": (
        "in the order `admit` of {policy} chose",
        "na ordem que o `admit` de {policy} escolheu",
    ),
    "why_loaded_default": (
        "in the queue's order (continuous's default: {policy} did not decide it)",
        "na ordem da fila (padrão do continuous: {policy} não decidiu isso)",
    ),
    "preempted_by": (
        "preempted #{rid}: the KV pool ran out of blocks and `preempt` of {policy} chose it; "
        "its KV is recomputed when it is admitted again.",
        "preemptada #{rid}: acabaram os blocos de KV e o `preempt` de {policy} a escolheu; o KV "
        "dela é recalculado quando for admitida de novo.",
    ),
    # Compare: policies on a trace
    "cmp_mode": ("compare", "comparar"),
    "cmp_mode_presets": ("a lesson's workload", "uma carga das aulas"),
    "cmp_mode_trace": ("policies on a trace", "políticas num trace"),
    "cmp_trace": ("trace", "trace"),
    "trace_class": (
        "the shipped class trace (five clients, one floods)",
        "o trace da turma que vem com o Fluxo (cinco clientes, um inunda)",
    ),
    "trace_live": (
        "this class's own requests (since the last reset)",
        "as requisições desta turma (desde o último reset)",
    ),
    "cmp_policy_a": ("policy A", "política A"),
    "cmp_policy_b": ("policy B", "política B"),
    "cmp_trace_line": (
        "trace: {t} · A = {a} · B = {b} · priced clock (each step costs what the cost model "
        "prices it at: the same score on any machine, as `python -m engine.policy score`)",
        "trace: {t} · A = {a} · B = {b} · relógio precificado (cada passo custa o que o modelo "
        "de custo diz: a mesma pontuação em qualquer máquina, como `python -m engine.policy "
        "score`)",
    ),
    "cmp_trace_run": ("Score both on the trace", "Pontuar as duas no trace"),
    "score_title": ("Score on the trace", "Pontuação no trace"),
    "score_caption": (
        "{n} requests · goodput: requests with TTFT ≤ {ttft} s and ITL p99 ≤ {itl} s, per second · "
        "fairness: Jain's index of per-client goodput (1 = equal)",
        "{n} requisições · goodput: requisições com TTFT ≤ {ttft} s e ITL p99 ≤ {itl} s, por "
        "segundo · justiça: índice de Jain do goodput por cliente (1 = igual)",
    ),
    "k_goodput_rps": ("goodput (requests/s)", "goodput (requisições/s)"),
    "k_goodput_rps_without_heaviest": (
        "goodput without the heaviest client",
        "goodput sem o cliente mais pesado",
    ),
    "k_fairness": ("fairness (Jain)", "justiça (Jain)"),
    "k_ttft_p99": ("TTFT p99", "TTFT p99"),
    "k_preemptions": ("preemptions", "preempções"),
    "k_policy_errors": ("refused decisions", "decisões recusadas"),
}
