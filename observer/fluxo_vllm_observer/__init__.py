"""Fluxo's read-only observer inside vLLM (issue 38; docs/observe.md).

``ObservedScheduler`` (``--scheduler-cls fluxo_vllm_observer.scheduler.ObservedScheduler``)
subclasses vLLM's scheduler, always calls the parent, and publishes one record per engine step and
data-parallel rank over ZMQ (``record.py`` says what a record holds; ``publish.py`` how it is sent
without ever blocking the engine). ``record.py`` and ``publish.py`` import nothing of vLLM.
"""

# The vLLM releases whose internals the observer was read against (scheduler.py): 0.32.x.
VLLM_RANGE = (">=0.32", "<0.33")
WIRE_VERSION = 1  # the record's format; the sidecar refuses another
ENV_ADDR = "FLUXO_OBSERVER_ADDR"  # where records go: a ZMQ endpoint the sidecar binds
