"""Fluxo watching a real vLLM (issue 38): the sidecar that turns the observer's records into
Fluxo's step records and serves them over Fluxo's websocket protocol. See docs/observe.md."""
