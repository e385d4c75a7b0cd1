"""The engine core: requests, scheduler, KV block manager, model runners and telemetry.

It imports nothing from the other layers (server, workloads, lab), so it can be read, tested and
reused alone: ``engine.core.engine.Engine`` is the whole serving engine of one process.
"""
