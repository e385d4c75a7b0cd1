"""Property tests (hypothesis) of the engine under random programs (the programs:
tests/core/engine_programs.py; the step-by-step checker: tests/core/engine_harness.py).

1. The block pool alone, as a state machine: tests/core/test_block_pool.py.
2. Random programs against the engine (submit, cancel, step, live reconfigure, then drain): the
   scheduler's contracts hold at every step and every request ends exactly once.
3. Preemption under a tight paged budget does not change greedy outputs.
4. Greedy outputs do not depend on policy, layout, runner, slots, budget or live switches.

Everything runs on the tiny float64 Llama (byte tokenizer, EOS = 258): a step takes a few ms.
Engine bugs these properties found are pinned at the end by their minimal reproductions, now
regression tests: BUG-A (fixed in c486857) and BUG-B (fixed in edf3bb1).
"""

from __future__ import annotations

import pytest
from engine_harness import Harness, check_greedy, reference, run_program
from engine_programs import programs, with_scenarios
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.core.sequence import Status

# One intra-op thread (tests/conftest.py): on a busy 2-core machine torch's thread pool made a
# step ~100x slower (7 s instead of 0.04 s for one preemption run).
pytestmark = pytest.mark.usefixtures("one_torch_thread")


PROP = dict(
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)


# --------------------------------------------------------------------------------------------------
# 2. Engine invariants under random programs
# --------------------------------------------------------------------------------------------------


@settings(max_examples=150, **PROP)
@with_scenarios
@given(programs())
def test_random_programs_keep_engine_invariants(make_tiny_engine, program):
    start, ops = program
    run_program(make_tiny_engine, start, ops)


# --------------------------------------------------------------------------------------------------
# 3. Preemption does not change greedy outputs
# --------------------------------------------------------------------------------------------------


@settings(max_examples=20, **PROP)
@given(
    policy=st.sampled_from(("continuous", "static")),
    runner=st.sampled_from(("sync", "async")),
    reqs=st.lists(
        st.tuples(st.lists(st.integers(0, 255), min_size=8, max_size=12), st.integers(8, 12)),
        min_size=4,
        max_size=5,
    ),
)
def test_preemption_keeps_greedy_outputs(make_tiny_engine, policy, runner, reqs):
    # Each request needs 4..6 blocks at full length and fits alone in 10; three running together
    # need 12 by the time each has 5 outputs (none can have finished), so the pool must run dry.
    outputs = {}
    for kv_blocks in (10, 64):
        hz = Harness(
            make_tiny_engine(
                policy=policy, runner=runner, kv_layout="paged", kv_blocks=kv_blocks, max_slots=4
            )
        )
        handles = [hz.submit(p, n, True) for p, n in reqs]
        hz.drain()
        hz.check_end()
        outputs[kv_blocks] = [h.token_ids for h in handles]
        if kv_blocks == 10:
            assert hz.preempted, "no preemption happened: the test would be meaningless"
            assert any(h.seq.preemptions for h in handles)
        else:
            assert not hz.preempted
        assert all(h.seq.status is Status.FINISHED for h in handles)
    assert outputs[10] == outputs[64]
    assert outputs[10] == [reference(make_tiny_engine, p, n, True) for p, n in reqs]


# --------------------------------------------------------------------------------------------------
# 4. Greedy outputs do not depend on the schedule
# --------------------------------------------------------------------------------------------------


@settings(max_examples=100, **PROP)
@with_scenarios
@given(programs())
def test_greedy_outputs_independent_of_schedule(make_tiny_engine, program):
    start, ops = program
    hz = run_program(make_tiny_engine, start, ops)
    check_greedy(make_tiny_engine, hz)


# --------------------------------------------------------------------------------------------------
# Bugs these properties found: minimal reproductions, kept as regression tests
# --------------------------------------------------------------------------------------------------


def test_bug_a_one_token_prefill_chunk_does_not_sample(make_tiny_engine):
    """BUG-A (fixed in c486857): a 1-token prefill chunk that does not finish the prompt rode with
    the decodes in ModelRunner.build and sampled a token mid-prompt: [1, 2, 3, 4, 5] under
    chunk_budget=1 gave [258, 258, 258, 96] instead of [40, 40, 182, 87]."""
    prompt = [1, 2, 3, 4, 5]
    ref = reference(make_tiny_engine, prompt, 4, True)
    e = make_tiny_engine(policy="chunked", chunk_budget=1)
    h = e.submit(token_ids=prompt, max_new_tokens=4, ignore_eos=True)
    for _ in range(len(prompt) - 1):  # one prompt token per step; none of these steps may sample
        rec = e.step()
        assert rec["tokens"] == {"prefill": 1, "decode": 0, "dead": 0}
        assert h.token_ids == [], "a token was sampled before the prompt was complete"
    e.run_until_idle()
    assert h.token_ids == ref


@pytest.mark.parametrize("policy", ["continuous", "static"])
def test_bug_b_last_token_step_is_recorded(make_tiny_engine, policy):
    """BUG-B (present up to c486857; fixed in edf3bb1 by the prepare/execute/finish step):
    the record was built after the step's bookkeeping, so a request computing its last token was
    already gone from the running list: its slot showed 'idle' with 0 tokens (continuous/chunked) or
    'dead' (static, while tokens['dead'] said 0), and tokens['prefill'] + tokens['decode']
    undercounted."""
    e = make_tiny_engine(policy=policy)
    h = e.submit(token_ids=[1, 2, 3, 4, 5], max_new_tokens=2, ignore_eos=True)
    first = e.step()  # prefill of 5 tokens, samples output 1
    last = e.step()  # decode of 1 token, samples output 2: the request finishes
    assert first["tokens"] == {"prefill": 5, "decode": 0, "dead": 0}
    assert last["finished"] == [h.id]
    assert last["tokens"] == {"prefill": 0, "decode": 1, "dead": 0}
    assert {"slot": 0, "request": h.id, "phase": "decode", "tokens": 1} in last["slots"], last[
        "slots"
    ]
