"""Fair share per client: a free slot goes to the client holding the fewest slots now.

The class is the load: when one student's script floods the queue, first come first served hands
that student every slot that frees, and everyone else waits behind the flood. Here each free slot
goes to whoever holds fewest (first come first served among equals), so one client can never
starve the others, however many requests it queues.

    python -m engine.policy score examples/policies/fair_share.py
"""

from collections import Counter

from engine.core.policy import Policy


class FairShare(Policy):
    name = "fair-share"

    def admit(self, view):
        held = Counter(r.client for r in view.running)
        picked = []
        queue = list(view.waiting)  # arrival order (preempted requests first)
        while queue and len(picked) < view.free_slots:
            best = min(queue, key=lambda w: held[w.client])  # the first of the least served
            held[best.client] += 1
            picked.append(best.id)
            queue.remove(best)
        return picked
