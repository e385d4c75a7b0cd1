"""Fluxo's serving engine: continuous batching over a paged KV cache, with telemetry."""
