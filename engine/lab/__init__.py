"""The lab around the engine: the replay driver, lesson scenarios, benchmarks, peers, the roofline
and the launcher that starts the server and the page together (``python -m engine.lab``).
"""
