"""Random engine programs for the property tests: submit / cancel / step / live reconfigure, and
hand-written scenarios random generation reaches only rarely (tests/core/test_properties.py)."""

from __future__ import annotations

from hypothesis import example
from hypothesis import strategies as st

EOS = 258
BLOCK_SIZE = 4
MAX_PROMPT = 20
MAX_NEW = 12
POLICIES = ("static", "continuous", "chunked")


# lengths drawn first so long prompts (which make paged runs preempt) are as likely as short ones
prompts = st.integers(1, MAX_PROMPT).flatmap(
    lambda n: st.lists(st.integers(0, 255), min_size=n, max_size=n)
)


def reconfig_changes(policies=POLICIES):
    return st.fixed_dictionaries(
        {},
        optional={
            "policy": st.sampled_from(policies),
            "max_slots": st.integers(1, 5),
            "kv_layout": st.sampled_from(("paged", "reserved")),
            # 8 blocks hold the longest request; 5..7 exercise the "budget shrank" failure
            "kv_blocks": st.integers(5, 24),
            "chunk_budget": st.integers(1, 12),
            "runner": st.sampled_from(("sync", "async")),
        },
    )


def programs(policies=POLICIES):
    submit = st.tuples(st.just("submit"), prompts, st.integers(1, MAX_NEW), st.booleans())
    op = st.one_of(
        submit,
        st.tuples(st.just("burst"), st.lists(submit, min_size=2, max_size=5)),
        st.tuples(st.just("cancel"), st.integers(0, 1 << 20)),
        st.tuples(st.just("step"), st.integers(1, 6)),
        st.tuples(st.just("reconfigure"), reconfig_changes(policies)),
        st.tuples(st.just("reconfigure"), reconfig_changes(policies)),
    )
    start = st.fixed_dictionaries(
        {
            "policy": st.sampled_from(policies),
            "max_slots": st.integers(1, 5),
            "kv_layout": st.sampled_from(("paged", "reserved")),
            "kv_blocks": st.integers(8, 16),  # tight enough that paged runs preempt
            "chunk_budget": st.integers(1, 12),
            "runner": st.sampled_from(("sync", "async")),
        }
    )
    return st.tuples(start, st.lists(op, min_size=3, max_size=25))


def _sub(n: int, max_new: int, ignore_eos: bool = True, first: int = 0) -> tuple:
    return ("submit", [(first + 7 * i) % 256 for i in range(n)], max_new, ignore_eos)


# Hand-written programs that random generation reaches only rarely; both engine-level properties run
# them.
SCENARIOS = [
    # pool runs dry under paged continuous, then chunked (small budget), static and back, fewer
    # slots
    (
        {
            "policy": "continuous",
            "max_slots": 5,
            "kv_layout": "paged",
            "kv_blocks": 8,
            "chunk_budget": 8,
        },
        [
            ("burst", [_sub(12, 12, first=k) for k in range(5)]),
            ("step", 4),
            ("reconfigure", {"policy": "chunked", "chunk_budget": 3, "runner": "async"}),
            ("step", 5),
            ("reconfigure", {"policy": "static"}),
            ("step", 6),
            ("reconfigure", {"policy": "continuous", "max_slots": 2}),
            ("step", 3),
            ("reconfigure", {"kv_layout": "reserved", "runner": "sync"}),
            ("cancel", 5),
            ("step", 2),
        ],
    ),
    # live decrease of slots and a KV budget shrunk below what is in use, then grown back
    (
        {
            "policy": "chunked",
            "max_slots": 5,
            "kv_layout": "paged",
            "kv_blocks": 16,
            "chunk_budget": 7,
        },
        [
            ("burst", [_sub(n, 10, first=n) for n in (3, 20, 9, 14, 5)]),
            ("step", 6),
            ("reconfigure", {"max_slots": 1}),
            ("step", 1),
            ("reconfigure", {"kv_blocks": 6}),
            ("step", 6),
            ("reconfigure", {"max_slots": 3, "kv_blocks": 24, "chunk_budget": 1}),
            ("step", 4),
            ("burst", [_sub(2, 3, False), _sub(17, 12, first=3)]),
            ("step", 2),
        ],
    ),
    # a static batch with dead slots is released into continuous mid-batch, then static again
    (
        {
            "policy": "static",
            "max_slots": 3,
            "kv_layout": "reserved",
            "kv_blocks": 24,
            "chunk_budget": 4,
            "runner": "async",
        },
        [
            ("burst", [_sub(4, 1), _sub(6, 6, False), _sub(8, 12)]),
            ("step", 3),
            ("reconfigure", {"policy": "continuous"}),
            ("submit", [1, 2, 3], 4, True),
            ("step", 2),
            ("reconfigure", {"policy": "static", "kv_layout": "paged", "kv_blocks": 8}),
            ("burst", [_sub(9, 5), _sub(11, 7)]),
            ("cancel", 1),
            ("step", 5),
        ],
    ),
]


def with_scenarios(test):
    for start, ops in SCENARIOS:
        test = example(program=(start, ops))(test)
    return test
