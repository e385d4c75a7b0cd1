"""The CUDA executor's host-side logic, on the CPU: decode batches padded to a graph size give the
real rows' logits unchanged and write K/V only to the scratch slot beyond them; the static-buffer
fill (with carry-over); the two alternating host buffers; the event-to-engine-clock arithmetic.
The GPU half is tests/core/test_cuda.py."""

from __future__ import annotations

import pytest
import torch

from engine.core.config import EngineConfig
from engine.core.cuda_exec import device_name
from engine.core.cuda_host import (
    GRAPH_SIZES,
    DecodeInputs,
    PinnedStaging,
    anchor,
    bucket,
    event_time,
    fill_static,
    flatten_inputs,
    graph_size,
    graph_width,
    lane_spans,
    pad_decode,
    padding,
    rebuild,
)
from engine.core.errors import InvalidConfig
from engine.core.llama import ForwardBatch
from kernels.attention import paged_decode_attention_torch


def test_bucket_picks_the_smallest_size_that_holds_the_batch():
    assert [bucket(n) for n in (1, 2, 3, 5, 8, 9, 33, 64)] == [1, 2, 4, 8, 8, 16, 64, 64]
    assert bucket(0) is None and bucket(65) is None
    assert bucket(3, (8, 2)) == 8  # any order of sizes
    assert graph_width(2048, 16) == 129  # 2048 tokens + the one being written
    assert GRAPH_SIZES == (1, 2, 4, 8, 16, 32, 64)


def _decode_state(make_tiny_engine, n: int):
    """An engine whose ``n`` requests are all decoding, and the decode-only batch of its next
    step with the block tables the CUDA build adds (built here by hand on the CPU)."""
    engine = make_tiny_engine(max_slots=n, block_size=4)
    for i in range(n):
        engine.submit(
            token_ids=[(5 * i + j) % 200 + 3 for j in range(3 + 2 * i)],
            max_new_tokens=20,
            ignore_eos=True,
        )
    engine.step()  # all prompts in one step (chunk_budget does not apply to continuous)
    engine.step()  # and a first decode step
    batch = engine.scheduler.schedule(engine.now())
    assert batch and all(k == 1 for _, k in batch.items) and not batch.dead
    fb, rows = engine.model_runner.build(batch)
    seqs = [s for s, _ in batch.items]
    width = max(len(s.block_table) for s in seqs)
    fb.decode_tables = torch.tensor(
        [s.block_table + [0] * (width - len(s.block_table)) for s in seqs], dtype=torch.int32
    )  # [n, width]
    fb.decode_lens = torch.tensor([s.num_computed + 1 for s in seqs], dtype=torch.int32)  # [n]
    return engine, fb, rows


def _graph_batch(static: DecodeInputs, size: int) -> ForwardBatch:
    """The batch a captured graph of ``size`` reads: views of the static buffers, as _capture
    builds it."""
    return ForwardBatch(
        input_ids=static.input_ids[:size],
        positions=static.positions[:size],
        write_slots=static.write_slots[:size],
        num_decode=size,
        decode_slots=None,
        decode_mask=None,
        logits_rows=torch.arange(size),
        decode_tables=static.tables[:size],
        decode_lens=static.lens[:size],
    )


