"""Fluxo's serving engine: continuous batching over a paged KV cache, with telemetry."""

import sys

if sys.version_info < (3, 11):  # noqa: UP036 - tomllib, typing features; pip's requires-python says the same
    raise SystemExit(f"Fluxo needs Python 3.11 or newer; this is Python {sys.version.split()[0]}.")

__version__ = "0.3.0"  # pyproject.toml says the same (tests/test_packaging.py)
