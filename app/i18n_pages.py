"""The page's words, English then Brazilian Portuguese: the headline metrics and each page (Live,
Step by step, Lessons, Compare), with the metrics' names (the sidebar's: ``app/i18n_sidebar.py``).
``app/i18n.py`` puts them together with the browser view's (``app/i18n_view.py``)."""

from __future__ import annotations

# key: (English, Portuguese)
PAGES: dict[str, tuple[str, str]] = {
    # headline metrics
    "m_throughput": ("useful tokens/s", "tokens úteis/s"),
    "m_ttft": ("TTFT p50", "TTFT p50"),
    "m_itl50": ("ITL p50", "ITL p50"),
    "m_itl99": ("ITL p99", "ITL p99"),
    "m_slot_util": ("slot utilization", "uso dos slots"),
    "m_dead": ("dead-slot fraction", "slots mortos"),
    "m_kv_waste": ("KV waste", "desperdício de KV"),
    "m_busy": ("device busy", "dispositivo ocupado"),
    "over_server": ("over the last {s} s (server)", "nos últimos {s} s (servidor)"),
    "over_page": ("over the page's recent steps", "nos passos recentes da página"),
    "over_run": ("over the whole recorded run", "sobre a execução gravada inteira"),
    # Live
    "stall_scale": ("stall chart's time axis, up to", "eixo de tempo do gráfico de engasgos, até"),
    "stall_auto": ("follows the data", "segue os dados"),
    "stall_help": (
        "Fixed, a drop looks like a drop: switching chunked prefill on takes the spikes from "
        "seconds to tens of ms, and an axis that follows the data rescales instead.",
        "Fixo, uma queda parece uma queda: ligar o prefill em pedaços leva os picos de segundos "
        "a dezenas de ms, e um eixo que segue os dados só muda de escala.",
    ),
    "controls_fold": ("Modes and traffic", "Modos e tráfego"),
    "controls_fold_viewer": (
        "Modes and traffic (the presenter's controls)",
        "Modos e tráfego (os controles de quem apresenta)",
    ),
    "live_title": ("Live", "Ao vivo"),
    "live_caption": (
        "A real continuous-batching engine (SmolLM2-135M on this machine's CPU). Every bar below "
        "is a measured step of it.",
        "Um motor real de lote contínuo (SmolLM2-135M na CPU desta máquina). Cada barra abaixo é "
        "um passo medido dele.",
    ),
    "live_rec_caption": (
        "A recorded run of the real engine, replayed in the browser: play, pause, scrub.",
        "Uma execução gravada do motor real, reproduzida no navegador: tocar, pausar, avançar.",
    ),
    "modes": ("Modes", "Modos"),
    "traffic": ("Traffic", "Tráfego"),
    "rate": ("rate (requests/s)", "taxa (requisições/s)"),
    "load_unit": ("offered load in", "carga oferecida em"),
    "unit_load": ("x this engine's capacity", "x a capacidade deste motor"),
    "unit_rate": ("requests/s", "requisições/s"),
    "load": (
        "load (x capacity: 1.0 keeps the engine 100 % busy)",
        "carga (x capacidade: 1,0 deixa o motor 100 % ocupado)",
    ),
    "prompts": ("prompts", "prompts"),
    "lengths": ("lengths", "comprimentos"),
    "median": ("median length", "comprimento mediano"),
    "sigma": ("sigma", "sigma"),
    "max_tokens": ("max tokens", "máx. de tokens"),
    "start_traffic": ("Start traffic", "Iniciar tráfego"),
    "stop_traffic": ("Stop traffic", "Parar tráfego"),
    "traffic_on": ("**traffic:** on, {rate} req/s", "**tráfego:** ligado, {rate} req/s"),
    "traffic_on_load": (
        "**traffic:** on, {load}x this engine's capacity = {rate} requests/s here "
        "(capacity {cap}/s)",
        "**tráfego:** ligado, {load}x a capacidade deste motor = {rate} requisições/s aqui "
        "(capacidade {cap}/s)",
    ),
    "traffic_on_rate": (
        "**traffic:** on, {rate} requests/s = {load}x this engine's capacity",
        "**tráfego:** ligado, {rate} requisições/s = {load}x a capacidade deste motor",
    ),
    "traffic_off": ("**traffic:** off", "**tráfego:** desligado"),
    "slots": ("slots", "slots"),
    "chunk_budget": ("chunk budget (tokens)", "orçamento de chunk (tokens)"),
    "kv_blocks": ("KV blocks", "blocos de KV"),
    "prefix_cache": ("prefix cache", "cache de prefixo"),
    "prefix_help": (
        "reuse the KV blocks of prompt prefixes already computed",
        "reaproveita os blocos de KV de prefixos de prompt já calculados",
    ),
    "policy": ("policy", "política"),
    "runner": ("runner", "executor"),
    "kv_layout": ("kv layout", "layout do KV"),
    # Step by step
    "step_title": ("Step by step", "Passo a passo"),
    "step_caption": (
        "Pause the engine and look at one step at a time: who is in each slot, what it computed, "
        "what entered and what left.",
        "Pause o motor e olhe um passo por vez: quem está em cada slot, o que calculou, o que "
        "entrou e o que saiu.",
    ),
    "pause": ("Pause", "Pausar"),
    "step_once": ("Step once", "Um passo"),
    "resume": ("Resume", "Retomar"),
    "step_once_help": (
        "One engine step; the engine must be paused first.",
        "Um passo do motor; pause o motor antes.",
    ),
    "engine_line": (
        "**engine:** {state} · step {step} · queue {queue} · running {running}",
        "**motor:** {state} · passo {step} · fila {queue} · rodando {running}",
    ),
    "paused": ("paused", "pausado"),
    "running": ("running", "rodando"),
    "no_steps": (
        "No steps recorded yet: send a chat or start traffic on the Live page, then pause here.",
        "Nenhum passo gravado ainda: mande uma conversa ou inicie tráfego na página Ao vivo, e "
        "pause aqui.",
    ),
    "back": ("Back", "Voltar"),
    "forward": ("Forward", "Avançar"),
    "recorded_step": ("recorded step", "passo gravado"),
    "step_head": (
        "Step {step} · {policy} · {runner} · {ms} ms",
        "Passo {step} · {policy} · {runner} · {ms} ms",
    ),
    "batch": ("Batch composition", "Composição do lote"),
    "col_slot": ("slot", "slot"),
    "col_request": ("request", "requisição"),
    "col_who": ("who", "quem"),
    "col_phase": ("phase", "fase"),
    "col_tokens": ("tokens this step", "tokens neste passo"),
    "col_kv_tokens": ("KV tokens", "tokens de KV"),
    "col_kv_blocks": ("KV blocks", "blocos de KV"),
    "person": ("person", "pessoa"),
    "traffic_who": ("traffic", "tráfego"),
    "kv_line": (
        "**KV**: {used}/{total} blocks · {stored} tokens stored of {alloc} allocated",
        "**KV**: {used}/{total} blocos · {stored} tokens guardados de {alloc} alocados",
    ),
    "queue_line": ("**queue**: {n} waiting", "**fila**: {n} esperando"),
    "why_static": (
        "a new static batch formed (slots filled or the fill timeout passed)",
        "um novo lote estático se formou (slots cheios ou o tempo de espera acabou)",
    ),
    "why_continuous": (
        "a slot and its prompt's KV were free, so it entered and its whole prompt was prefilled",
        "havia um slot e KV livres para o prompt, então entrou e o prompt inteiro foi "
        "pré-preenchido",
    ),
    "why_chunked": (
        "a slot was free; its prompt is prefilled in chunks within the step's token budget",
        "havia um slot livre; o prompt é pré-preenchido em pedaços dentro do orçamento do passo",
    ),
    "cached_note": (
        "; {n} of its prompt tokens came from the prefix cache (blocks another request already "
        "computed), so this step prefilled only the rest",
        "; {n} tokens do prompt vieram do cache de prefixo (blocos que outra requisição já "
        "calculou), então este passo pré-preencheu só o resto",
    ),
    "admitted": ("admitted #{rid}: {why}", "admitida #{rid}: {why}"),
    "ended": ("ended #{rid}: {why}", "terminou #{rid}: {why}"),
    "finished_after": (
        "finished after {n} tokens (EOS or max tokens)",
        "terminou após {n} tokens (EOS ou máximo de tokens)",
    ),
    "dead_note": (
        "; its slot stays dead until the whole batch ends",
        "; seu slot fica morto até o lote inteiro terminar",
    ),
    "preempted": (
        "preempted #{rid}: the KV pool ran out of blocks, so the newest running request gave its "
        "blocks back; it waits at the head of the queue and will be recomputed",
        "preemptada #{rid}: acabaram os blocos de KV, então a requisição mais nova devolveu os "
        "seus; ela espera no início da fila e será recalculada",
    ),
    "event": ("event: {kind} {changes}", "evento: {kind} {changes}"),
    "nothing": ("nothing entered or left in this step", "nada entrou nem saiu neste passo"),
    "slots_upto": ("Slots up to this step", "Slots até este passo"),
    "steps_upto": ("recorded steps up to step {step}", "passos gravados até o passo {step}"),
    # Lessons
    "lessons_title": ("Lessons", "Aulas"),
    "lessons_caption": (
        "Each lesson sets up a scenario on the live engine and says what to watch.",
        "Cada aula prepara um cenário no motor ao vivo e diz o que observar.",
    ),
    # Compare
    "cmp_title": ("Compare", "Comparar"),
    "cmp_caption": (
        "One workload, two configurations, each on a fresh engine with the same weights. The live "
        "engine is held while a comparison runs, so each run measures only itself. The ratios are "
        "measured, not modelled.",
        "Uma carga, duas configurações, cada uma num motor novo com os mesmos pesos. O motor ao "
        "vivo fica suspenso durante a comparação, então cada execução mede só a si mesma. As "
        "razões são medidas, não modeladas.",
    ),
    "cmp_held": (
        "A comparison is running: the live engine is held (no live steps, traffic waits) until it "
        "ends.",
        "Uma comparação está rodando: o motor ao vivo fica suspenso (sem passos, tráfego espera) "
        "até ela terminar.",
    ),
    "cmp_what": ("what to compare", "o que comparar"),
    # a configuration's other settings, as Compare and Lessons name them (app/i18n.py settings)
    "set_fill_timeout": ("batch wait (s)", "espera do lote (s)"),
    "set_host_work": ("host work (ms)", "trabalho de host (ms)"),
    "set_block_size": ("block size", "tamanho do bloco"),
    "set_model": ("model", "modelo"),
    "cmp_scale": ("workload scale", "escala da carga"),
    "cmp_scale_help": (
        "Fewer requests run faster on a CPU; 1.0 is the benchmark's full workload.",
        "Menos requisições rodam mais rápido na CPU; 1,0 é a carga completa do benchmark.",
    ),
    "cmp_line": ("workload **{w}** · A = {a} · B = {b}", "carga **{w}** · A = {a} · B = {b}"),
    "cmp_run": ("Run the comparison", "Rodar a comparação"),
    "cmp_wait": (
        "Replaying the workload twice on the real engine (the live engine is held meanwhile)…",
        "Repetindo a carga duas vezes no motor real (o motor ao vivo fica suspenso)…",
    ),
    "cmp_pick": ("Pick a comparison and run it.", "Escolha uma comparação e rode."),
    "cmp_rec": (
        "Recorded comparison of lesson {lesson}: workload **{w}**, scale {scale}.",
        "Comparação gravada da aula {lesson}: carga **{w}**, escala {scale}.",
    ),
    "cmp_one_run": (
        "This recording holds one run: a comparison needs two.",
        "Esta gravação tem uma execução só: uma comparação precisa de duas.",
    ),
    "count_based": (
        "**Count-based** (steps and tokens: the same on a busy or a quiet machine)",
        "**Por contagem** (passos e tokens: iguais numa máquina ocupada ou tranquila)",
    ),
    "wall_clock": (
        "**Wall-clock** (seconds: they move with the machine's load)",
        "**Relógio** (segundos: variam com a carga da máquina)",
    ),
    "measured_ratios": ("**Measured ratios**", "**Razões medidas**"),
    "metric": ("metric", "métrica"),
    "run_steps": ("run {side}: {n} steps", "execução {side}: {n} passos"),
    # metric names (Compare table and ratios)
    "k_throughput": ("useful tokens/s", "tokens úteis/s"),
    "k_ttft_p50": ("TTFT p50", "TTFT p50"),
    "k_itl_p50": ("ITL p50", "ITL p50"),
    "k_itl_p99": ("ITL p99", "ITL p99"),
    "k_itl_max": ("ITL max", "ITL máx."),
    "k_slot_utilization": ("slot utilization", "uso dos slots"),
    "k_dead_slot_fraction": ("dead-slot fraction", "slots mortos"),
    "k_kv_waste": ("KV waste", "desperdício de KV"),
    "k_busy_fraction": ("device busy", "dispositivo ocupado"),
    "k_peak_running": ("peak running", "pico rodando"),
    "k_steps": ("steps", "passos"),
    "k_wall_s": ("wall time", "tempo de relógio"),
    "k_decode_tput": ("decode tokens/s", "tokens/s de decode"),
    "k_tokens_per_step": ("tokens per step", "tokens por passo"),
    "k_slot_steps_per_token": ("slot-steps per token", "slot-passos por token"),
    "k_running_itl_max": ("running ITL max", "ITL máx. dos que rodavam"),
    "k_running_itl_p99": ("running ITL p99", "ITL p99 dos que rodavam"),
    # the roofline figure (app/roofline_chart.py; lesson 1)
    "roof_weights": ("weights", "pesos"),
    "roof_rows": ("rows in the decode step", "linhas no passo de decode"),
    "roof_time": ("decode step time (ms)", "tempo do passo de decode (ms)"),
    "roof_share": (
        "share of the measured read bandwidth ({bw} GB/s)",
        "fração da banda de leitura medida ({bw} GB/s)",
    ),
    "roof_fraction": ("share", "fração"),
    "roof_caption": (
        "Measured by `python -m engine.bench roofline` on {date} ({cpu}, {threads} threads): read "
        "bandwidth {bw} GB/s, fp32 GEMM {gf} GFLOP/s, int8 roof {i8} G ops/s. Dashed: the "
        "roofline's bound for each format (the slower of reading its bytes and doing its "
        "arithmetic at its roof). q4, 1 / 8 rows: {q1} / {q8} ms a step.",
        "Medido com `python -m engine.bench roofline` em {date} ({cpu}, {threads} threads): banda "
        "de leitura {bw} GB/s, GEMM fp32 {gf} GFLOP/s, teto int8 {i8} G ops/s. Tracejado: o limite "
        "do roofline de cada formato (o mais lento entre ler os seus bytes e fazer a sua "
        "aritmética no seu teto). q4, 1 / 8 linhas: {q1} / {q8} ms por passo.",
    ),
}