def test_padded_decode_gives_the_real_rows_logits_and_touches_only_scratch(make_tiny_engine):
    engine, fb, rows = _decode_state(make_tiny_engine, 3)
    model_runner, cfg = engine.model_runner, engine.config
    fwd = model_runner.forward_impl
    width = graph_width(cfg.max_model_len, cfg.block_size)
    size = graph_size(fb, width)
    assert size == 4
    before_k = model_runner.cache.k.clone()
    static = padding(max(GRAPH_SIZES), width, model_runner.cache.scratch_slot, cfg.block_size)
    fill_static(
        static, pad_decode(fb, size, width, model_runner.cache.scratch_slot, cfg.block_size)
    )
    fwd.triton_decode = (
        paged_decode_attention_torch  # the Triton kernel's contract, by its torch reference
    )
    try:
        padded = fwd.forward(_graph_batch(static, size), model_runner.cache)  # [4, V]
    finally:
        fwd.triton_decode = None
    # slots
    changed = (
        (model_runner.cache.k != before_k).flatten(2).any(-1).any(0).nonzero().flatten().tolist()
    )
    scratch = model_runner.cache.scratch_slot
    assert set(changed) <= set(fb.write_slots.tolist()) | {scratch}
    assert scratch in changed  # the padding row did write, there only
    eager = fwd.forward(fb, model_runner.cache)  # [3, V], the torch decode path over padded slots
    assert padded.shape[0] == 4 and eager.shape[0] == 3
    torch.testing.assert_close(padded[:3], eager, rtol=1e-10, atol=1e-10)
    assert padded[:3].argmax(-1).tolist() == eager.argmax(-1).tolist()


def test_graph_size_refuses_what_must_run_eagerly(make_tiny_engine):
    _, fb, _ = _decode_state(make_tiny_engine, 2)
    assert graph_size(fb, 129) == 2
    assert graph_size(fb, fb.decode_tables.shape[1] - 1) is None  # a table wider than the graph's
    tables = fb.decode_tables
    fb.decode_tables = None  # static dead slots / the torch decode path
    assert graph_size(fb, 129) is None
    fb.decode_tables = tables
    fb.prefills = [object()]  # any prefill span makes it a mixed step
    assert graph_size(fb, 129) is None


def test_static_fill_overwrites_in_place_and_fills_carry_over():
    static = padding(8, 5, scratch_slot=40, block_size=4)
    addresses = {n: t.data_ptr() for n, t in static.tensors().items()}
    step = padding(4, 5, scratch_slot=40, block_size=4)
    step.input_ids[:] = torch.tensor([11, -1, 13, 0])  # row 1 is a placeholder (carry-over)
    step.lens[:2] = torch.tensor([7, 9], dtype=torch.int32)
    step.tables[0, :2] = torch.tensor([3, 4], dtype=torch.int32)
    prev = torch.tensor([100, 200, 300])
    fill_static(
        static, step, carry_dst=torch.tensor([1]), carry_src=torch.tensor([2]), prev_tokens=prev
    )
    assert {
        n: t.data_ptr() for n, t in static.tensors().items()
    } == addresses  # the graph's inputs stay put
    assert static.input_ids[:4].tolist() == [11, 300, 13, 0]
    assert static.lens[:4].tolist() == [7, 9, 1, 1] and static.tables[0, :3].tolist() == [3, 4, 0]
    # padding: scratch block 40 // 4
    assert static.tables[3, 0].item() == 10 and static.write_slots[3].item() == 40


class _Fence:
    """Stands in for a ``torch.cuda.Event`` (no GPU here): records whether it was waited on."""

    def __init__(self) -> None:
        self.waited = False

    def synchronize(self) -> None:
        self.waited = True


def test_pinned_staging_alternates_and_waits_for_its_own_set_only():
    st = PinnedStaging(pin=False)
    k0 = st.acquire()
    a = st.stage(k0, "input_ids", torch.arange(5))
    f0 = _Fence()
    st.fence(k0, f0)
    k1 = st.acquire()
    assert (k0, k1) == (0, 1) and not f0.waited  # step N+1 stages while step N's copy may still run
    b = st.stage(k1, "input_ids", torch.arange(5) * 10)
    # N's buffer untouched
    assert a.tolist() == [0, 1, 2, 3, 4] and b.tolist() == [
        0,
        10,
        20,
        30,
        40,
    ]
    f1 = _Fence()
    st.fence(k1, f1)
    # N+2 reuses N's set once N's copy is done
    assert st.acquire() == 0 and f0.waited and not f1.waited
    big = st.stage(0, "input_ids", torch.arange(200).view(20, 10))  # grows, keeps the shape
    assert big.shape == (20, 10) and big[19, 9].item() == 199
    mask = st.stage(0, "decode_mask", torch.tensor([[True, False]]))
    assert mask.dtype == torch.bool and mask.tolist() == [[True, False]]
    assert st.acquire() == 1 and f1.waited


