"""DecodeGraphs on the CPU: the padding, the ladder size chosen and the copying of live rows, through a toy
forward that records what it was given (no capture happens off CUDA, the buffers are the same)."""
from __future__ import annotations

import contextlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from inferd.engine.torch.graphs import DecodeGraphs, batch_ladder
from inferd.engine.torch.inputs import DecodeInputs

VOCAB = 8
SCRATCH = 1000
MAX_BLOCKS = 4


class RecordingForward:
    """Logits that spell out each row's inputs: token, position, slot, context_len, sum of its blocks."""

    def __init__(self):
        self.calls: list[DecodeInputs] = []

    def __call__(self, inputs: DecodeInputs) -> torch.Tensor:
        self.calls.append(DecodeInputs(*(t.clone() for t in (
            inputs.token_ids, inputs.positions, inputs.slot_mapping, inputs.block_tables, inputs.context_lens))))
        logits = torch.zeros(len(inputs.token_ids), VOCAB)
        logits[:, 0] = inputs.token_ids.float()
        logits[:, 1] = inputs.positions.float()
        logits[:, 2] = inputs.slot_mapping.float()
        logits[:, 3] = inputs.context_lens.float()
        logits[:, 4] = inputs.block_tables.sum(dim=1).float()
        return logits


@pytest.fixture
def forward():
    return RecordingForward()


@pytest.fixture
def graphs(forward):
    return DecodeGraphs(forward, batch_sizes=[1, 2, 4, 8], max_blocks_per_seq=MAX_BLOCKS, vocab_size=VOCAB,
                        scratch_slot=SCRATCH, device=torch.device("cpu"))


def batch(rows: int, base: int = 1):
    """rows live rows with distinct values; row r has r + 1 blocks (capped at MAX_BLOCKS)."""
    tokens = [base + 10 * r for r in range(rows)]
    tables = [[base + r + b for b in range(min(r + 1, MAX_BLOCKS))] for r in range(rows)]
    return tokens, [t + 1 for t in tokens], [t + 2 for t in tokens], tables, [t + 3 for t in tokens]


def assert_padding(inputs: DecodeInputs, live: int):
    assert inputs.token_ids[live:].tolist() == [0] * (len(inputs.token_ids) - live)
    assert inputs.positions[live:].eq(0).all()
    assert inputs.slot_mapping[live:].eq(SCRATCH).all()
    assert inputs.context_lens[live:].eq(0).all()
    assert inputs.block_tables[live:].eq(0).all()


def test_rows_run_at_the_smallest_ladder_size_that_holds_them(graphs, forward):
    graphs.run(*batch(3))
    assert len(forward.calls[-1].token_ids) == 4
    graphs.run(*batch(1))
    assert len(forward.calls[-1].token_ids) == 1
    graphs.run(*batch(5))
    assert len(forward.calls[-1].token_ids) == 8


def test_padding_rows_attend_to_nothing_and_write_to_the_scratch_slot(graphs, forward):
    graphs.run(*batch(3))
    assert_padding(forward.calls[-1], live=3)


def test_live_rows_logits_are_returned_for_the_live_rows_only(graphs):
    tokens, positions, slots, tables, lens = batch(3)
    logits = graphs.run(tokens, positions, slots, tables, lens)
    assert logits.shape == (3, VOCAB)
    assert logits[:, 0].tolist() == tokens
    assert logits[:, 1].tolist() == positions
    assert logits[:, 2].tolist() == slots
    assert logits[:, 3].tolist() == lens
    assert logits[:, 4].tolist() == [sum(t) for t in tables]


def test_a_smaller_batch_after_a_bigger_one_sees_no_stale_rows_or_blocks(graphs, forward):
    graphs.run(*batch(8, base=500))
    tokens, positions, slots, _, lens = batch(3)
    logits = graphs.run(tokens, positions, slots, [[7], [8], [9]], lens)   # narrower tables than before
    seen = forward.calls[-1]
    assert_padding(seen, live=3)
    assert seen.block_tables[:3].tolist() == [[7, 0, 0, 0], [8, 0, 0, 0], [9, 0, 0, 0]]
    assert logits[:, 0].tolist() == tokens


def test_numpy_and_tensor_inputs_fill_the_same_buffers(graphs, forward):
    tokens, positions, slots, _, lens = batch(3)
    tables = np.array([[1, 2, 0], [3, 4, 5], [6, 0, 0]], dtype=np.int32)
    graphs.run(np.array(tokens), np.array(positions), np.array(slots), tables, np.array(lens))
    from_numpy = forward.calls[-1]
    graphs.run(*batch(8, base=500))
    graphs.run(torch.tensor(tokens), torch.tensor(positions), torch.tensor(slots), torch.from_numpy(tables),
               torch.tensor(lens, dtype=torch.int32))
    from_tensors = forward.calls[-1]
    for field in ("token_ids", "positions", "slot_mapping", "block_tables", "context_lens"):
        assert torch.equal(getattr(from_numpy, field), getattr(from_tensors, field)), field
    assert_padding(from_tensors, live=3)


