FROM python:3.11-slim
WORKDIR /fluxo
RUN apt-get update && apt-get install -y --no-install-recommends make && rm -rf /var/lib/apt/lists/*
COPY requirements.txt Makefile ./
RUN make setup
COPY . .
EXPOSE 8765 8501
CMD ["make", "lab"]
