"""The cost model behind the stall chart: it learns a machine's quiet step costs, and a step slowed
from outside (not by its own work) stands out against its expected duration."""

from __future__ import annotations

import random
import time

import numpy as np

from engine.core.cost_model import CostModel, StepWork


def _true_cost(w: StepWork) -> float:
    return 0.020 + 0.0004 * w.tokens + 0.001 * w.logit_rows + 0.00002 * w.attention_pairs / 1000


def test_the_lower_envelope_recovers_quiet_costs_under_outside_load():
    rng = random.Random(0)
    model = CostModel()
    for i in range(300):
        if i % 3 == 0:  # prefill-like steps
            w = StepWork(
                tokens=rng.randint(16, 600),
                logit_rows=rng.randint(1, 8),
                attention_pairs=rng.randint(1000, 200_000),
            )
        else:
            rows = rng.randint(1, 32)
            w = StepWork(tokens=rows, logit_rows=rows, attention_pairs=rows * rng.randint(20, 600))
        # 40 % of steps loaded
        slowdown = 1 + (rng.random() * 4 if rng.random() < 0.4 else rng.random() * 0.05)
        model.observe(w, _true_cost(w) * slowdown, 0.001)
    assert model.ready
    for w in (
        StepWork(1, 1, 100),
        StepWork(8, 8, 4000),
        StepWork(512, 1, 150_000),
        StepWork(64, 64, 30_000),
    ):
        predicted = model.predict_compute(w)
        assert abs(predicted / _true_cost(w) - 1) < 0.10, (w, predicted, _true_cost(w))
        assert abs(model.expected(w) - predicted - 0.001) < 1e-3  # host work at its lower quartile


def test_not_ready_until_the_samples_span_batch_sizes():
    model = CostModel(min_samples=12)
    for _ in range(40):  # the same decode shape only: the coefficients cannot be told apart
        model.observe(StepWork(4, 4, 400), 0.05, 0.001)
    assert not model.ready and model.expected(StepWork(4, 4, 400)) is None
    for n in (64, 128, 256):
        model.observe(StepWork(n, 1, n * n), 0.05 + n * 0.0004, 0.001)
    assert model.ready


def test_engine_records_carry_expected_and_a_slowed_step_stands_out(make_tiny_engine):
    engine = make_tiny_engine(max_slots=4, kv_blocks=256, block_size=4, dtype="float32")
    took = engine.calibrate(rounds=((1, 8), (4, 16), (4, 48), (2, 96)))
    assert (
        took > 0
        and engine.cost_model.ready
        and engine.step_count == 0
        and not engine.telemetry.steps
    )
    run_execute = engine.model_runner.execute
    slowed: set[int] = set()

    took: list[float] = []

    # outside load on a few steps: the forward is held back 8x its usual time
    def execute(*args, **kwargs):
        if engine.step_count in (10, 20, 30):
            slowed.add(engine.step_count + 1)
            time.sleep(8 * sorted(took)[len(took) // 2])
        t0 = time.perf_counter()
        out = run_execute(*args, **kwargs)
        took.append(time.perf_counter() - t0)
        return out

    engine.model_runner.execute = execute
    for i in range(4):
        engine.submit(token_ids=list(range(5, 30 + 3 * i)), max_new_tokens=40, ignore_eos=True)
    engine.run_until_idle()
    steps = list(engine.telemetry.steps)
    assert all(r["expected_s"] is not None and r["expected_s"] > 0 for r in steps)
    ratio = {r["step"]: (r["t_end"] - r["t_start"]) / r["expected_s"] for r in steps}
    quiet = sorted(v for k, v in ratio.items() if k not in slowed)
    # ~1 on a quiet machine; other load on it scales every step alike
    typical = quiet[len(quiet) // 2]
    assert slowed and all(ratio[s] > 3 * typical for s in slowed), (
        {s: ratio[s] for s in slowed},
        typical,
    )


def test_itl_chunk_budget_is_the_largest_within_the_target():
    """By hand: 2 ms a step, 0.4 ms a row, 1 ms a head row, no attention cost. 6 decodes cost
    2 + 2.4 + 6 = 10.4 ms; a budget b costs 2 + 0.4 b + 7 (6 decodes and the prompt's last row),
    <= 20.8 while b <= 29.5, and <= 15.6 (1.5x) while b <= 16.5."""
    from engine.core.cost_model import CostModel, itl_chunk_budget

    model = CostModel()
    assert itl_chunk_budget(model, 6, 300, 384) is None  # not fitted yet
    model.coef = np.array([0.002, 0.0004, 0.001, 0.0, 0.0])
    assert itl_chunk_budget(model, 6, 300, 384) == 29
    assert itl_chunk_budget(model, 6, 300, 384, factor=1.5) == 16
    model.coef = np.array([0.002, 0.0004, 0.001, 0.001, 0.001])  # attention costs: a smaller budget
    assert itl_chunk_budget(model, 6, 300, 384) < 29