def test_capture_on_the_cpu_captures_nothing_and_run_still_works(graphs, forward):
    graphs.capture()
    assert forward.calls == []
    assert graphs.run(*batch(2)).shape == (2, VOCAB)


def test_batches_too_wide_or_too_long_do_not_fit(graphs):
    assert graphs.fits(8, MAX_BLOCKS)
    assert not graphs.fits(9, 1)
    assert not graphs.fits(1, MAX_BLOCKS + 1)
    assert not graphs.fits(0, 1)
    with pytest.raises(ValueError):
        graphs.run(*batch(9))
    with pytest.raises(ValueError):
        graphs.run([1], [0], [0], [[1] * (MAX_BLOCKS + 1)], [1])


def test_inputs_of_different_row_counts_are_rejected(graphs):
    tokens, positions, slots, tables, lens = batch(3)
    with pytest.raises(ValueError):
        graphs.run(tokens, positions[:2], slots, tables, lens)


def test_a_forward_returning_the_wrong_shape_is_rejected():
    graphs = DecodeGraphs(lambda inputs: torch.zeros(len(inputs.token_ids), VOCAB + 1), batch_sizes=[2],
                          max_blocks_per_seq=1, vocab_size=VOCAB, scratch_slot=0, device=torch.device("cpu"))
    with pytest.raises(ValueError):
        graphs.run([1], [0], [0], [[1]], [1])


def test_the_ladder_is_dense_for_small_batches_and_ends_at_the_maximum():
    assert batch_ladder(256)[:9] == [1, 2, 4, 8, 16, 24, 32, 48, 64]
    assert batch_ladder(256)[-1] == 256
    assert batch_ladder(100)[-3:] == [80, 96, 100]
    assert batch_ladder(5) == [1, 2, 4, 5]
    assert batch_ladder(1) == [1]
    assert batch_ladder(512)[-2:] == [480, 512]
    with pytest.raises(ValueError):
        batch_ladder(0)


class FakeCuda:
    """Stands in for torch.cuda's graph API so the capture path's order of events is checked on the CPU."""

    def __init__(self):
        self.log: list = []
        fake = self

        class Graph:
            def replay(self):
                fake.log.append(("replay", self.size))
                self.output[:self.size].copy_(self.forward(self.inputs))

        class Stream:
            def wait_stream(self, other):
                fake.log.append("wait")

        class Event:
            def record(self, stream=None):
                fake.log.append("record")

            def synchronize(self):
                fake.log.append("sync")

        @contextlib.contextmanager
        def graph(cuda_graph, pool=None, capture_error_mode="global"):
            fake.log.append(("capture", pool, capture_error_mode))
            yield

        self.Graph, self.Event = Graph, Event
        self.patches = {"graph_pool_handle": lambda: "pool", "current_stream": lambda device=None: Stream(),
                        "Stream": lambda device=None: Stream(), "stream": lambda s: contextlib.nullcontext(),
                        "CUDAGraph": Graph, "graph": graph, "synchronize": lambda device=None: None}


def test_capture_on_cuda_warms_up_then_captures_largest_first_into_one_pool(monkeypatch, forward):
    cuda = FakeCuda()
    graphs = DecodeGraphs(forward, batch_sizes=[1, 2, 4], max_blocks_per_seq=MAX_BLOCKS, vocab_size=VOCAB,
                          scratch_slot=SCRATCH, device=torch.device("cpu"))
    graphs._cuda, graphs._copied = True, cuda.Event()   # the CPU buffers stand in for device ones
    for name, value in cuda.patches.items():
        monkeypatch.setattr(torch.cuda, name, value)
    graphs.capture()
    assert [len(call.token_ids) for call in forward.calls] == [4, 4, 4, 2, 2, 2, 1, 1, 1]   # 2 warm-ups + capture
    assert [entry for entry in cuda.log if entry != "wait"] == [("capture", "pool", "thread_local")] * 3
    for size, graph in graphs._graphs.items():
        graph.size, graph.forward, graph.inputs, graph.output = size, forward, graphs._views[size], graphs._output
    cuda.log.clear()
    logits = graphs.run(*batch(3))
    assert cuda.log == ["sync", "record", ("replay", 4)]   # host mirror free, copies queued, size-4 graph replayed
    assert logits[:, 0].tolist() == batch(3)[0]
    assert_padding(forward.calls[-1], live=3)
