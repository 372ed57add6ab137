"""Decode steps replayed from CUDA graphs, one graph per batch size on a ladder.

A decode step launches hundreds of small kernels; at small batch their launch time exceeds their run time,
so each ladder size is captured once and a step replays the graph of the smallest size that holds its rows
(as vLLM and nano-vllm's `ModelRunner.capture_cudagraph` do). All graphs read one set of static
`DecodeInputs` buffers sized for the largest batch; a step writes its live rows there and pads the rest as
rows that attend to nothing and write their K/V to the pool's scratch slot. Graphs are captured largest
first into one shared memory pool, so the smaller graphs reuse the largest one's scratch memory; each graph
copies its logits into the first rows of one output buffer, valid until the next replay.

On the CPU nothing is captured: `run` calls the forward eagerly on the same padded buffers, so the padding
and copying are exercised on every machine.
"""
from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence

import numpy as np
import torch

from inferd.engine.torch.inputs import DecodeInputs

_WARMUP_RUNS = 2   # before each capture: compiles Triton kernels and sets up cuBLAS outside the graph


def batch_ladder(max_batch_size: int) -> list[int]:
    """Batch sizes to capture: 1 2 4, then every 8 to 32, every 16 to 256, every 32 beyond (vLLM's spacing:
    dense where padding a small batch would double its work, sparse where a padded row costs a few percent),
    ending at max_batch_size."""
    if max_batch_size < 1:
        raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
    ladder = [1, 2, 4, *range(8, 33, 8), *range(48, 257, 16), *range(288, max_batch_size, 32)]
    return sorted({size for size in ladder if size < max_batch_size} | {max_batch_size})


class DecodeGraphs:
    """Replays a decode forward for any batch of up to max(batch_sizes) rows and max_blocks_per_seq blocks."""

    def __init__(self, forward: Callable[[DecodeInputs], torch.Tensor], *, batch_sizes: Sequence[int],
                 max_blocks_per_seq: int, vocab_size: int, scratch_slot: int, device: torch.device):
        if not batch_sizes or min(batch_sizes) < 1:
            raise ValueError(f"batch_sizes must be positive and not empty, got {list(batch_sizes)}")
        if max_blocks_per_seq < 1 or vocab_size < 1 or scratch_slot < 0:
            raise ValueError(f"bad shape: max_blocks_per_seq {max_blocks_per_seq}, vocab_size {vocab_size}, "
                             f"scratch_slot {scratch_slot}")
        self.batch_sizes = sorted(set(batch_sizes))
        self.max_blocks_per_seq = max_blocks_per_seq
        self.vocab_size = vocab_size
        self.scratch_slot = scratch_slot
        self.device = torch.device(device)
        self._forward = forward
        self._cuda = self.device.type == "cuda"
        largest = self.batch_sizes[-1]
        self._static = _padding_inputs(largest, max_blocks_per_seq, scratch_slot, self.device, pinned=False)
        # Host rows are assembled in a (pinned, on CUDA) mirror and sent in one copy per field.
        self._host = _padding_inputs(largest, max_blocks_per_seq, scratch_slot, torch.device("cpu"),
                                     pinned=self._cuda)
        # Block tables travel as the step's [rows, width] only, packed: a full [size, max_blocks] table is
        # megabytes at long contexts (8192 columns at 128K tokens) to clear and copy every step.
        self._host_tables = torch.zeros(largest * max_blocks_per_seq, dtype=torch.int32, pin_memory=self._cuda)
        self._device_tables = torch.zeros(largest * max_blocks_per_seq, dtype=torch.int32, device=self.device)
        self._table_columns = 0      # the widest table written since the static one was all zeros
        self._views = {size: _rows(self._static, size) for size in self.batch_sizes}
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        # One logits buffer every size writes its rows of (inside its graph): a buffer per size would hold
        # sum(ladder) x vocab floats (2.6 GB at a 512 ladder and Llama 3's vocabulary) out of the KV pool.
        self._output: torch.Tensor | None = None
        self._copied = torch.cuda.Event() if self._cuda else None

    def fits(self, num_seqs: int, max_blocks: int) -> bool:
        return 1 <= num_seqs <= self.batch_sizes[-1] and 0 <= max_blocks <= self.max_blocks_per_seq

    @torch.no_grad()
    def capture(self) -> None:
        """Capture one graph per ladder size, largest first, into one memory pool. Nothing on the CPU."""
        if not self._cuda or self._graphs:
            return
        pool = torch.cuda.graph_pool_handle()
        current = torch.cuda.current_stream(self.device)
        self._output = torch.empty((self.batch_sizes[-1], self.vocab_size), dtype=torch.float32, device=self.device)
        for size in reversed(self.batch_sizes):
            inputs = self._views[size]
            # Warm-up on a side stream, as torch.cuda.graph's documentation requires before a capture.
            side = torch.cuda.Stream(self.device)
            side.wait_stream(current)
            with torch.cuda.stream(side):
                for _ in range(_WARMUP_RUNS):
                    self._checked(self._forward(inputs), size)
            current.wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            # thread_local: another engine's thread allocating meanwhile (a reload) does not void the capture
            with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
                self._output[:size].copy_(self._checked(self._forward(inputs), size))
            self._graphs[size] = graph
        torch.cuda.synchronize(self.device)

    @torch.no_grad()
    def run(self, token_ids, positions, slot_mapping, block_tables, context_lens) -> torch.Tensor:
        """Logits [rows, vocab] of the live rows: a view of the static output, valid until the next run."""
        rows = len(token_ids)
        if {len(positions), len(slot_mapping), len(block_tables), len(context_lens)} != {rows}:
            raise ValueError("token_ids, positions, slot_mapping, block_tables and context_lens differ in rows")
        width = _table_width(block_tables)
        if not self.fits(rows, width):
            raise ValueError(f"{rows} rows of up to {width} blocks exceed the captured "
                             f"{self.batch_sizes[-1]} rows of {self.max_blocks_per_seq} blocks")
        size = self.batch_sizes[bisect.bisect_left(self.batch_sizes, rows)]
        if isinstance(token_ids, torch.Tensor) and token_ids.device == self.device:
            self._fill_on_device(rows, size, token_ids, positions, slot_mapping, block_tables, context_lens)
        else:
            self._fill_from_host(rows, size, token_ids, positions, slot_mapping, block_tables, context_lens)
        if not self._cuda:
            return self._checked(self._forward(self._views[size]), size)[:rows]
        if size not in self._graphs:
            raise RuntimeError("DecodeGraphs.run on CUDA needs capture() first")
        self._graphs[size].replay()
        return self._output[:rows]

    def _fill_from_host(self, rows, size, token_ids, positions, slot_mapping, block_tables, context_lens):
        if self._copied is not None:
            self._copied.synchronize()   # the previous step's copy out of the host mirror has finished
        host = self._host
        _write_column(host.token_ids, rows, size, token_ids, 0)
        _write_column(host.positions, rows, size, positions, 0)
        _write_column(host.slot_mapping, rows, size, slot_mapping, self.scratch_slot)
        _write_column(host.context_lens, rows, size, context_lens, 0)
        for name in ("token_ids", "positions", "slot_mapping", "context_lens"):
            getattr(self._static, name)[:size].copy_(getattr(host, name)[:size], non_blocking=self._cuda)
        width = _table_width(block_tables)
        packed = self._host_tables[:rows * width]
        _write_tables(packed.numpy().reshape(rows, width), rows, rows, block_tables)
        staged = self._device_tables[:rows * width]
        staged.copy_(packed, non_blocking=self._cuda)
        self._place_tables(rows, size, width, staged.view(rows, width))
        if self._copied is not None:
            self._copied.record(torch.cuda.current_stream(self.device))

    def _fill_on_device(self, rows, size, token_ids, positions, slot_mapping, block_tables, context_lens):
        static = self._static
        for target, source, pad in ((static.token_ids, token_ids, 0), (static.positions, positions, 0),
                                    (static.slot_mapping, slot_mapping, self.scratch_slot),
                                    (static.context_lens, context_lens, 0)):
            target[:rows].copy_(source)
            target[rows:size].fill_(pad)
        self._place_tables(rows, size, block_tables.shape[1], block_tables)

    def _place_tables(self, rows: int, size: int, width: int, tables: torch.Tensor) -> None:
        """Live rows' tables into the static one, everything else of the first `size` rows zero (no stale
        blocks from an earlier batch), clearing only columns some step has written."""
        static = self._static.block_tables
        static[:rows, :width].copy_(tables)
        dirty = max(self._table_columns, width)
        static[:rows, width:dirty].zero_()
        static[rows:size, :dirty].zero_()
        self._table_columns = dirty

    def _checked(self, logits: torch.Tensor, size: int) -> torch.Tensor:
        if tuple(logits.shape) != (size, self.vocab_size) or logits.dtype != torch.float32:
            raise ValueError(f"decode forward returned {tuple(logits.shape)} {logits.dtype}, "
                             f"want ({size}, {self.vocab_size}) float32")
        return logits


