#!/usr/bin/env bash
# `make lab`: start the engine server and the lab page, wait for both, print the URL, stop both on Ctrl-C.
# Env: FLUXO_MODEL (default smollm2), FLUXO_ENGINE_PORT (8765), FLUXO_PAGE_PORT (8501), FLUXO_HOST (127.0.0.1;
# 0.0.0.0 in Docker), FLUXO_TOKEN (presenter token; the page then asks each browser for it).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
MODEL=${FLUXO_MODEL:-smollm2}
EPORT=${FLUXO_ENGINE_PORT:-8765}
PPORT=${FLUXO_PAGE_PORT:-8501}
HOST=${FLUXO_HOST:-127.0.0.1}
export FLUXO_ENGINE_URL="ws://127.0.0.1:${EPORT}"

# The engine stays on loopback: only the page talks to it. Students reach the page.
"$PY" -m engine.serve --model "$MODEL" --host "${FLUXO_ENGINE_HOST:-127.0.0.1}" --port "$EPORT" &
ENGINE=$!
"$PY" -m streamlit run app/streamlit_app.py --server.headless true --server.address "$HOST" \
    --server.port "$PPORT" --browser.gatherUsageStats false >/dev/null &
PAGE=$!
cleanup() { kill "$PAGE" "$ENGINE" 2>/dev/null || true; wait "$PAGE" "$ENGINE" 2>/dev/null || true; }
trap cleanup EXIT INT TERM

for _ in $(seq 1 600); do  # the first start converts the bundled GGUF (~20 s); later ones take ~1 s
  if "$PY" -c "import socket,sys; socket.create_connection(('127.0.0.1', $EPORT), 0.5)" 2>/dev/null \
     && curl -fs "http://127.0.0.1:${PPORT}/_stcore/health" >/dev/null 2>&1; then
    echo
    echo "  Fluxo lab is up:  http://localhost:${PPORT}   (engine: ${FLUXO_ENGINE_URL}, model: ${MODEL})"
    echo "  Ctrl-C stops both."
    wait -n "$ENGINE" "$PAGE"
    exit $?
  fi
  kill -0 "$ENGINE" 2>/dev/null || { echo "the engine server exited" >&2; exit 1; }
  kill -0 "$PAGE" 2>/dev/null || { echo "the page exited" >&2; exit 1; }
  sleep 0.5
done
echo "timed out waiting for the engine and the page" >&2
exit 1
