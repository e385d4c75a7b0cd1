"""Shortest prompt first: of the requests waiting, admit those with the fewest tokens to compute.

Short questions stop waiting behind long pasted documents, so the median time to first token
falls. The price is starvation: while short requests keep coming, a long one may wait for ever,
and the fairness index across clients shows it.

    python -m engine.policy score examples/policies/shortest_prompt_first.py
"""

from engine.core.policy import Policy


class ShortestPromptFirst(Policy):
    name = "shortest-first"

    def admit(self, view):
        order = sorted(view.waiting, key=lambda w: (w.num_tokens, w.arrival))
        return [w.id for w in order[: view.free_slots]]