def _padding_inputs(rows: int, max_blocks: int, scratch_slot: int, device: torch.device,
                    pinned: bool) -> DecodeInputs:
    """Buffers holding only padding rows: token 0 at position 0, K/V to the scratch slot, no context."""
    def zeros(*shape, dtype):
        return torch.zeros(shape, dtype=dtype, device=device, pin_memory=pinned)
    slots = zeros(rows, dtype=torch.int64)
    slots.fill_(scratch_slot)
    return DecodeInputs(token_ids=zeros(rows, dtype=torch.int64), positions=zeros(rows, dtype=torch.int64),
                        slot_mapping=slots, block_tables=zeros(rows, max_blocks, dtype=torch.int32),
                        context_lens=zeros(rows, dtype=torch.int32))


def _rows(inputs: DecodeInputs, size: int) -> DecodeInputs:
    return DecodeInputs(token_ids=inputs.token_ids[:size], positions=inputs.positions[:size],
                        slot_mapping=inputs.slot_mapping[:size], block_tables=inputs.block_tables[:size],
                        context_lens=inputs.context_lens[:size])


def _table_width(block_tables) -> int:
    if isinstance(block_tables, (np.ndarray, torch.Tensor)):
        return int(block_tables.shape[1]) if block_tables.ndim == 2 else -1
    return max((len(row) for row in block_tables), default=0)


def _write_column(host: torch.Tensor, rows: int, size: int, values, pad: int) -> None:
    column = host.numpy()
    column[:rows] = values.numpy() if isinstance(values, torch.Tensor) else values
    column[rows:size] = pad


def _write_tables(host: np.ndarray, rows: int, size: int, block_tables) -> None:
    """Each live row's blocks then zeros; rows up to `size` past the live ones all zeros."""
    host[:size] = 0
    if isinstance(block_tables, torch.Tensor):
        block_tables = block_tables.numpy()
    if isinstance(block_tables, np.ndarray):
        host[:rows, : block_tables.shape[1]] = block_tables
        return
    for row, blocks in enumerate(block_tables):   # ragged lists: one row at a time
        host[row, : len(blocks)] = blocks
