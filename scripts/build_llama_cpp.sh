#!/usr/bin/env bash
# Build llama.cpp's `llama-server`, `llama-bench` and `llama-batched-bench` for the Fluxo peer
# benchmarks (`peer`, and `roofline`'s llama.cpp decode steps).
#
# The source is the copy of llama.cpp vendored in the `llama-cpp-python` sdist on PyPI (the one
# registry this lab can reach), so the build needs no git clone. It installs into .peers/llama.cpp/
# (git-ignored); `python -m engine.bench peer` and `python -m engine.bench roofline` look there
# (or at $FLUXO_LLAMA_CPP) and say they skipped llama.cpp when nothing is installed.
#
# Usage:   scripts/build_llama_cpp.sh [VERSION]      (default: the version pinned below)
# Env:     JOBS=2 (make -j), PYTHON=.venv/bin/python, PREFIX=.peers/llama.cpp
# Takes about 10 minutes on 2 cores; run it under `nice -n 10` on a shared machine.
# CPU only: no CUDA/Metal/BLAS; GGML_NATIVE=ON tunes for the machine it is built on, so build on
# the machine that will run it.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VERSION="${1:-0.3.36}"
JOBS="${JOBS:-2}"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
PREFIX="${PREFIX:-$ROOT/.peers/llama.cpp}"
WORK="$PREFIX/src"

command -v cmake >/dev/null || { echo "build_llama_cpp: cmake is required" >&2; exit 2; }
command -v c++ >/dev/null || { echo "build_llama_cpp: a C++ compiler is required" >&2; exit 2; }

mkdir -p "$WORK"
cd "$WORK"
if [ ! -d "llama-cpp-python-$VERSION" ]; then
  "$PYTHON" -m pip download --no-deps --no-binary llama-cpp-python -d . "llama-cpp-python==$VERSION"
  tar xzf "llama_cpp_python-$VERSION.tar.gz" 2>/dev/null \
    || tar xzf "llama-cpp-python-$VERSION.tar.gz"
  # The sdist unpacks as llama_cpp_python-VERSION; give it one stable name.
  [ -d "llama_cpp_python-$VERSION" ] && mv "llama_cpp_python-$VERSION" "llama-cpp-python-$VERSION"
fi
SRC="$WORK/llama-cpp-python-$VERSION/vendor/llama.cpp"
[ -f "$SRC/CMakeLists.txt" ] || { echo "build_llama_cpp: no vendored llama.cpp in $SRC" >&2; exit 3; }

cmake -S "$SRC" -B "$WORK/build" -G Ninja \
  -DCMAKE_BUILD_TYPE=Release \
  -DBUILD_SHARED_LIBS=OFF \
  -DGGML_NATIVE=ON \
  -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_BLAS=OFF -DGGML_OPENMP=ON \
  -DLLAMA_CURL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON
cmake --build "$WORK/build" -j "$JOBS" --target llama-server llama-bench llama-batched-bench

mkdir -p "$PREFIX/bin"
for exe in llama-server llama-bench llama-batched-bench; do
  cp "$WORK/build/bin/$exe" "$PREFIX/bin/$exe"
done
echo "$VERSION" > "$PREFIX/VERSION"
"$PREFIX/bin/llama-bench" --help >/dev/null 2>&1 || true
echo "build_llama_cpp: installed llama-server, llama-bench and llama-batched-bench in $PREFIX/bin (llama-cpp-python $VERSION)"
