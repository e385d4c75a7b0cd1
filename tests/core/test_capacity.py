"""Offered load in units of capacity (engine/workloads/capacity.py): the requests/s at which the
engine would be 100 % busy, from the cost model's prices, the traffic's counted shape and the
configuration; checked by hand, then against a real engine's own steps."""

from __future__ import annotations

import time
from collections import deque

import numpy as np
import pytest

from engine.core.config import EngineConfig
from engine.core.cost_model import CostModel, StepWork
from engine.core.requests import encode
from engine.workloads import capacity
from engine.workloads.traffic import TrafficParams, TrafficSource


def _priced(c0=0.002, tok=0.0002, row=0.0003, pre=0.0, dec=0.0, host=0.0) -> CostModel:
    model = CostModel()
    model.coef = np.array([c0, tok, row, pre, dec])
    model.host = deque([host])
    return model


def test_capacity_by_hand():
    """2 ms a step, 0.2 ms a token, 0.3 ms a logit row, attention free. 8 slots: a decode step of
    8 rows is 2 + 8 x 0.5 = 6 ms, so 32 answer tokens take 32 x 6 / 8 = 24 ms of steps; the
    40-token prompt adds 40 x 0.2 + 0.3 = 8.3 ms to the step that carries it: 32.3 ms a request,
    30.96 requests/s. One slot: 32 x 2.5 + 8.3 = 88.3 ms, 11.3 requests/s."""
    shape = capacity.Shape(prompt=40, shared=0, answer=32, reserve=72)
    cfg = EngineConfig(model="tiny", max_slots=8, kv_blocks=1024, prefix_cache=False)
    assert capacity.capacity(_priced(), shape, cfg) == pytest.approx(1 / 0.0323)
    one = cfg.updated(max_slots=1)
    assert capacity.capacity(_priced(), shape, one) == pytest.approx(1 / 0.0883)
    # the host work around each step is shared by the rows like the forward's fixed part: 4 ms a
    # step, 32 x 4 / 8 = 16 ms more a request
    assert capacity.capacity(_priced(host=0.004), shape, cfg) == pytest.approx(1 / 0.0483)
    assert capacity.capacity(CostModel(), shape, cfg) is None  # not fitted: no capacity


def test_memory_can_bind_before_the_slots():
    """A reserved layout holds prompt + max_new_tokens per sequence: 40 blocks of 16 tokens hold 3
    reservations of 166 tokens (11 blocks each); paged holds what is stored (~56 tokens: 4
    blocks), so all 8 slots."""
    shape = capacity.Shape(prompt=40, shared=0, answer=32, reserve=166)
    assert capacity.concurrency(shape, 8, 40, 16, "reserved", False) == 3
    assert capacity.concurrency(shape, 8, 40, 16, "paged", False) == 8
    reserved = EngineConfig(model="tiny", max_slots=8, kv_blocks=40, kv_layout="reserved")
    paged = reserved.updated(kv_layout="paged")
    assert capacity.capacity(_priced(), shape, reserved) < capacity.capacity(
        _priced(), shape, paged
    )


def test_the_shape_is_the_traffics_own_first_arrivals():
    params = TrafficParams(prompts="chat", lengths="uniform", median=24, seed=5)
    words = lambda p: p.split()  # noqa: E731 - a stand-in tokenizer: one id per word
    shape = capacity.shape_of(params, words)
    source = TrafficSource(params)
    first = [source.next() for _ in range(capacity.SAMPLE)]
    assert shape.answer == 24  # uniform: every answer is the median
    assert shape.prompt == pytest.approx(np.mean([len(a.prompt.split()) for a in first]))
    assert shape.reserve == pytest.approx(shape.prompt + 24)
    lognormal = capacity.shape_of(
        TrafficParams(lengths="lognormal", median=40, max_tokens=64), words
    )
    assert 8 <= lognormal.answer <= 64


def test_capacity_predicts_a_real_engines_burst(make_tiny_engine):
    """The tiny model on this machine: a burst of the traffic's own requests, kept at full slots,
    runs at the capacity the calibrated model computes, within a factor the machine's noise
    allows (the lab's figure is the requests/s that keep the engine 100 % busy)."""
    engine = make_tiny_engine(max_slots=4, kv_blocks=512, block_size=16, dtype="float32")
    engine.calibrate(rounds=((1, 8), (4, 16), (1, 96), (4, 48)))
    params = TrafficParams(prompts="chat", lengths="uniform", median=16)
    shape = capacity.shape_of(params, lambda p: encode(engine.tokenizer, prompt=p))
    cap = capacity.capacity(engine.cost_model, shape, engine.config)
    source = TrafficSource(params)
    t0 = time.perf_counter()
    for _ in range(32):
        a = source.next()
        engine.submit(prompt=a.prompt, max_new_tokens=a.max_new_tokens, ignore_eos=True)
    engine.run_until_idle()
    measured = 32 / (time.perf_counter() - t0)
    # a lower-envelope model promises the quiet machine's rate: a loaded one runs slower, never
    # much faster
    assert 0.15 * cap <= measured <= 1.6 * cap, (measured, cap)


def test_decode_and_prompt_attention_are_priced_apart():
    """A decode row reads its whole cache for one query; a prompt chunk shares each read: the
    model recovers both prices from steps that mix them."""
    rng = np.random.default_rng(0)
    model = CostModel()

    def true(w: StepWork) -> float:
        pre = w.attention_pairs - w.decode_pairs
        return (
            0.002 + 0.0003 * w.tokens + 0.0005 * w.logit_rows + 1e-7 * pre + 3e-6 * w.decode_pairs
        )

    for i in range(200):
        rows = int(rng.integers(1, 16))
        ctx = int(rng.integers(16, 800))
        chunk = int(rng.integers(16, 400)) if i % 3 == 0 else 0
        w = StepWork(rows + chunk, rows + (chunk > 0), rows * ctx + chunk * chunk, rows * ctx)
        model.observe(w, true(w), 0.0)
    for w in (StepWork(8, 8, 8 * 600, 8 * 600), StepWork(300, 1, 90_000, 0)):
        assert model.predict_compute(w) == pytest.approx(true(w), rel=0.05)