def test_event_spans_on_the_engine_clock():
    t_ref = anchor(10.0, 10.00002)
    assert t_ref == pytest.approx(10.00001)
    assert event_time(t_ref, 2.5) == pytest.approx(10.00251)
    spans = lane_spans(2.0, {"h2d": (1.0, 1.5), "compute": (1.2, 9.2), "d2h": (9.3, 9.4)})
    assert [s["lane"] for s in spans] == ["h2d", "compute", "d2h"]
    h2d, compute, d2h = spans
    assert compute["start"] == pytest.approx(2.0012) and compute["end"] == pytest.approx(2.0092)
    assert h2d["end"] > compute["start"]  # overlapping lanes stay overlapping on the engine clock
    assert d2h["start"] >= compute["end"]


def test_flattened_inputs_rebuild_the_same_mixed_step(make_tiny_engine):
    engine = make_tiny_engine(max_slots=3, block_size=4)
    engine.submit(token_ids=list(range(3, 12)), max_new_tokens=8, ignore_eos=True)
    engine.step()
    for p in ([20, 21, 22, 23, 24, 25, 26], [30, 31, 32, 33, 34]):
        engine.submit(token_ids=p, max_new_tokens=8, ignore_eos=True)
    engine._drain_inbox()
    batch = engine.scheduler.schedule(engine.now())
    fb, _ = engine.model_runner.build(batch)
    assert fb.num_decode == 1 and len(fb.prefills) == 2 and graph_size(fb, 129) is None
    flat = flatten_inputs(fb)
    assert flat["ctx_slots"].shape[0] == sum(p.ctx_slots.shape[0] for p in fb.prefills)
    copy = rebuild(fb, {n: t.clone() for n, t in flat.items()})
    saved_k, saved_v = engine.model_runner.cache.k.clone(), engine.model_runner.cache.v.clone()
    a = engine.model_runner.forward_impl.forward(fb, engine.model_runner.cache)
    engine.model_runner.cache.k.copy_(saved_k)
    engine.model_runner.cache.v.copy_(saved_v)
    b = engine.model_runner.forward_impl.forward(copy, engine.model_runner.cache)
    assert torch.equal(a, b)


def test_cuda_graphs_setting_and_the_cpu_path_untouched(make_tiny_engine):
    assert EngineConfig().cuda_graphs is True
    with pytest.raises(InvalidConfig):
        EngineConfig(cuda_graphs="yes")
    with pytest.raises(InvalidConfig):
        EngineConfig().updated(cuda_graphs=False)  # not live: graphs are captured at start
    assert make_tiny_engine().cuda is None
    assert device_name("cpu")


def test_server_hello_and_state_name_the_device(make_tiny_engine):
    import asyncio
    import json

    from websockets.asyncio.client import connect

    from engine.server.server import Server

    server = Server(make_tiny_engine(), "127.0.0.1", 0, None)
    _, stop = server.run_in_thread()
    try:

        async def hello() -> dict:
            async with connect(f"ws://127.0.0.1:{server.port}") as ws:
                return json.loads(await ws.recv())

        msg = asyncio.run(hello())
    finally:
        stop()
    assert msg["device"] == msg["state"]["device"] == "cpu"
    assert msg["device_name"] == msg["state"]["device_name"] == device_name("cpu") != ""
    assert msg["state"]["cuda_graphs"] is False  # no graphs on the CPU, whatever the setting


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
@pytest.mark.parametrize(
    "module,args",
    [
        ("engine.lesson", ["1"]),
        ("engine.lesson", ["all", "--live"]),
        ("engine.bench", ["batching"]),
    ],
)
def test_lesson_and_bench_refuse_cuda_without_a_gpu(module, args):
    import importlib

    main = importlib.import_module(module).main
    with pytest.raises(SystemExit) as err:  # before any model is loaded: the check comes first
        main([*args, "--device", "cuda"])
    assert "device_unavailable" in str(err.value.code) and "cuda" in str(err.value.code)
