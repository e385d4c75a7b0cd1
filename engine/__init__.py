"""Fluxo's serving engine: continuous batching over a paged KV cache, with telemetry."""

import sys

if sys.version_info < (3, 11):  # noqa: UP036 - tomllib, typing features; pip's requires-python says the same
    raise SystemExit(f"Fluxo needs Python 3.11 or newer; this is Python {sys.version.split()[0]}.")
