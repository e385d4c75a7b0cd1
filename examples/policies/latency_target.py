"""Latency target: size each step's token budget so a decoding request's next token stays within
an inter-token-latency target, priced on the engine's own cost model.

Chunked prefill with a fixed budget guesses; this asks the cost model (engine/core/cost_model.py,
fitted on this machine's steps, or the scorer's priced clock) what a decode-only step costs now,
and takes the largest budget whose step costs at most TARGET_S: Sarathi-Serve's token budget from
a latency target. Before the model is fitted, it falls back to the configured chunk budget.

    python -m engine.policy score examples/policies/latency_target.py
"""

from engine.core.policy import Policy

TARGET_S = 0.12  # the inter-token gap a decoding request may see


class LatencyTarget(Policy):
    name = "latency-target"

    def token_budget(self, view):
        decodes = max(1, sum(r.pending <= 1 for r in view.running))
        context = max((r.prompt_len + r.generated for r in view.running), default=1)
        decode_step = view.step_cost_s(decodes, decodes, decodes * context)
        if not decode_step:
            return view.chunk_budget  # no cost model yet
        budget = view.itl_chunk_budget(TARGET_S / decode_step)
        return max(decodes + 1, min(budget or view.chunk_budget, 4096))
