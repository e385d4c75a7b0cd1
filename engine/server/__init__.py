"""The live server: the websocket protocol, the OpenAI-style HTTP API and the Prometheus metrics
around one running engine. It never imports the lab; the comparison it runs for the page is
handed to it by the command that starts it (``engine.serve``).
"""
