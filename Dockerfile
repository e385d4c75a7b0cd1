FROM python:3.11-slim
WORKDIR /fluxo
RUN apt-get update && apt-get install -y --no-install-recommends make curl chromium && rm -rf /var/lib/apt/lists/*
COPY requirements.txt Makefile ./
RUN make setup
COPY . .
EXPOSE 8765 8501
# The page listens on all interfaces inside the container; the engine stays on its loopback.
ENV FLUXO_HOST=0.0.0.0
CMD ["make", "lab"]
